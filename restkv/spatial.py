"""Spatial smoothing of scores along positions, the last scoring stage: pure tensor functions.

Scores are ``[b, h, P]`` (one row per query head over the past tokens); window attention is ``[b, h, w, L]``
(`restkv.scoring`). SnapKV pools with a fixed kernel; ReST-KV's adaptive smoothing sizes and shifts a per-head
kernel by how far the observation window's attention drifts between its two halves.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SPATIAL = ("none", "avgpool", "maxpool", "adaptive")


def avgpool(scores: torch.Tensor, kernel: int) -> torch.Tensor:
    """Centred moving average; the zero padding is counted, as in SnapKV."""
    return F.avg_pool1d(scores, kernel, stride=1, padding=kernel // 2, count_include_pad=True)


def maxpool(scores: torch.Tensor, kernel: int) -> torch.Tensor:
    """Centred moving maximum; padding never wins."""
    return F.max_pool1d(scores, kernel, stride=1, padding=kernel // 2)


def attention_drift(window_attn: torch.Tensor, k: int) -> torch.Tensor:
    """ReST-KV's signed drift ``[b, h]`` of where the window looks.

    Mean position of each query's ``k`` most attended keys (window keys included) over the
    first half of the window, minus the same over the second half. The reference code pairs
    the two halves rank by rank, but a mean of differences only depends on the two sets.
    With an odd window the middle row is left out so the halves have equal size.
    """
    half = window_attn.shape[-2] // 2
    k = min(k, window_attn.shape[-1])
    top = window_attn.topk(k, dim=-1, sorted=False).indices.double()  # [b, h, w, k]
    return top[..., :half, :].mean(dim=(-1, -2)) - top[..., half : 2 * half, :].mean(dim=(-1, -2))


def adaptive_kernel(drift: torch.Tensor, scale: float, min_kernel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head kernel size and shift from the drift, as in the reference code.

    kernel ``max(min_kernel, 2 * floor(|s| / scale) + 1)``; shift ``floor(s / scale)`` when
    ``s > 0`` else ``floor(s / scale) + 1``. (That formula gives shift 1 at exactly ``s == 0``;
    we keep it for parity.)
    """
    ratio = drift / scale
    kernel = (2 * torch.floor(ratio.abs()) + 1).clamp_min(min_kernel).long()
    shift = torch.where(drift > 0, torch.floor(ratio), torch.floor(ratio) + 1).long()
    return kernel, shift


def shifted_average(scores: torch.Tensor, kernel: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Moving average with a per-row odd ``kernel`` and ``shift``, edge values replicated.

    Row ``r`` is padded with ``kernel//2 - shift`` copies of its first value on the left and
    ``kernel//2 + shift`` of its last on the right, then averaged with stride 1. Computed from
    float64 prefix sums so every row is done at once, whatever its kernel.
    """
    n = scores.shape[-1]
    x = scores.double()
    prefix = F.pad(x.cumsum(-1), (1, 0))  # prefix[..., j] = sum of x[..., :j]
    pos = torch.arange(n, device=scores.device)
    lo = pos - (kernel // 2 - shift).unsqueeze(-1)  # first index of each window (may be < 0)
    hi = lo + kernel.unsqueeze(-1) - 1  # last index (may be >= n)
    inner = prefix.gather(-1, hi.clamp(0, n - 1) + 1) - prefix.gather(-1, lo.clamp(0, n - 1))
    left = (-lo).clamp_min(0) * x[..., :1]
    right = (hi - (n - 1)).clamp_min(0) * x[..., -1:]
    return ((inner + left + right) / kernel.unsqueeze(-1)).to(scores.dtype)


def adaptive_smooth(
    scores: torch.Tensor, window_attn: torch.Tensor, k: int, scale: float, min_kernel: int
) -> torch.Tensor:
    """ReST-KV's spatial smoothing: a per-head shifted average sized by the attention drift."""
    kernel, shift = adaptive_kernel(attention_drift(window_attn, k), scale, min_kernel)
    return shifted_average(scores, kernel, shift)
