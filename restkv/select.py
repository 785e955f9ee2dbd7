"""Turning scores into kept positions: the budget, GQA reduction, top-k with the window kept.

How the budget varies by layer is `restkv.stages.schedule`; how a layer's budget is shared by its heads,
`restkv.stages.allocation`.
"""

from __future__ import annotations

import torch

from restkv.budget import Budget as Budget  # re-exported: restkv.select.Budget is the historical home
from restkv.choices import GQA_MODES as GQA_MODES


def reduce_groups(scores: torch.Tensor, num_kv_heads: int, mode: str) -> torch.Tensor:
    """Reduce per-query-head scores ``[b, h, P]`` to one row per selection head.

    ``mean``/``max`` give ``[b, h_kv, P]`` (one selection per key/value head, so the cache
    really shrinks); ``expand`` keeps ``[b, h, P]`` (the reference code's per-query-head
    selection over repeated keys/values).
    """
    if mode == "expand":
        return scores
    b, h, past = scores.shape
    grouped = scores.view(b, num_kv_heads, h // num_kv_heads, past)
    if mode == "mean":
        return grouped.mean(dim=2)
    if mode == "max":
        return grouped.amax(dim=2)
    raise ValueError(f"unknown gqa mode {mode!r}; allowed: {', '.join(GQA_MODES)}")


def leading(scores: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """True where a position is among the first ``counts[..., h]`` of its row by descending ``scores`` ``[..., P]``."""
    order = scores.argsort(dim=-1, descending=True)
    positions = torch.arange(scores.shape[-1], device=scores.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, positions)
    return rank < counts.unsqueeze(-1)


def keep_indices(scores: torch.Tensor, keep: int, window: int) -> torch.Tensor:
    """Positions kept per head, ascending: the ``keep - window`` best past tokens plus the window.

    ``scores`` is ``[b, heads, P]`` over the past tokens (the window follows them); the result is
    int64 ``[b, heads, keep]``.
    """
    b, heads, past = scores.shape
    n_past = keep - window
    if not 0 <= n_past <= past:
        raise ValueError(f"cannot keep {n_past} past tokens out of {past}")
    best = scores.topk(n_past, dim=-1).indices.sort(dim=-1).values
    recent = torch.arange(past, past + window, device=scores.device).expand(b, heads, window)
    return torch.cat([best, recent], dim=-1)


def keep_in_score_order(scores: torch.Tensor, keep: int, window: int) -> torch.Tensor:
    """Like `keep_indices`, but the ``keep - window`` past tokens in descending score order (top-k's), then the
    window: the order in which R-KV's authors leave their cache, which their next cut reads as neighbourhood and
    recency."""
    b, heads, past = scores.shape
    n_past = keep - window
    if not 0 <= n_past <= past:
        raise ValueError(f"cannot keep {n_past} past tokens out of {past}")
    best = scores.topk(n_past, dim=-1).indices
    recent = torch.arange(past, past + window, device=scores.device).expand(b, heads, window)
    return torch.cat([best, recent], dim=-1)


def gather_positions(states: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Select ``indices`` ``[b, heads, n]`` along the sequence axis of ``[b, heads', L, d]``.

    When ``heads`` is a multiple of ``heads'`` (``gqa='expand'``) the states are repeated first.
    """
    heads = indices.shape[1]
    if states.shape[1] != heads:
        states = states.repeat_interleave(heads // states.shape[1], dim=1)
    return states.gather(2, indices.unsqueeze(-1).expand(-1, -1, -1, states.shape[-1]))
