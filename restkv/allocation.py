"""How many past tokens each head of a layer keeps: the head-wise budget allocators (pure arithmetic).

Scores come in per selection head (``[heads, P]`` over a layer's past tokens, batch 1). A uniform
allocation gives every head the layer's budget; the two head-wise allocators share it unevenly:

- ``adakv`` (AdaKV, Feng et al. 2024): the layer's past budget ``heads x base`` goes to the heads
  whose scores rank highest when all heads' sorted scores are ranked together, after an optional
  per-head rescaling (``normalize``), with a guaranteed share ``floor`` of ``base`` per head.
- ``headkv`` (HeadKV, Fu et al. 2024): fixed per-(layer, head) budgets computed once from
  head-importance scores (a file in HeadKV's JSON format, ``{"<layer>-<head>": [scores...]}``).

Both follow the ReST-KV authors' ``AdaKVCluster`` and HeadKV budget code to the rounding (see
``../shared/golden/README.md``, "Head-wise"). What a head keeps (its top positions plus the
window) is a `HeadSelection`: the per-head positions flattened one head after another.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

ALLOCATIONS = ("uniform", "adakv", "headkv")


@dataclass(frozen=True)
class HeadSelection:
    """Kept positions when heads keep different numbers of tokens (batch 1).

    ``positions`` is int64 ``[sum(lengths)]``: head 0's kept positions ascending, then head 1's...;
    ``lengths`` is int64 ``[heads]`` (window included). The same layout as AdaKV's flattened cache.
    """

    positions: torch.Tensor
    lengths: torch.Tensor

    def __post_init__(self) -> None:
        if self.positions.dim() != 1 or self.lengths.dim() != 1:
            raise ValueError("HeadSelection holds flat positions [sum(lengths)] and lengths [heads]")
        if int(self.lengths.sum()) != self.positions.numel():
            raise ValueError(
                f"HeadSelection: lengths sum to {int(self.lengths.sum())} but {self.positions.numel()} positions given"
            )

    @property
    def heads(self) -> int:
        return self.lengths.numel()

    @property
    def total(self) -> int:
        """Tokens kept over all heads."""
        return self.positions.numel()

    def per_head(self) -> list[torch.Tensor]:
        """Each head's kept positions, ascending."""
        return list(self.positions.split(self.lengths.tolist()))

    @classmethod
    def from_heads(cls, heads: list[torch.Tensor]) -> HeadSelection:
        lengths = torch.tensor([h.numel() for h in heads], dtype=torch.long, device=heads[0].device)
        return cls(torch.cat(heads).long(), lengths)


def adakv_capacities(
    scores: torch.Tensor, base: int, floor: float, normalize: bool, ranked: torch.Tensor | None = None
) -> torch.Tensor:
    """Past tokens each head keeps under AdaKV: int64 ``[heads]`` for scores ``[heads, P]``.

    ``base`` is the uniform per-head past budget (``budget - window``); the heads share
    ``heads x base``. Each head's scores are sorted descending; with ``normalize`` they are scaled
    by the head's share of mass in its own top ``base``. The top ``heads x base`` of all sorted
    scores count per head (``count``), and a head keeps ``round(count * (1 - floor) + int(base *
    floor))`` (float32 arithmetic, half to even, as the reference computes it). ``ranked``: the
    scores already sorted descending per head, when the caller has them.
    """
    heads, past = scores.shape
    if not 0 <= base <= past:
        raise ValueError(f"AdaKV: a per-head budget of {base} past tokens does not fit {past} past tokens")
    ranked = scores.sort(dim=-1, descending=True).values if ranked is None else ranked
    if normalize:
        ranked = ranked * (ranked[:, :base].sum(dim=-1, keepdim=True) / ranked.sum(dim=-1, keepdim=True))
    winners = ranked.reshape(-1).topk(heads * base).indices // past
    counts = torch.bincount(winners, minlength=heads)
    capacity = torch.round(counts * (1 - floor) + int(base * floor)).long()
    return capacity.clamp(max=past)


def headkv_capacities(importance: torch.Tensor, budget: int, beta: float) -> torch.Tensor:
    """HeadKV's past-token budget per (layer, head): int64 ``[layers, heads]``.

    ``importance`` ``[layers, heads]`` is each head's mean score from the head file. Each head's
    share of the total importance splits a pool of ``(budget // beta) x layers x heads`` tokens, on
    top of ``budget - budget // beta`` for every head: ``round(share * pool + min)``.
    """
    layers, heads = importance.shape
    total = float(importance.sum())
    if not math.isfinite(total) or total <= 0:
        raise ValueError(f"head-importance scores must be finite and sum to a positive number; they sum to {total}")
    share = importance.double() / total
    pool = (budget // beta) * layers * heads
    minimum = budget - budget // beta
    return torch.round(share * pool + minimum).long()


def top_positions(
    scores: torch.Tensor, capacities: torch.Tensor, window: int, order: torch.Tensor | None = None
) -> HeadSelection:
    """Head ``h`` keeps its ``capacities[h]`` best past positions plus the window, ascending.

    ``scores`` ``[heads, P]`` cover the past tokens; the window is positions ``P .. P + window - 1``.
    ``order``: the positions by descending score per head, when the caller has them.
    """
    heads, past = scores.shape
    order = scores.sort(dim=-1, descending=True).indices if order is None else order
    recent = torch.arange(past, past + window, device=scores.device)
    kept = [torch.cat([order[h, : int(capacities[h])].sort().values, recent]) for h in range(heads)]
    return HeadSelection.from_heads(kept)


def reduce_importance(importance: torch.Tensor, num_kv_heads: int, mode: str) -> torch.Tensor:
    """Head importance ``[layers, h]`` of query heads reduced to key/value heads (``gqa`` mean/max)."""
    if mode == "expand":
        return importance
    layers, heads = importance.shape
    grouped = importance.view(layers, num_kv_heads, heads // num_kv_heads)
    return grouped.mean(dim=-1) if mode == "mean" else grouped.amax(dim=-1)


def load_head_scores(path: str | Path, num_layers: int, num_heads: int) -> torch.Tensor:
    """Each (layer, query head)'s mean score ``[layers, heads]`` from a HeadKV head file.

    The file maps ``"<layer>-<head>"`` to a list of scores (one per probe). Raises naming the file
    and what is wrong when it is missing, malformed, or not shaped like the model.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"head-importance file {str(path)!r} not found; make one for your model with "
            "scripts/compute_head_scores.py (the micro model's: models/micro-llama/head_scores.json)"
        )
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"head-importance file {path} is not valid JSON: {error}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"head-importance file {path} must be a JSON object {{'<layer>-<head>': [scores]}}")
    means: dict[tuple[int, int], float] = {}
    for key, values in raw.items():
        try:
            layer, head = (int(part) for part in key.split("-"))
        except ValueError:
            raise ValueError(f"head-importance file {path}: key {key!r} is not '<layer>-<head>'") from None
        if not isinstance(values, list) or not values or not all(isinstance(v, (int, float)) for v in values):
            raise ValueError(f"head-importance file {path}: {key!r} must map to a non-empty list of numbers")
        means[(layer, head)] = sum(values) / len(values)
    found_layers = 1 + max(layer for layer, _ in means)
    found_heads = 1 + max(head for _, head in means)
    expected = {(layer, head) for layer in range(num_layers) for head in range(num_heads)}
    if set(means) != expected:
        raise ValueError(
            f"head-importance file {path} covers {found_layers} layers x {found_heads} heads ({len(means)} entries), "
            f"but the model has {num_layers} layers x {num_heads} query heads; compute a file for this model with "
            "scripts/compute_head_scores.py"
        )
    return torch.tensor([[means[(layer, head)] for head in range(num_heads)] for layer in range(num_layers)])
