"""The policy abstraction: a policy scores past tokens; selection and budgets are shared.

A policy is a small dataclass whose fields are its knobs (so Hydra can build it with
``_target_``). It sees one layer at the end of prefill through `LayerInputs` and returns a
score per query head and past token; `Policy.select` turns scores into kept positions under the
layer's budget. Policies never touch model objects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import ClassVar

import torch

from restkv.checks import check_choice, check_number
from restkv.select import GQA_MODES, SCHEDULES, Budget, keep_indices, layer_budget, reduce_groups


@dataclass
class LayerInputs:
    """What a policy sees of one attention layer at the end of prefill.

    ``queries`` are the last ``window`` queries ``[b, h, w, d]`` (all ``L`` of them for
    policies with ``needs_all_queries``); ``keys``/``values`` are the whole prompt's cache
    ``[b, h_kv, L, d]``, position-encoded. ``output_gram`` lazily gives the per-head
    ``W_o^h^T W_o^h`` matrices ``[h, d, d]`` (None when the layer has no output projection).
    """

    queries: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    layer: int
    num_layers: int
    scaling: float | None = None
    output_gram: Callable[[], torch.Tensor] | None = None

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
    """

    window: int = 32
    gqa: str = "mean"
    schedule: str = "uniform"
    beta: float = 20.0

    needs_all_queries: ClassVar[bool] = False
    """Policies such as H2O need every prompt query, not only the window's."""
    evicts: ClassVar[bool] = True
    """False for the full-cache reference."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every knob; subclasses extend this and call ``super().validate()``."""
        owner = type(self).__name__
        check_number(owner, "window", self.window, low=1, low_open=False, integer=True)
        check_choice(owner, "gqa", self.gqa, GQA_MODES)
        check_choice(owner, "schedule", self.schedule, SCHEDULES)
        check_number(owner, "beta", self.beta, low=0)

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

    def select(self, inputs: LayerInputs, budget: Budget) -> torch.Tensor | None:
        """Positions to keep ``[b, heads, keep]`` (ascending), or None to keep the whole prompt."""
        if not self.evicts:
            return None
        keep = self.layer_keep(inputs.length, budget, inputs.layer, inputs.num_layers)
        if keep >= inputs.length:
            return None
        scores = self.score(inputs, keep)
        past = inputs.length - self.window
        if scores.shape[-1] != past:
            raise RuntimeError(f"{type(self).__name__}.score returned {scores.shape[-1]} scores for {past} past tokens")
        return keep_indices(reduce_groups(scores, inputs.num_kv_heads, self.gqa), keep, self.window)

    def describe(self) -> dict[str, object]:
        """The policy's name and knobs, for result files."""
        return {"policy": type(self).__name__, **{f.name: getattr(self, f.name) for f in fields(self)}}
