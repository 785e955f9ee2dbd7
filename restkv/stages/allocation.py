"""How a layer's budget is shared by its heads, a policy stage: the head-wise budget allocators.

Scores come in per selection head (``[heads, P]`` over a layer's past tokens, batch 1). A uniform
allocation gives every head the layer's budget; the two head-wise allocators share it unevenly:

- ``adakv`` (AdaKV, Feng et al. 2024): the layer's past budget ``heads x base`` goes to the heads
  whose scores rank highest when all heads' sorted scores are ranked together, after an optional
  per-head rescaling (``normalize``), with a guaranteed share ``floor`` of ``base`` per head.
- ``headkv`` (HeadKV, Fu et al. 2024): fixed per-(layer, head) budgets computed once from
  head-importance scores (a file in HeadKV's JSON format, ``{"<layer>-<head>": [scores...]}``).
- ``global`` and ``global_window`` (Layer-DefensiveKV, Feng et al. 2026): one ranking of every layer and head
  (`restkv.rankings`), each layer's window kept (``global``) or ranked at its layer's top score as the authors
  do (``global_window``); every layer is scored before any is evicted (`restkv.policy.Policy.select_layers`).

Both follow the ReST-KV authors' ``AdaKVCluster`` and HeadKV budget code to the rounding (see
``../shared/golden/README.md``, "Head-wise"). What a head keeps (its top positions plus the
window) is a `HeadSelection`: the per-head positions flattened one head after another.

The arithmetic is pure functions (`adakv_capacities`, `headkv_capacities`, `top_positions`); the
stage objects (`UniformAllocation`, `AdaKVAllocation`, `HeadKVAllocation`, resolved once from a
policy's knobs by `allocation_of`) apply it to a layer's reduced scores.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from restkv.checks import check_choice, check_number
from restkv.head_selection import HeadSelection as HeadSelection  # re-exported: its historical home
from restkv.rankings import global_capacities as global_capacities
from restkv.rankings import shared_past_tokens as shared_past_tokens
from restkv.rankings import shared_tokens
from restkv.rankings import window_ranked_selection as window_ranked_selection
from restkv.select import Budget, keep_indices

if TYPE_CHECKING:
    from restkv.inputs import LayerInputs

ALLOCATIONS = ("uniform", "adakv", "headkv", "global", "global_window")


def adakv_capacities(
    scores: torch.Tensor,
    base: int,
    floor: float,
    normalize: bool,
    ranked: torch.Tensor | None = None,
    shared: int | None = None,
) -> torch.Tensor:
    """Past tokens each head keeps under AdaKV: int64 ``[heads]`` for scores ``[heads, P]``.

    ``base`` is the uniform per-head past budget (``budget - window``); the heads share
    ``heads x base``. Each head's scores are sorted descending; with ``normalize`` they are scaled
    by the head's share of mass in its own top ``base``. The top ``heads x base`` of all sorted
    scores count per head (``count``), and a head keeps ``round(count * (1 - floor) + int(base *
    floor))`` (float32 arithmetic, half to even, as the reference computes it). ``ranked``: the
    scores already sorted descending per head, when the caller has them. ``shared``: the past tokens the heads
    share when it is not ``heads x base`` (a fraction counted per layer, `shared_past_tokens`).
    """
    heads, past = scores.shape
    if not 0 <= base <= past:
        raise ValueError(f"AdaKV: a per-head budget of {base} past tokens does not fit {past} past tokens")
    shared = heads * base if shared is None else shared
    if not 0 <= shared <= heads * past:
        raise ValueError(f"AdaKV: {shared} shared past tokens do not fit {heads} heads of {past} past tokens")
    ranked = scores.sort(dim=-1, descending=True).values if ranked is None else ranked
    if normalize:
        ranked = ranked * (ranked[:, :base].sum(dim=-1, keepdim=True) / ranked.sum(dim=-1, keepdim=True))
    winners = ranked.reshape(-1).topk(shared).indices // past
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
    if bool((importance < 0).any()):
        raise ValueError("head-importance scores must not be negative (HeadKV's are retrieval frequencies)")
    share = importance.double() / total
    pool = (budget // beta) * layers * heads
    minimum = budget - budget // beta
    capacities = torch.round(share * pool + minimum).long()
    if bool((capacities < 0).any()):  # cannot happen with beta >= 1 and non-negative scores: checked where made
        layer, head = (int(i) for i in (capacities < 0).nonzero()[0])
        raise ValueError(f"HeadKV gave layer {layer} head {head} a negative budget ({int(capacities[layer, head])})")
    return capacities


def top_positions(
    scores: torch.Tensor, capacities: torch.Tensor, window: int, order: torch.Tensor | None = None
) -> HeadSelection:
    """Head ``h`` keeps its ``capacities[h]`` best past positions plus the window, ascending.

    ``scores`` ``[heads, P]`` cover the past tokens; the window is positions ``P .. P + window - 1``.
    ``order``: the positions by descending score per head, when the caller has them.
    """
    heads, past = scores.shape
    if bool((capacities < 0).any()) or bool((capacities > past).any()):
        raise ValueError(f"head budgets {capacities.tolist()} must lie in [0, {past}] (the layer's past tokens)")
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


def _is_score(value: object) -> bool:
    """A head score: a finite number >= 0 (not a boolean)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


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
        raw = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise ValueError(f"head-importance file {path} is not UTF-8 text ({error}); it must be HeadKV's JSON") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"head-importance file {path} is not valid JSON: {error}") from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(
            f"head-importance file {path} must be a non-empty JSON object {{'<layer>-<head>': [scores]}}; make one "
            "for your model with scripts/compute_head_scores.py"
        )
    means: dict[tuple[int, int], float] = {}
    for key, values in raw.items():
        try:
            layer, head = (int(part) for part in key.split("-"))
        except ValueError:
            raise ValueError(f"head-importance file {path}: key {key!r} is not '<layer>-<head>'") from None
        numbers = isinstance(values, list) and values and all(_is_score(v) for v in values)
        if not numbers:
            raise ValueError(
                f"head-importance file {path}: {key!r} must map to a non-empty list of finite numbers >= 0 "
                f"(HeadKV's retrieval scores); got {str(values)[:80]}"
            )
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


# -- the stage -----------------------------------------------------------------------------------------


class Allocation(Protocol):
    """Kept positions of one layer from its scores reduced to selection heads ``[b, heads, P]``."""

    setting: str
    """The knobs that chose it, as a user would write them (for messages)."""
    headwise: bool
    """Whether heads may keep different numbers of tokens (stored in a variable-length layout)."""
    fixed_per_head: bool
    """Whether every (layer, head)'s budget is fixed in advance (no per-layer schedule can apply)."""
    across_layers: bool
    """Whether layers share one budget: every layer is scored before any is evicted (``select_layers``)."""

    def keeps_whole(self, inputs: LayerInputs, budget: Budget, window: int) -> bool: ...

    def input_files(self) -> list[Path]:
        """Files the allocation reads (a run's identity hashes them)."""
        ...

    def check_model(self, num_layers: int, num_heads: int) -> None:
        """Raise, before any work, when the allocation cannot serve a model of this shape (a bad head file)."""
        ...

    def capacities(self, scores: torch.Tensor, base: int, inputs: LayerInputs, budget: Budget) -> torch.Tensor: ...

    def select(
        self, scores: torch.Tensor, keep: int, window: int, inputs: LayerInputs, budget: Budget
    ) -> torch.Tensor | HeadSelection: ...


class FromScoresAlone:
    """What the allocations that read nothing but a layer's scores share: no file, any model shape, and no layer kept
    whole before its scores are seen."""

    def keeps_whole(self, inputs: LayerInputs, budget: Budget, window: int) -> bool:
        return False

    def input_files(self) -> list[Path]:
        return []

    def check_model(self, num_layers: int, num_heads: int) -> None:
        return None


@dataclass(frozen=True)
class UniformAllocation(FromScoresAlone):
    """Every head keeps the layer's budget: positions ``[b, heads, keep]``."""

    setting: str = "allocation='uniform'"
    headwise: bool = False
    fixed_per_head: bool = False
    across_layers: bool = False

    def capacities(self, scores: torch.Tensor, base: int, inputs: LayerInputs, budget: Budget) -> torch.Tensor:
        """Past tokens per head ``[heads]`` for scores ``[heads, P]``: ``base`` each."""
        return torch.full((scores.shape[0],), base, device=scores.device)

    def select(
        self, scores: torch.Tensor, keep: int, window: int, inputs: LayerInputs, budget: Budget
    ) -> torch.Tensor | HeadSelection:
        return keep_indices(scores, keep, window)


def _single_prompt(scores: torch.Tensor) -> torch.Tensor:
    """The ``[heads, P]`` scores of a batch of one; head-wise allocations are built for batch size 1."""
    if scores.shape[0] != 1:
        raise NotImplementedError(f"head-wise allocation runs on batch size 1; got {scores.shape[0]}")
    return scores[0]


@dataclass(frozen=True)
class AdaKVAllocation(FromScoresAlone):
    """AdaKV's shared ranking of the layer's past budget (`adakv_capacities`)."""

    floor: float
    normalize: bool
    fraction_per_layer: bool = False
    headwise: bool = True
    fixed_per_head: bool = False
    across_layers: bool = False

    @property
    def setting(self) -> str:
        return "allocation='adakv'"

    def _shared(self, heads: int, window: int, inputs: LayerInputs, budget: Budget) -> int | None:
        if not (self.fraction_per_layer and budget.is_ratio):
            return None
        return shared_past_tokens(inputs.length, float(budget.value), heads, window)

    def capacities(self, scores: torch.Tensor, base: int, inputs: LayerInputs, budget: Budget) -> torch.Tensor:
        shared = self._shared(scores.shape[0], inputs.length - scores.shape[1], inputs, budget)
        return adakv_capacities(scores, base, self.floor, self.normalize, shared=shared)

    def select(
        self, scores: torch.Tensor, keep: int, window: int, inputs: LayerInputs, budget: Budget
    ) -> torch.Tensor | HeadSelection:
        scores = _single_prompt(scores)
        ranked = scores.sort(dim=-1, descending=True)  # one sort serves the allocation and the selection
        shared = self._shared(scores.shape[0], window, inputs, budget)
        capacities = adakv_capacities(scores, keep - window, self.floor, self.normalize, ranked.values, shared)
        return top_positions(scores, capacities, window, ranked.indices)


@dataclass(frozen=True)
class GlobalAllocation(FromScoresAlone):
    """One top-k over every layer and head (`global_capacities`): asks for every layer's scores at once."""

    headwise: bool = True
    fixed_per_head: bool = False
    across_layers: bool = True

    @property
    def setting(self) -> str:
        return "allocation='global'"

    def capacities(self, scores: torch.Tensor, base: int, inputs: LayerInputs, budget: Budget) -> torch.Tensor:
        raise NotImplementedError("allocation='global' shares the budget across layers: use select_layers")

    def select(
        self, scores: torch.Tensor, keep: int, window: int, inputs: LayerInputs, budget: Budget
    ) -> torch.Tensor | HeadSelection:
        raise NotImplementedError("allocation='global' selects every layer at once: use select_layers")

    def select_layers(
        self, scores: list[torch.Tensor], keeps: list[int], window: int, layers: list[LayerInputs], budget: Budget
    ) -> list[HeadSelection]:
        """Each layer's kept positions from its reduced scores ``[b, heads, P]`` and token count ``keep``."""
        flat = [_single_prompt(layer) for layer in scores]
        capacities = global_capacities(flat, [keep - window for keep in keeps])
        return [top_positions(layer, counts, window) for layer, counts in zip(flat, capacities, strict=True)]


@dataclass(frozen=True)
class GlobalWindowAllocation(GlobalAllocation):
    """Layer-DefensiveKV's authors' ranking (`window_ranked_selection`): every layer's window competes at its
    layer's top score in one top-k over all layers, so a layer can lose part of its window."""

    fraction_per_layer: bool = False

    @property
    def setting(self) -> str:
        return "allocation='global_window'"

    def select_layers(
        self, scores: list[torch.Tensor], keeps: list[int], window: int, layers: list[LayerInputs], budget: Budget
    ) -> list[HeadSelection]:
        flat = [_single_prompt(layer) for layer in scores]
        heads, count = flat[0].shape[0], len(flat)
        if self.fraction_per_layer and budget.is_ratio:
            total = shared_tokens(layers[0].length, float(budget.value), heads, count)
        else:
            total = sum(layer.shape[0] * keep for layer, keep in zip(flat, keeps, strict=True))
        return window_ranked_selection(flat, window, total)


@dataclass(frozen=True)
class HeadKVAllocation:
    """HeadKV's fixed per-(layer, head) budgets from a head-importance file (`headkv_capacities`)."""

    head_scores: str
    head_beta: float
    gqa: str
    headwise: bool = True
    fixed_per_head: bool = True
    across_layers: bool = False
    _importance: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict, init=False, compare=False)
    """Each model shape's mean head scores, read from the file once."""
    _budgets: dict[tuple[int, int, int, int], torch.Tensor] = field(default_factory=dict, init=False, compare=False)
    """Every layer's head budgets, per model shape and token budget."""

    @property
    def setting(self) -> str:
        return "allocation='headkv'"

    def layer_capacities(self, inputs: LayerInputs, budget: Budget) -> torch.Tensor:
        """This layer's past budget per selection head ``[heads]``; the file is read once per model shape and
        the table of every layer's budgets computed once per token budget."""
        shape = (inputs.num_layers, inputs.num_heads)
        key = (*shape, inputs.num_kv_heads, budget.tokens(inputs.length))
        if key not in self._budgets:
            importance = reduce_importance(self._head_importance(shape), inputs.num_kv_heads, self.gqa)
            self._budgets[key] = headkv_capacities(importance, key[-1], self.head_beta)
        return self._budgets[key][inputs.layer].to(inputs.keys.device)

    def check_model(self, num_layers: int, num_heads: int) -> None:
        """Read and check the head file for this shape now, so a bad file is refused before a model loads."""
        self._head_importance((num_layers, num_heads))

    def _head_importance(self, shape: tuple[int, int]) -> torch.Tensor:
        if shape not in self._importance:
            self._importance[shape] = load_head_scores(head_file(self.head_scores) or self.head_scores, *shape)
        return self._importance[shape]

    def input_files(self) -> list[Path]:
        """The head file (its content is part of the experiment)."""
        found = head_file(self.head_scores)
        return [found] if found is not None else []

    def keeps_whole(self, inputs: LayerInputs, budget: Budget, window: int) -> bool:
        """Whether every head's budget covers the past tokens (nothing to evict, so nothing to score)."""
        return bool((self.layer_capacities(inputs, budget) >= inputs.length - window).all())

    def capacities(self, scores: torch.Tensor, base: int, inputs: LayerInputs, budget: Budget) -> torch.Tensor:
        return self.layer_capacities(inputs, budget).clamp(max=scores.shape[-1])

    def select(
        self, scores: torch.Tensor, keep: int, window: int, inputs: LayerInputs, budget: Budget
    ) -> torch.Tensor | HeadSelection:
        scores = _single_prompt(scores)
        return top_positions(scores, self.capacities(scores, keep - window, inputs, budget), window)


def head_file(given: str) -> Path | None:
    """A head-importance file: as given, else under the project (a checkout, or the installed copy)."""
    here = Path(__file__).resolve().parent
    candidates = (Path(given).expanduser(), here.parent / given, here / "eval" / "assets" / given)
    return next((path for path in candidates if path.is_file()), None)


def allocation_of(
    owner: str,
    allocation: str,
    floor: float,
    normalize: bool,
    head_scores: str | None,
    head_beta: float,
    gqa: str,
    fraction_per_layer: bool = False,
) -> Allocation:
    """The stage the allocation knobs of policy ``owner`` name; a bad value or a missing head file is refused.
    ``fraction_per_layer``: the policy counts a fractional budget per layer (`Policy.fraction_counted_per_layer`)."""
    check_choice(owner, "allocation", allocation, ALLOCATIONS)
    check_number(owner, "floor", floor, low=0, high=1, low_open=False)
    check_number(owner, "head_beta", head_beta, low=1, low_open=False)  # below 1 the least important heads go negative
    if allocation == "adakv":
        return AdaKVAllocation(floor, normalize, fraction_per_layer=fraction_per_layer)
    if allocation == "global":
        return GlobalAllocation()
    if allocation == "global_window":
        return GlobalWindowAllocation(fraction_per_layer=fraction_per_layer)
    if allocation != "headkv":
        if head_scores is not None:
            raise ValueError(
                f"{owner}.head_scores is set but allocation={allocation!r}; head files are read by "
                "allocation='headkv' only"
            )
        return UniformAllocation()
    if head_scores is None:
        raise ValueError(
            f"{owner}.allocation='headkv' needs head_scores, the path of a HeadKV head-importance file "
            "(make one with scripts/compute_head_scores.py; the micro model's: models/micro-llama/head_scores.json)"
        )
    if head_file(head_scores) is None:
        raise FileNotFoundError(
            f"{owner}.head_scores={head_scores!r}: no such file (as given, or under the project); "
            "make one for your model with scripts/compute_head_scores.py"
        )
    return HeadKVAllocation(head_scores, head_beta, gqa)
