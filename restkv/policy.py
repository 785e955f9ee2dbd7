"""The policy abstraction: a policy scores past tokens; selection and budgets are shared.

A policy is a small dataclass whose fields are its knobs (so Hydra can build it with
``_target_``). It sees one layer at the end of prefill through `LayerInputs` and returns a
score per query head and past token; `Policy.select` turns scores into kept positions under the
layer's budget. Policies never touch model objects.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, ClassVar

import torch

from restkv.checks import check_choice, check_number
from restkv.inputs import LayerInputs
from restkv.select import GQA_MODES, Budget, reduce_groups
from restkv.stages.allocation import HeadSelection
from restkv.stages.resolve import STAGE_KNOBS, Stages, resolve_stages

__all__ = ["LayerInputs", "Policy"]


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
      allocation: how a layer's budget is shared by its heads (`restkv.stages.allocation`): ``uniform``
        (every head keeps the layer's budget), ``adakv`` (the layer's past budget ``heads x
        (keep - window)`` goes to the heads whose scores rank highest overall; ``floor`` is the
        share of it every head is guaranteed, ``allocation_normalize`` rescales each head's
        scores by the mass of its own top ``keep - window`` first) or ``headkv`` (fixed budgets
        per (layer, head) from the HeadKV head file ``head_scores``, with ``head_beta``). Heads
        then keep different numbers of tokens: the integration stores them in a variable-length
        cache. (``allocation_normalize`` is AdaKV's ``normalize``, renamed: scoring policies
        already have a ``normalize`` knob.)
      merge: ``none`` or ``cam`` (`restkv.stages.merge`): before the kept tokens are stored, each past token's
        value is merged, at random, into the tokens after it (CAM); ``merge_start`` is the share of the
        prompt never merged, ``merge_seed`` seeds the draws (reruns merge alike).
      think_ratio: ThinK's share of key channels dropped from the kept tokens (`restkv.stages.channels`;
        0 = off), all but the last ``think_recent`` kept tokens; dropped channels are zero-filled.

    The knobs are flat, one override each; inside the core they are resolved once into stage objects
    (`stages`: `restkv.stages.resolve`), and only the stages read them.
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
    knobs_before_they_existed: ClassVar[dict[str, Any]] = {}
    """Knobs added after run folders of this policy existed, at the value that reproduces those folders (a folder
    whose identity lacks the knob resumes only where that value is the one asked for)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every knob; subclasses extend this and call ``super().validate()``."""
        owner = type(self).__name__
        check_number(owner, "window", self.window, low=1, low_open=False, integer=True)
        check_choice(owner, "gqa", self.gqa, GQA_MODES)
        self.__dict__.pop("_stages", None)
        _ = self.stages  # each stage checks its own knobs, then the rules across them
        if self.stages.allocation.across_layers and type(self).select is not Policy.select:
            raise ValueError(
                f"{owner}.{self.stages.allocation.setting} is not allowed: {owner} chooses each layer's positions its "
                "own way, so the layers cannot share one ranking; use allocation='uniform' or 'adakv'"
            )

    @property
    def stages(self) -> Stages:
        """The schedule, allocation, merge and ThinK this policy's knobs name (`restkv.stages.resolve`), resolved once
        (again only if a knob changes)."""
        knobs = (*(getattr(self, name) for name in STAGE_KNOBS), self.fraction_counted_per_layer)
        cached = self.__dict__.get("_stages")
        if cached is None or cached[0] != knobs:
            cached = (knobs, resolve_stages(self))
            self.__dict__["_stages"] = cached
        return cached[1]

    @property
    def fraction_counted_per_layer(self) -> bool:
        """Under a head-wise allocation and a fractional budget ``f``, whether a layer's heads share
        ``int(L * f * heads)`` tokens as their authors count them (DefensiveKV's ``fraction_count='layer'``), rather
        than ``heads x round(f * L)``; never under a schedule that gives each layer its own budget."""
        return False

    @property
    def query_count(self) -> int:
        """How many of the last prompt queries the policy reads (all of them under ``needs_all_queries``)."""
        return self.stages.key_pruning.queries_needed(self.window)

    @property
    def needs_output_gram(self) -> bool:
        """Whether `score` reads ``inputs.output_gram`` (lets the integration skip computing it)."""
        return False

    def score(self, inputs: LayerInputs, keep: int) -> torch.Tensor:
        """Scores ``[b, h, L - window]`` (float) of past tokens; higher is kept first.

        ``keep`` is this layer's token count (window included), for scorers that depend on it.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement score()")

    def check_budget(self, budget: Budget, prompt_length: int | None = None) -> int | None:
        """The tokens ``budget`` keeps per layer (None for a fraction when no prompt is given), refused when it does
        not exceed the window, which is always kept: the one home of that rule, which the runner (before any model
        loads), the compressor and every layer's eviction ask."""
        if budget.is_ratio and prompt_length is None:
            return None
        tokens = budget.tokens(prompt_length or 0)
        if self.evicts and tokens <= self.window:
            given = "" if prompt_length is None else f" gives {tokens} tokens for a {prompt_length}-token prompt, which"
            raise ValueError(
                f"budget={budget}{given} is not more than the window (policy.window={self.window}): the budget counts "
                "the window, which is always kept, so it must exceed the window"
            )
        return tokens

    def layer_keep(self, prompt_length: int, budget: Budget, layer: int, num_layers: int) -> int:
        """Tokens ``layer`` keeps (window included) for a prompt of ``prompt_length`` tokens."""
        tokens = self.check_budget(budget, prompt_length)
        assert tokens is not None
        return self.stages.schedule.layer_keep(prompt_length, tokens, self.window, layer, num_layers)

    def select(self, inputs: LayerInputs, budget: Budget) -> torch.Tensor | HeadSelection | None:
        """What to keep: positions ``[b, heads, keep]`` (ascending; R-KV's in its authors' cache order) when every
        head keeps the same
        number, a `HeadSelection` under a head-wise allocation, or None to keep the whole prompt.

        A prompt no longer than the layer's budget is kept whole under every allocation (the
        reference AdaKV code still trims a token or two by rounding when the budget equals the
        prompt length exactly).
        """
        scored = self.layer_scores(inputs, budget)
        if scored is None:
            return None
        scores, keep = scored
        return self.stages.allocation.select(scores, keep, self.window, inputs, budget)

    def layer_scores(self, inputs: LayerInputs, budget: Budget) -> tuple[torch.Tensor, int] | None:
        """One layer's scores reduced to selection heads ``[b, heads, P]`` and its token count, or None when the
        layer keeps the whole prompt."""
        if not self.evicts:
            return None
        keep = self.layer_keep(inputs.length, budget, inputs.layer, inputs.num_layers)
        allocation = self.stages.allocation
        if keep >= inputs.length or allocation.keeps_whole(inputs, budget, self.window):
            return None
        if budget.is_ratio and inputs.fraction is None and not self.stages.schedule.varies_by_layer:
            inputs = replace(inputs, fraction=float(budget.value))
        scores = self.score(inputs, keep)
        past = inputs.length - self.window
        if scores.shape[-1] != past:
            raise RuntimeError(f"{type(self).__name__}.score returned {scores.shape[-1]} scores for {past} past tokens")
        return reduce_groups(scores, inputs.num_kv_heads, self.gqa), keep

    def select_layers(self, layers: list[LayerInputs], budget: Budget) -> list[torch.Tensor | HeadSelection | None]:
        """Every layer's selection at once, in layer order: what an allocation shared across layers
        (``allocation='global'``) needs; any other allocation selects layer by layer."""
        allocation = self.stages.allocation
        if not allocation.across_layers:
            return [self.select(inputs, budget) for inputs in layers]
        scored = [self.layer_scores(inputs, budget) for inputs in layers]
        if any(entry is None for entry in scored):
            return [None] * len(layers)  # the prompt fits the budget: every layer keeps it whole
        return allocation.select_layers([s for s, _ in scored], [k for _, k in scored], self.window, layers, budget)

    def merged_values(self, inputs: LayerInputs, selection: object, draws: torch.Tensor | None = None) -> torch.Tensor:
        """The values to store for ``selection``: ``inputs.values``, or the merge stage's (`restkv.stages.merge`)."""
        return self.stages.merge.merged_values(inputs, selection, self.window, self.gqa, draws)

    def prune_kept_keys(self, kept_keys: torch.Tensor, queries: torch.Tensor) -> int:
        """ThinK on a dense layer's kept keys ``[1, heads, n, d]``, in place; returns the entries zero-filled."""
        return self.stages.key_pruning.prune(kept_keys, queries)

    def input_files(self) -> list[Path]:
        """Files the policy reads besides the model (HeadKV's head file): a run's identity hashes their content."""
        return self.stages.allocation.input_files()

    def check_model(self, config: Any) -> None:
        """Raise before any work when the policy cannot run on a model with this config (``num_hidden_layers``,
        ``num_attention_heads``): a head file of another shape, say."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.stages.allocation.check_model(text.num_hidden_layers, text.num_attention_heads)

    def describe(self) -> dict[str, object]:
        """The policy's name and knobs, for result files."""
        return {"policy": type(self).__name__, **{f.name: getattr(self, f.name) for f in fields(self)}}
