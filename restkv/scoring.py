"""Scoring stages as pure tensor functions: no model objects, no transformers imports.

A scoring policy ranks every *past* token (all but the observation window) of one layer:

    window attention -> indicator -> temporal aggregation -> spatial smoothing (`restkv.spatial`)

Shapes used throughout (``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``w`` window,
``L`` sequence, ``P = L - w`` past tokens, ``d`` head dim):

- queries ``[b, h, w, d]`` (the window's queries, position-encoded as the model used them)
- keys, values ``[b, h_kv, L, d]``
- window attention ``[b, h, w, L]`` (float32), scores ``[b, h, P]`` (float32)

Grouped-query attention is handled by viewing query heads as ``[h_kv, group]``: keys and
values are never repeated in memory.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from contextvars import ContextVar

import torch

from restkv.fastpath import CHECKS, far_apart
from restkv.worksizes import rows_at_once

SATURATION_EPS = 1e-6
"""``1 - a`` is floored at this value in the odds ratio ``a / (1 - a)`` (see `reconstruction_odds`)."""


def _group(x: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """View ``[b, h, ...]`` as ``[b, h_kv, group, ...]``."""
    b, h = x.shape[:2]
    if h % num_kv_heads:
        raise ValueError(f"query heads ({h}) must be a multiple of key/value heads ({num_kv_heads})")
    return x.view(b, num_kv_heads, h // num_kv_heads, *x.shape[2:])


def window_attention(
    queries: torch.Tensor, keys: torch.Tensor, scaling: float | None = None, softcap: float | None = None
) -> torch.Tensor:
    """Softmax attention of the window's queries over all keys, causal inside the window.

    Returns float32 ``[b, h, w, L]``; rows sum to one. The window's queries occupy the last
    ``w`` positions, so query ``i`` of the window sees keys ``0 .. L - w + i``. ``softcap``: the
    model's logit soft-capping (``tanh(x / c) * c`` after scaling, as Gemma 2 computes attention).
    """
    b, h, w, d = queries.shape
    num_kv, length = keys.shape[1], keys.shape[2]
    if w > length:
        raise ValueError(f"window ({w}) is longer than the sequence ({length})")
    scaling = d**-0.5 if scaling is None else scaling
    # [b, kv, g * w, d] @ [b, kv, d, L]: one GEMM per key/value head, keys never repeated
    q = (queries.float() * scaling).reshape(b, num_kv, (h // num_kv) * w, d)
    logits = (q @ keys.float().transpose(-1, -2)).view(b, h, w, length)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    future = torch.ones(w, w, dtype=torch.bool, device=queries.device).triu(1)
    logits[..., length - w :].masked_fill_(future, float("-inf"))
    return logits.softmax(dim=-1)


# --- temporal aggregation over the window's queries -------------------------------------------------

TEMPORAL = ("sum", "mean", "ema", "inv_ema", "last", "defensive")


def temporal_weights(kind: str, window: int, alpha: float, device: torch.device | None = None) -> torch.Tensor:
    """Weights ``[w]`` (oldest query first) whose dot product with the rows aggregates them.

    ``ema`` is the recursion ``m <- alpha * x_t + (1 - alpha) * m`` started at the first row,
    i.e. the newest query weighs ``alpha``; ``inv_ema`` runs it from the newest row backwards.
    """
    if kind == "sum":
        weights = torch.ones(window, dtype=torch.float64)
    elif kind == "mean":
        weights = torch.full((window,), 1.0 / window, dtype=torch.float64)
    elif kind in ("ema", "inv_ema"):
        age = torch.arange(window - 1, -1, -1, dtype=torch.float64)  # newest row has age 0
        weights = alpha * (1 - alpha) ** age
        weights[0] = (1 - alpha) ** (window - 1)
        if kind == "inv_ema":
            weights = weights.flip(0)
    elif kind == "last":
        weights = torch.zeros(window, dtype=torch.float64)
        weights[-1] = 1.0
    else:
        raise ValueError(f"unknown temporal aggregation {kind!r}; allowed: {', '.join(TEMPORAL)}")
    return weights.to(device=device, dtype=torch.float32)


def aggregate(rows: torch.Tensor, kind: str, alpha: float) -> torch.Tensor:
    """Aggregate ``[..., w, P]`` over the window axis into ``[..., P]``.

    ``defensive`` (DefensiveKV, Feng et al. 2026) is the worst case: the maximum over the window's
    queries, floored at its mean over the positions given (pass the past tokens only).
    """
    if kind == "sum":
        return rows.sum(dim=-2)
    if kind == "defensive":
        worst = rows.amax(dim=-2)
        return worst.clamp(min=worst.mean(dim=-1, keepdim=True))
    weights = temporal_weights(kind, rows.shape[-2], alpha, rows.device)
    return (weights @ rows).to(rows.dtype)  # a batched vector-matrix product over the window axis


# --- indicators ------------------------------------------------------------------------------------


def output_gram(o_proj_weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Per-head Gram matrices ``W_o^h^T W_o^h``: ``[h, d, d]`` float32.

    ``||W_o^h x||^2 = x^T G_h x``, so distances in the layer's output space cost a
    ``d x d`` product per token instead of a ``hidden``-sized projection.
    ``o_proj_weight`` is ``[hidden, h * d]`` as ``nn.Linear`` stores it.
    """
    hidden, width = o_proj_weight.shape
    if width % num_heads:
        raise ValueError(f"o_proj input width {width} is not a multiple of {num_heads} heads")
    per_head = o_proj_weight.float().view(hidden, num_heads, width // num_heads).transpose(0, 1)  # [h, hidden, d]
    return per_head.transpose(1, 2) @ per_head


def odds(attention: torch.Tensor) -> torch.Tensor:
    """``a / (1 - a)`` with ``1 - a`` floored at `SATURATION_EPS` so saturated weights stay finite."""
    return attention / (1 - attention).clamp_min(SATURATION_EPS)


SCORING_CHUNK = 512
"""Past tokens scored per step on a CPU (`restkv.worksizes.rows_at_once` sizes it on a GPU)."""
EXACT_BLOCK = 256
"""Cancelling distances recomputed per step on a CPU."""
CANCELLATION_GUARD = 1e-2
"""Squared distances below this fraction of ``vGv + oGo`` are recomputed from the difference."""


SCORING_PATHS = ("auto", "expanded", "direct")
"""How `reconstruction_after` computes its distances: ``expanded`` (a CPU's floor: one GEMM per key/value head,
exact recomputation where the expansion cancels), ``direct`` (a GPU's: no host read, bounded temporaries);
``auto``: ``direct`` on CUDA, ``expanded`` elsewhere."""
DIRECT_CHUNKS = 24
"""The direct path scores the past tokens in about this many chunks (at least `DIRECT_MIN_CHUNK` tokens each): its
temporaries stay near a twentieth of the window attention's bytes, for a fixed number of kernel launches."""
DIRECT_MIN_CHUNK = 1024
_PATH: ContextVar[str] = ContextVar("scoring_path", default="auto")


@contextlib.contextmanager
def scoring_path(path: str) -> Iterator[None]:
    """Compute ReST-KV's distances the ``path`` way inside the ``with`` block (tests run a GPU's path on a CPU)."""
    if path not in SCORING_PATHS:
        raise ValueError(f"scoring path {path!r} is not one of: {', '.join(SCORING_PATHS)}")
    token = _PATH.set(path)
    try:
        yield
    finally:
        _PATH.reset(token)


DIRECT_DEVICES = ("cuda",)
"""Device types where ``auto`` takes the direct path (CPU tests add ``cpu`` with a fake one)."""
DIRECT_CHECK_TOLERANCE = 1e-4
"""Largest difference between the direct and expanded scores, as a share of the largest score, that ``auto``'s
check accepts (`restkv.fastpath`): the two agree to float32 rounding."""


def pick_scoring_path(device: torch.device) -> str:
    """The path `reconstruction_after` takes on ``device`` (`SCORING_PATHS`)."""
    path = _PATH.get()
    return ("direct" if device.type in DIRECT_DEVICES else "expanded") if path == "auto" else path


def reconstruction_after(
    attention: torch.Tensor,
    values: torch.Tensor,
    gram: torch.Tensor | None,
    tau: float,
    chunk: int | None = None,
) -> torch.Tensor:
    """ReST-KV's output-change score from an aggregated attention row (``after`` order).

    ``attention`` ``[b, h, P]`` is the aggregated weight of each past token; the head output is
    rebuilt from past tokens only, ``o = sum_j a_j v_j``, and token ``j`` scores
    ``a_j / (1 - a_j) * ||W_o^h (o - v_j)||^tau``: the change of the head's projected output
    when ``j`` alone is removed and the softmax renormalises. ``gram=None`` drops ``W_o``.

    With ``W_o`` the squared distance is expanded as ``vGv - 2 v.(Go) + oGo``: one GEMM per
    key/value head against its group's stacked Gram matrices, the cost of a ``d x d``
    product per token and query head. Where the expansion would cancel (``v_j`` close to
    ``o``) the distance is recomputed from the difference.

    A token holding all the attention (``1 - a_j`` below `SATURATION_EPS`) has ``o == v_j`` up to
    rounding, so its distance is replaced by ``||W_o^h v_j||`` (the output it alone carries); it
    then ranks first instead of producing ``inf * 0 = NaN`` as the reference code does.

    Past tokens are processed ``chunk`` at a time: by default `SCORING_CHUNK` on a CPU and as
    many as fit a GPU's free memory (`restkv.worksizes`), so a GPU scores any prompt in one pass.
    On CUDA the distances are computed the `reconstruction_direct` way instead (`pick_scoring_path`); under the
    ``auto`` path its first scores of each shape are checked against this expansion's (`restkv.fastpath`), and a
    shape where they fail or disagree is scored by the expansion from then on.
    """
    if pick_scoring_path(values.device) != "direct":
        return reconstruction_expanded(attention, values, gram, tau, chunk)
    if _PATH.get() != "auto":  # asked for by name: its failures are the user's to see
        return reconstruction_direct(attention, values, gram, tau, chunk)
    key = (
        "scoring",
        str(values.device),
        values.dtype,
        tuple(attention.shape[:2]),
        tuple(values.shape[1::2]),
        gram is None,
        tau,
    )
    return CHECKS.run(
        key,
        ("scoring", "direct", "expanded"),
        lambda: reconstruction_direct(attention, values, gram, tau, chunk),
        lambda: reconstruction_expanded(attention, values, gram, tau, chunk),
        lambda a, b: far_apart(a, b, DIRECT_CHECK_TOLERANCE),
    )


def reconstruction_expanded(
    attention: torch.Tensor,
    values: torch.Tensor,
    gram: torch.Tensor | None,
    tau: float,
    chunk: int | None = None,
) -> torch.Tensor:
    """`reconstruction_after`'s expanded path (a CPU's): the distances from ``vGv - 2 v.(Go) + oGo``, recomputed
    from the difference where the expansion cancels."""
    b, h, past = attention.shape
    num_kv, d = values.shape[1], values.shape[-1]
    v = values[:, :, :past].float()  # [b, kv, P, d]
    a = _group(attention, num_kv)  # [b, kv, g, P]
    out = a @ v  # [b, kv, g, d]
    if chunk is None:  # per token: the [b, kv, g, d] temporaries of one chunk row, float32
        chunk = rows_at_once(past, 4 * b * h * d * 3, values.device, SCORING_CHUNK)
    if gram is None:
        squared, own = _plain_squared_distances(out, v, chunk)
    else:
        squared, own = _gram_squared_distances(out, v, gram.view(num_kv, -1, *gram.shape[-2:]), chunk)
    saturated = (1 - a) < SATURATION_EPS
    if bool(saturated.any()):
        squared = torch.where(saturated, own(), squared)
    distance = squared.clamp_min(0).sqrt().reshape(b, h, past)
    return odds(attention) * (distance if tau == 1 else distance.pow(tau))


def reconstruction_direct(
    attention: torch.Tensor,
    values: torch.Tensor,
    gram: torch.Tensor | None,
    tau: float,
    chunk: int | None = None,
) -> torch.Tensor:
    """The same score as `reconstruction_after`, its distances computed from the difference ``o - v_j`` itself.

    ``||W_o^h (o - v_j)||^2 = (o - v_j)^T G_h (o - v_j)``: one batched product per chunk of past tokens, the same
    arithmetic as the expansion's (a ``d x d`` product per token and query head) but with nothing to cancel, so no
    entry needs recomputing and the host never reads a device value (no ``.any()``, no ``nonzero``). A saturated
    token (``1 - a_j`` below `SATURATION_EPS`) can only be its head's most attended one, whose ``||W_o^h v_j||^2``
    is computed for every head up front. Values are converted to float32 a chunk at a time (never the whole
    cache), in about `DIRECT_CHUNKS` chunks. Scores agree with the expanded path's to float32 rounding.
    """
    b, h, past = attention.shape
    num_kv, d = values.shape[1], values.shape[-1]
    a = _group(attention, num_kv)  # [b, kv, g, P]
    chunk = chunk or max(DIRECT_MIN_CHUNK, -(-past // DIRECT_CHUNKS))
    grams = None if gram is None else gram.view(num_kv, h // num_kv, d, d)
    out = values.new_zeros((b, num_kv, h // num_kv, d), dtype=torch.float32)
    spans = [(start, min(start + chunk, past)) for start in range(0, past, chunk)]
    for start, end in spans:
        out += a[..., start:end] @ values[:, :, start:end].float()
    squared = torch.empty_like(a)
    for start, end in spans:
        diff = out.unsqueeze(-2) - values[:, :, None, start:end].float()  # [b, kv, g, c, d]
        projected = diff if grams is None else diff @ grams
        squared[..., start:end] = (projected * diff).sum(-1)
    top = a.argmax(dim=-1, keepdim=True)  # [b, kv, g, 1]: the only token that can hold all the attention
    v_top = values.float().gather(2, top.flatten(2, 3).unsqueeze(-1).expand(-1, -1, -1, d)).view(*top.shape[:3], d)
    own = (v_top if grams is None else (v_top.unsqueeze(-2) @ grams).squeeze(-2)) * v_top
    saturated = (1 - a) < SATURATION_EPS
    squared = torch.where(saturated, own.sum(-1, keepdim=True), squared)
    distance = squared.clamp_min(0).sqrt().reshape(b, h, past)
    return odds(attention) * (distance if tau == 1 else distance.pow(tau))


def _plain_squared_distances(out: torch.Tensor, v: torch.Tensor, chunk: int):
    """``||o_h - v_j||^2`` as ``[b, kv, g, P]``, plus a thunk giving ``||v_j||^2``."""
    squared = out.new_empty(*out.shape[:3], v.shape[2])
    for start in range(0, v.shape[2], chunk):
        block = v[:, :, None, start : start + chunk]  # [b, kv, 1, c, d]
        squared[..., start : start + chunk] = (out.unsqueeze(-2) - block).pow(2).sum(-1)
    return squared, lambda: v.pow(2).sum(-1).unsqueeze(2).expand_as(squared)


def _gram_squared_distances(out: torch.Tensor, v: torch.Tensor, gram: torch.Tensor, chunk: int):
    """``||W_o^h (o_h - v_j)||^2`` as ``[b, kv, g, P]``, plus a thunk giving ``||W_o^h v_j||^2``.

    ``gram`` is ``[kv, g, d, d]``; ``out`` ``[b, kv, g, d]``; ``v`` ``[b, kv, P, d]``.
    """
    b, num_kv, group, d = out.shape
    past = v.shape[2]
    out_g = (gram @ out.unsqueeze(-1)).squeeze(-1)  # G_h o_h: [b, kv, g, d]
    out_sq = (out_g * out).sum(-1)  # [b, kv, g]
    stacked = gram.transpose(1, 2).reshape(num_kv, d, group * d)  # [G_1 | ... | G_g] per kv head
    v_sq = v.new_empty(b, num_kv, past, group)
    cross = v.new_empty(b, num_kv, past, group)
    for start in range(0, past, chunk):
        block = v[:, :, start : start + chunk]  # [b, kv, c, d]
        projected = (block @ stacked).view(*block.shape[:3], group, d)
        v_sq[:, :, start : start + chunk] = (projected * block.unsqueeze(-2)).sum(-1)
        cross[:, :, start : start + chunk] = block @ out_g.transpose(-1, -2)
    squared = (v_sq - 2 * cross + out_sq.unsqueeze(2)).transpose(-1, -2)  # [b, kv, g, P]
    v_sq = v_sq.transpose(-1, -2)
    risky = squared < CANCELLATION_GUARD * (v_sq + out_sq.unsqueeze(-1))
    if bool(risky.any()):
        squared = squared.clone()
        squared[risky] = _exact_squared_distances(risky, out, v, gram)
    return squared, lambda: v_sq


def _exact_squared_distances(
    where: torch.Tensor, out: torch.Tensor, v: torch.Tensor, gram: torch.Tensor
) -> torch.Tensor:
    """``||W_o^h (o_h - v_j)||^2`` from the difference, for the entries selected by ``where``."""
    bi, ki, gi, pi = where.nonzero(as_tuple=True)
    d = out.shape[-1]
    block = rows_at_once(bi.shape[0], 4 * (d * d + 3 * d), out.device, EXACT_BLOCK)  # a gathered d x d Gram each
    result = out.new_empty(bi.shape[0])
    for start in range(0, bi.shape[0], block):
        s = slice(start, start + block)
        diff = out[bi[s], ki[s], gi[s]] - v[bi[s], ki[s], pi[s]]  # [n, d]
        result[s] = ((diff.unsqueeze(1) @ gram[ki[s], gi[s]]).squeeze(1) * diff).sum(-1)
    return result


def reconstruction_before(
    window_attn: torch.Tensor,
    values: torch.Tensor,
    gram: torch.Tensor | None,
    tau: float,
    normalize: bool,
) -> torch.Tensor:
    """Per-query output-change scores (``before`` order): ``[b, h, w, P]``, aggregated later.

    As in the reference code, each query's output ``o_t`` is taken over all keys (window
    included) while only past tokens are scored; ``normalize`` divides query ``t``'s scores by
    ``||W_o^h o_t||``. Distances use ``||x - y||^2 = xGx - 2 xGy + yGy`` in float64 so that no
    ``[w, P, d]`` tensor is built.
    """
    b, h, w, length = window_attn.shape
    num_kv, past = values.shape[1], length - w
    group = h // num_kv
    v = values.float()
    a = _group(window_attn, num_kv)  # [b, kv, g, w, L]
    out = torch.einsum("bkgwl,bkld->bkgwd", a, v).reshape(b, h, w, -1).double()  # [b, h, w, d]
    v_past = v[:, :, :past].double().repeat_interleave(group, dim=1)  # [b, h, P, d]
    g = torch.eye(v.shape[-1], dtype=torch.float64, device=v.device) if gram is None else gram.double()
    out_g = out @ g  # [b, h, w, d]
    out_sq = (out_g * out).sum(-1, keepdim=True)  # [b, h, w, 1]
    v_sq = ((v_past @ g) * v_past).sum(-1).unsqueeze(2)  # [b, h, 1, P]
    cross = out_g @ v_past.transpose(-1, -2)  # [b, h, w, P]
    distance = (out_sq - 2 * cross + v_sq).clamp_min(0).sqrt().float()
    scores = odds(window_attn[..., :past]) * distance.pow(tau)
    if normalize:
        scores = scores / out_sq.sqrt().float().clamp_min(torch.finfo(torch.float32).tiny)
    return scores


def value_norms(values: torch.Tensor, num_heads: int, past: int) -> torch.Tensor:
    """``||v_j||`` of past tokens for every query head: ``[b, h, P]``."""
    norms = values[:, :, :past].float().norm(dim=-1)
    return norms.repeat_interleave(num_heads // values.shape[1], dim=1)


def is_finite_positive(value: float) -> bool:
    """True for a real number > 0 (rejects NaN and inf)."""
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def key_norms(keys: torch.Tensor, heads: int) -> torch.Tensor:
    """L2 norm of every key ``[b, heads, L]`` (float32), key/value heads repeated to ``heads`` (KNorm, L2Norm)."""
    norms = keys.float().norm(dim=-1)
    return norms.repeat_interleave(heads // norms.shape[1], dim=1) if norms.shape[1] != heads else norms
