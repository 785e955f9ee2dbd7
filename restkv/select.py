"""Turning scores into kept positions: the budget, GQA reduction, top-k with the window kept.

How the budget varies by layer is `restkv.schedule`; how a layer's budget is shared by its heads, `restkv.allocation`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GQA_MODES = ("mean", "max", "expand")


@dataclass(frozen=True)
class Budget:
    """How many tokens each layer keeps, window included (the paper's "KV size").

    An ``int`` is a token count; a ``float`` in ``(0, 1)`` is the fraction of the prompt kept
    (``0.25`` keeps a quarter of the prompt's tokens in every layer, rounded to the nearest
    integer as the reference code does).
    """

    value: int | float

    def __post_init__(self) -> None:
        value = self.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"budget must be an int (tokens) or a float in (0, 1) (fraction kept); got {value!r}")
        if isinstance(value, float) and value == 1.0:
            raise ValueError(
                "budget=1.0 is ambiguous: a float budget is the fraction of each prompt kept, in (0, 1), and an "
                "integer a token count; to keep whole prompts use policy=full, for one token per layer budget=1"
            )
        if isinstance(value, float) and value.is_integer() and value > 1:
            object.__setattr__(self, "value", int(value))
        elif isinstance(value, float) and not (0 < value < 1):
            raise ValueError(
                f"budget {value!r} is not allowed: a float budget is the fraction of the prompt kept and must "
                "lie in (0, 1); use an int for a token count"
            )
        if isinstance(self.value, int) and self.value < 1:
            raise ValueError(f"budget {value!r} is not allowed: a token budget must be >= 1")

    @property
    def is_ratio(self) -> bool:
        return isinstance(self.value, float)

    def tokens(self, prompt_length: int) -> int:
        """Tokens kept per layer for a prompt of ``prompt_length`` tokens."""
        if self.is_ratio:
            return max(1, round(self.value * prompt_length))
        return int(self.value)

    def __str__(self) -> str:
        return f"{self.value:g}" if self.is_ratio else str(self.value)


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


def gather_positions(states: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Select ``indices`` ``[b, heads, n]`` along the sequence axis of ``[b, heads', L, d]``.

    When ``heads`` is a multiple of ``heads'`` (``gqa='expand'``) the states are repeated first.
    """
    heads = indices.shape[1]
    if states.shape[1] != heads:
        states = states.repeat_interleave(heads // states.shape[1], dim=1)
    return states.gather(2, indices.unsqueeze(-1).expand(-1, -1, -1, states.shape[-1]))
