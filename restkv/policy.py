"""The policy abstraction: a policy scores past tokens; selection and budgets are shared.

A policy is a small dataclass whose fields are its knobs (so Hydra can build it with
``_target_``). It sees one layer at the end of prefill through `LayerInputs` and returns a
score per query head and past token; `Policy.select` turns scores into kept positions under the
layer's budget. Policies never touch model objects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

import torch

from restkv.allocation import (
    ALLOCATIONS,
    HeadSelection,
    adakv_capacities,
    headkv_capacities,
    load_head_scores,
    reduce_importance,
    top_positions,
)
from restkv.channels import THINK_QUERIES, prune_keys
from restkv.checks import check_choice, check_number
from restkv.merge import MERGES, cam_merge, cam_probabilities, cam_start, draw_merges
from restkv.scoring import window_attention
from restkv.select import GQA_MODES, SCHEDULES, Budget, keep_indices, layer_budget, reduce_groups


def head_file(given: str) -> Path | None:
    """A head-importance file: as given, else under the project (a checkout, or the installed copy)."""
    here = Path(__file__).resolve().parent
    candidates = (Path(given).expanduser(), here.parent / given, here / "eval" / "assets" / given)
    return next((path for path in candidates if path.is_file()), None)


@dataclass
class LayerInputs:
    """What a policy sees of one attention layer at the end of prefill.

    ``queries`` are the last ``window`` queries ``[b, h, w, d]`` (all ``L`` of them for
    policies with ``needs_all_queries``); ``keys``/``values`` are the whole prompt's cache
    ``[b, h_kv, L, d]``, position-encoded. ``output_gram`` lazily gives the per-head
    ``W_o^h^T W_o^h`` matrices ``[h, d, d]`` (None when the layer has no output projection);
    ``output_weight`` lazily gives the output projection's weight ``[hidden, h * d]`` itself.
    """

    queries: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    layer: int
    num_layers: int
    scaling: float | None = None
    output_gram: Callable[[], torch.Tensor] | None = None
    output_weight: Callable[[], torch.Tensor] | None = None

    @property
    def num_heads(self) -> int:
        return self.queries.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self.keys.shape[1]

    @property
    def length(self) -> int:
        return self.keys.shape[2]


@dataclass
class Policy:
    """Base class of every eviction policy.

    Knobs shared by all policies:
      window: the observation window (the last ``window`` prompt tokens), always kept.
      gqa: ``mean``/``max`` reduce the scores of a key/value head's query group and select once
        per key/value head (the cache really shrinks); ``expand`` selects per query head over
        repeated keys/values, like the reference code (the cache holds ``h`` heads).
      schedule: ``uniform`` (every layer keeps the budget) or ``pyramid`` (PyramidKV's
        per-layer progression, controlled by ``beta``), combinable with any scorer.
      allocation: how a layer's budget is shared by its heads (`restkv.allocation`): ``uniform``
        (every head keeps the layer's budget), ``adakv`` (the layer's past budget ``heads x
        (keep - window)`` goes to the heads whose scores rank highest overall; ``floor`` is the
        share of it every head is guaranteed, ``allocation_normalize`` rescales each head's
        scores by the mass of its own top ``keep - window`` first) or ``headkv`` (fixed budgets
        per (layer, head) from the HeadKV head file ``head_scores``, with ``head_beta``). Heads
        then keep different numbers of tokens: the integration stores them in a variable-length
        cache. (``allocation_normalize`` is AdaKV's ``normalize``, renamed: scoring policies
        already have a ``normalize`` knob.)
      merge: ``none`` or ``cam`` (`restkv.merge`): before the kept tokens are stored, each past token's
        value is merged, at random, into the tokens after it (CAM); ``merge_start`` is the share of the
        prompt never merged, ``merge_seed`` seeds the draws (reruns merge alike).
      think_ratio: ThinK's share of key channels dropped from the kept tokens (`restkv.channels`;
        0 = off), all but the last ``think_recent`` kept tokens; dropped channels are zero-filled.
    """

    window: int = 32
    gqa: str = "mean"
    schedule: str = "uniform"
    beta: float = 20.0
    allocation: str = "uniform"
    floor: float = 0.2
    allocation_normalize: bool = True
    head_scores: str | None = None
    head_beta: float = 1.01
    merge: str = "none"
    merge_start: float = 0.1
    merge_seed: int = 0
    think_ratio: float = 0.0
    think_recent: int = 32

    needs_all_queries: ClassVar[bool] = False
    """Policies such as H2O need every prompt query, not only the window's."""
    evicts: ClassVar[bool] = True
    """False for the full-cache reference."""
    allows_allocation: ClassVar[bool] = True
    """False for policies whose scores cannot rank heads against each other (position-only ones)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every knob; subclasses extend this and call ``super().validate()``."""
        owner = type(self).__name__
        check_number(owner, "window", self.window, low=1, low_open=False, integer=True)
        check_choice(owner, "gqa", self.gqa, GQA_MODES)
        check_choice(owner, "schedule", self.schedule, SCHEDULES)
        check_number(owner, "beta", self.beta, low=0)
        check_choice(owner, "allocation", self.allocation, ALLOCATIONS)
        check_number(owner, "floor", self.floor, low=0, high=1, low_open=False)
        check_number(owner, "head_beta", self.head_beta, low=0)
        check_choice(owner, "merge", self.merge, MERGES)
        check_number(owner, "merge_start", self.merge_start, low=0, high=1, low_open=False)
        check_number(owner, "merge_seed", self.merge_seed, low=0, low_open=False, integer=True)
        check_number(owner, "think_ratio", self.think_ratio, low=0, high=1, low_open=False, high_open=True)
        check_number(owner, "think_recent", self.think_recent, low=0, low_open=False, integer=True)
        if (self.merge != "none" or self.think_ratio > 0) and not self.evicts:
            raise ValueError(
                f"{owner} keeps every token: merge={self.merge!r} and think_ratio={self.think_ratio} need eviction"
            )
        if self.think_ratio > 0 and self.allocation != "uniform":
            raise NotImplementedError(
                f"{owner}.think_ratio={self.think_ratio} with allocation={self.allocation!r} is not built: ThinK "
                "prunes dense caches (every head the same length); use allocation='uniform'"
            )
        if self.allocation != "uniform" and not (self.allows_allocation and self.evicts):
            raise ValueError(
                f"{owner}.allocation={self.allocation!r} is not allowed: {owner} cannot share a budget across heads "
                "(it keeps everything, or its scores are the same for every head); use allocation='uniform'"
            )
        if self.allocation == "headkv":
            if self.head_scores is None:
                raise ValueError(
                    f"{owner}.allocation='headkv' needs head_scores, the path of a HeadKV head-importance file "
                    "(make one with scripts/compute_head_scores.py; the micro model's: "
                    "models/micro-llama/head_scores.json)"
                )
            if head_file(self.head_scores) is None:
                raise FileNotFoundError(
                    f"{owner}.head_scores={self.head_scores!r}: no such file (as given, or under the project); "
                    "make one for your model with scripts/compute_head_scores.py"
                )
            if self.schedule != "uniform":
                raise ValueError(
                    f"{owner}.allocation='headkv' fixes every (layer, head)'s budget from the head file, so "
                    f"schedule={self.schedule!r} cannot apply; use schedule='uniform'"
                )
        elif self.head_scores is not None:
            raise ValueError(
                f"{owner}.head_scores is set but allocation={self.allocation!r}; head files are read by "
                "allocation='headkv' only"
            )

    @property
    def query_count(self) -> int:
        """How many of the last prompt queries the policy reads (all of them under ``needs_all_queries``)."""
        return max(self.window, THINK_QUERIES) if self.think_ratio > 0 else self.window

    @property
    def needs_output_gram(self) -> bool:
        """Whether `score` reads ``inputs.output_gram`` (lets the integration skip computing it)."""
        return False

    def score(self, inputs: LayerInputs, keep: int) -> torch.Tensor:
        """Scores ``[b, h, L - window]`` (float) of past tokens; higher is kept first.

        ``keep`` is this layer's token count (window included), for scorers that depend on it.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement score()")

    def layer_keep(self, prompt_length: int, budget: Budget, layer: int, num_layers: int) -> int:
        """Tokens ``layer`` keeps (window included) for a prompt of ``prompt_length`` tokens."""
        tokens = budget.tokens(prompt_length)
        if tokens <= self.window:
            raise ValueError(
                f"budget {budget} gives {tokens} tokens for a {prompt_length}-token prompt, which is not more "
                f"than the window ({self.window}); the budget must exceed the window"
            )
        return layer_budget(self.schedule, prompt_length, tokens, self.window, self.beta, layer, num_layers)

    def select(self, inputs: LayerInputs, budget: Budget) -> torch.Tensor | HeadSelection | None:
        """What to keep: positions ``[b, heads, keep]`` (ascending) when every head keeps the same
        number, a `HeadSelection` under a head-wise allocation, or None to keep the whole prompt.

        A prompt no longer than the layer's budget is kept whole under every allocation (the
        reference AdaKV code still trims a token or two by rounding when the budget equals the
        prompt length exactly).
        """
        if not self.evicts:
            return None
        keep = self.layer_keep(inputs.length, budget, inputs.layer, inputs.num_layers)
        if keep >= inputs.length:
            return None
        past = inputs.length - self.window
        if self.allocation == "headkv":
            capacities = self._headkv_capacities(inputs, budget)
            if bool((capacities >= past).all()):
                return None
        scores = self.score(inputs, keep)
        if scores.shape[-1] != past:
            raise RuntimeError(f"{type(self).__name__}.score returned {scores.shape[-1]} scores for {past} past tokens")
        scores = reduce_groups(scores, inputs.num_kv_heads, self.gqa)
        if self.allocation == "uniform":
            return keep_indices(scores, keep, self.window)
        if scores.shape[0] != 1:
            raise NotImplementedError(f"head-wise allocation runs on batch size 1; got {scores.shape[0]}")
        if self.allocation == "adakv":  # one sort serves the allocation and the selection
            ranked = scores[0].sort(dim=-1, descending=True)
            base = keep - self.window
            capacities = adakv_capacities(scores[0], base, self.floor, self.allocation_normalize, ranked.values)
            return top_positions(scores[0], capacities, self.window, ranked.indices)
        return top_positions(scores[0], capacities.clamp(max=past), self.window)

    def merged_values(self, inputs: LayerInputs, selection: object, draws: torch.Tensor | None = None) -> torch.Tensor:
        """The values to store for ``selection``: ``inputs.values``, or CAM's merged values under ``merge='cam'``.

        Merging runs per key/value head: a head's merge probability reads its query group's attention,
        reduced by ``gqa`` (``expand`` on grouped heads is refused). ``draws`` replays recorded draws.
        A layer kept whole (``selection`` None) is not merged.
        """
        if self.merge == "none" or selection is None:
            return inputs.values
        heads, kv_heads = inputs.num_heads, inputs.num_kv_heads
        if heads != kv_heads and self.gqa == "expand":
            raise NotImplementedError(
                f"merge={self.merge!r} with gqa='expand' on a model with grouped key/value heads ({heads} query, "
                f"{kv_heads} key/value heads) is not built: merged values would differ per query head; use gqa='mean'"
            )
        attention = window_attention(inputs.queries[..., -self.window :, :], inputs.keys, inputs.scaling)
        means = attention[0].mean(dim=-2)  # [h, L]: each column's mean over the window's rows
        if heads != kv_heads:
            grouped = means.view(kv_heads, heads // kv_heads, -1)
            means = grouped.amax(dim=1) if self.gqa == "max" else grouped.mean(dim=1)
        start = cam_start(inputs.length, self.merge_start)
        if draws is None:
            draws = draw_merges(cam_probabilities(means, start, self.window), self.merge_seed, inputs.layer)
        return cam_merge(inputs.values, draws, start, self.window)

    def prune_kept_keys(self, kept_keys: torch.Tensor, queries: torch.Tensor) -> int:
        """ThinK on a dense layer's kept keys ``[1, heads, n, d]``, in place; returns the entries zero-filled."""
        if self.think_ratio <= 0:
            return 0
        return prune_keys(kept_keys, queries, self.think_ratio, self.think_recent)[1]

    def _headkv_capacities(self, inputs: LayerInputs, budget: Budget) -> torch.Tensor:
        """This layer's per-head past budgets from the head file (loaded once per model shape)."""
        shape = (inputs.num_layers, inputs.num_heads)
        cached = getattr(self, "_importance", None)
        if cached is None or cached[0] != shape:
            cached = (shape, load_head_scores(head_file(self.head_scores) or self.head_scores, *shape))
            self._importance = cached
        importance = reduce_importance(cached[1], inputs.num_kv_heads, self.gqa)
        tokens = budget.tokens(inputs.length)
        return headkv_capacities(importance, tokens, self.head_beta)[inputs.layer].to(inputs.keys.device)

    def describe(self) -> dict[str, object]:
        """The policy's name and knobs, for result files."""
        return {"policy": type(self).__name__, **{f.name: getattr(self, f.name) for f in fields(self)}}
