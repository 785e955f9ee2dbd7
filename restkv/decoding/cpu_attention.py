"""Attention of one new token over the cache, for CPUs: two GEMMs per key/value head.

PyTorch's CPU ``scaled_dot_product_attention`` reads a long cache at a fraction of the memory
bandwidth when decoding (one query per head), so the decode step's cost is set by the kernel
rather than by the bytes it must read. Here the group of query heads sharing a key/value head
is one small matrix multiplied against the keys and then the values, which streams each cached
key and value once. The result is the same attention (the eviction integration uses it for
decode steps on CPU; GPUs keep their own kernels).
"""

from __future__ import annotations

import torch
from torch import nn


def decode_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """``query`` ``[b, h, 1, d]`` over ``key``/``value`` ``[b, h_kv, L, d]``; returns ``[b, 1, h, d]``.

    ``attention_mask`` may be None, boolean (True = attend) or additive, shaped ``[b, 1, 1, L]``
    (or with a longer last axis, as transformers builds it for a preallocated cache).
    """
    b, heads, _, d = query.shape
    num_kv, length = key.shape[1], key.shape[2]
    scaling = d**-0.5 if scaling is None else scaling
    q = query.reshape(b, num_kv, heads // num_kv, d) * scaling
    scores = (q @ key.transpose(-1, -2)).float()  # [b, kv, g, L]
    if attention_mask is not None:
        mask = attention_mask[:, :, -1:, :length]  # [b, 1, 1, L]; boolean: True attends
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    probs = scores.softmax(dim=-1).to(value.dtype)
    out = probs @ value  # [b, kv, g, d]
    return out.reshape(b, 1, heads, d), None


def can_use_decode_attention(module: nn.Module, query: torch.Tensor, kwargs: dict) -> bool:
    """Decode steps on CPU without dropout, soft-capping or attention sinks."""
    return (
        query.shape[2] == 1
        and query.device.type == "cpu"
        and not module.training
        and kwargs.get("softcap") is None
        and kwargs.get("s_aux") is None
        and not kwargs.get("dropout")
    )
