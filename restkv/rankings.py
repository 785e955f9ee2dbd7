"""One ranking of every layer's tokens: how many each (layer, head) keeps when the layers share one budget.

``global`` keeps every layer's window and ranks past tokens only (`global_capacities`); Layer-DefensiveKV's
authors rank each layer's window too, at the layer's top score, so a layer can lose it
(`window_ranked_selection`); their fractional budgets are counted per layer (`shared_past_tokens`).
"""

from __future__ import annotations

import torch

from restkv.head_selection import HeadSelection


def kept_share(fraction: float) -> float:
    """The kept share ``fraction`` as DefensiveKV's authors' code holds it, ``1 - compression_ratio`` with
    ``compression_ratio = 1 - fraction``: the same float in most cases, one ulp apart in some (``0.2`` is
    ``0.19999999999999996`` there), which moves ``int(L * f * heads)`` by a token for about one length in five."""
    return 1 - (1 - fraction)


def shared_tokens(length: int, fraction: float, heads: int, layers: int = 1) -> int:
    """Tokens ``heads`` selection heads (of ``layers`` layers) share under a fraction ``fraction`` of a
    ``length``-token prompt, windows included, counted as DefensiveKV's authors count it:
    ``int(length * (1 - r) * heads * layers)`` (their float products, in their order)."""
    return int(length * kept_share(fraction) * heads * layers)


def shared_past_tokens(length: int, fraction: float, heads: int, window: int, layers: int = 1) -> int:
    """`shared_tokens` less every head's window: the past tokens the heads share."""
    return max(shared_tokens(length, fraction, heads, layers) - heads * layers * window, 0)


def window_ranked_selection(scores: list[torch.Tensor], window: int, total: int) -> list[HeadSelection]:
    """Layer-DefensiveKV's authors' selection over layers whose scores ``[heads, P]`` cover their past tokens.

    Each layer's window is ranked at that layer's top score; one top-k of ``total`` over every layer's
    ``heads x L`` positions, window included, gives each layer its count; then each layer keeps its own top-k of
    that count over its ``heads x L`` positions. A layer may lose some of its window, or keep nothing.
    """
    if any(layer.shape != scores[0].shape for layer in scores):
        raise NotImplementedError("allocation='global_window' needs every layer's scores of one shape")
    padded = [torch.cat([layer, layer.max().expand(layer.shape[0], window)], dim=-1) for layer in scores]
    flat = torch.stack([layer.reshape(-1) for layer in padded])
    per_layer = flat.shape[1]
    total = min(total, flat.numel())
    counts = torch.bincount(flat.reshape(-1).topk(total).indices // per_layer, minlength=flat.shape[0])
    selections = []
    for layer, count in zip(padded, counts.tolist(), strict=True):
        heads, length = layer.shape
        chosen = layer.reshape(-1).topk(count).indices
        kept = [chosen[chosen // length == head] % length for head in range(heads)]
        selections.append(HeadSelection.from_heads([positions.sort().values for positions in kept]))
    return selections


def global_capacities(scores: list[torch.Tensor], bases: list[int]) -> list[torch.Tensor]:
    """Past tokens each (layer, head) keeps when one top-k ranks every layer's ``[heads, P]`` scores together.

    The layers share ``sum(heads x bases[layer])`` tokens; a layer's count per head is how many of its scores are
    among the winners (a head may get none, or all its past tokens).
    """
    flat = torch.cat([layer.reshape(-1).float() for layer in scores])
    total = sum(layer.shape[0] * base for layer, base in zip(scores, bases, strict=True))
    owner = torch.cat([torch.arange(layer.numel(), device=flat.device) // layer.shape[1] for layer in scores])
    starts = [0]
    for layer in scores:
        starts.append(starts[-1] + layer.numel())
    winners = torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device)
    winners[flat.topk(total).indices] = True
    return [
        torch.bincount(owner[start:end][winners[start:end]], minlength=layer.shape[0])
        for layer, start, end in zip(scores, starts[:-1], starts[1:], strict=True)
    ]
