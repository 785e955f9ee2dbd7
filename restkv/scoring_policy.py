"""A policy assembled from scoring stages: indicator, temporal aggregation, spatial smoothing.

ReST-KV, SnapKV and the paper's ablation rows are all settings of `ScoringPolicy`, so an
ablation is a configuration change, not new code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from restkv import scoring, spatial
from restkv.checks import check_choice, check_number
from restkv.policy import LayerInputs, Policy

INDICATORS = ("attention", "attention_value", "reconstruction")
ORDERS = ("after", "before")


@dataclass
class ScoringPolicy(Policy):
    """Scores past tokens with a composition of stages.

    indicator: ``attention`` (window attention), ``attention_value`` (attention x ||v||) or
      ``reconstruction`` (``a/(1-a) * ||W_o^h (o - v)||^tau``; ``use_wo=False`` drops ``W_o``).
    temporal: how the window's queries are combined: ``sum``, ``mean``, ``ema`` (newest
      query weighs ``alpha``), ``inv_ema`` (oldest weighs ``alpha``), ``last`` (newest only),
      ``defensive`` (DefensiveKV's worst case: the maximum, floored at its mean over the past tokens,
      per query head before ``gqa`` reduces a group).
    power: the indicator raised to this power per token (``2`` with ``use_wo=False`` is DropKV's squared
      output change); applied before spatial smoothing, per query under ``order='before'``.
    order: ``after`` aggregates attention, then computes the indicator; ``before`` computes it
      per query (each query's output over all keys) and aggregates the scores. ``normalize``
      (``before`` with ``reconstruction`` only) divides each query's scores by its output norm.
    spatial: ``none``, ``avgpool``/``maxpool`` (centred, ``kernel``) or ``adaptive`` (per-head
      kernel and shift from the attention drift; ``kernel`` is the minimum size, ``scale`` the
      drift per kernel step).
    """

    indicator: str = "reconstruction"
    temporal: str = "ema"
    alpha: float = 0.3
    order: str = "after"
    use_wo: bool = True
    tau: float = 1.0
    power: float = 1.0
    normalize: bool = False
    spatial: str = "adaptive"
    kernel: int = 5
    scale: float = 2000.0

    def validate(self) -> None:
        super().validate()
        owner = type(self).__name__
        check_choice(owner, "indicator", self.indicator, INDICATORS)
        check_choice(owner, "temporal", self.temporal, scoring.TEMPORAL)
        check_choice(owner, "order", self.order, ORDERS)
        check_choice(owner, "spatial", self.spatial, spatial.SPATIAL)
        check_number(owner, "alpha", self.alpha, low=0, high=1)
        check_number(owner, "tau", self.tau, low=0)
        check_number(owner, "power", self.power, low=0)
        check_number(owner, "scale", self.scale, low=0)
        check_number(owner, "kernel", self.kernel, low=1, low_open=False, integer=True)
        if self.kernel % 2 == 0:
            raise ValueError(f"{owner}.kernel={self.kernel} is not allowed; the smoothing kernel must be odd")
        if self.normalize and (self.order != "before" or self.indicator != "reconstruction"):
            raise ValueError(
                f"{owner}.normalize=True only applies with order='before' and indicator='reconstruction' "
                f"(got order={self.order!r}, indicator={self.indicator!r})"
            )

    @property
    def needs_output_gram(self) -> bool:
        return self.indicator == "reconstruction" and self.use_wo

    def score(self, inputs: LayerInputs, keep: int) -> torch.Tensor:
        attention = scoring.window_attention(
            inputs.queries[..., -self.window :, :], inputs.keys, inputs.scaling, inputs.softcap
        )
        scores = self.indicator_scores(attention, inputs)
        return self.smooth(scores, attention, keep)

    def indicator_scores(self, attention: torch.Tensor, inputs: LayerInputs) -> torch.Tensor:
        """Indicator aggregated over the window: ``[b, h, P]``."""
        past, gram = inputs.length - self.window, self.gram_of(inputs)
        if self.indicator == "reconstruction" and self.order == "before":
            per_query = scoring.reconstruction_before(attention, inputs.values, gram, self.tau, self.normalize)
            return scoring.aggregate(self._raised(per_query), self.temporal, self.alpha)
        if self.temporal == "defensive":  # its floor is a mean over the past tokens: drop the window columns first
            weights = scoring.aggregate(attention[..., :past], self.temporal, self.alpha)
        else:  # aggregate whole rows, then drop the window columns: slicing first would force a copy
            weights = scoring.aggregate(attention, self.temporal, self.alpha)[..., :past]
        if self.indicator == "attention":
            return self._raised(weights)
        if self.indicator == "attention_value":
            return self._raised(weights * scoring.value_norms(inputs.values, inputs.num_heads, past))
        return self._raised(scoring.reconstruction_after(weights, inputs.values, gram, self.tau))

    def gram_of(self, inputs: LayerInputs) -> torch.Tensor | None:
        """The layer's per-head ``W_o`` Gram matrices where the indicator reads them, else None."""
        if not self.needs_output_gram:
            return None
        if inputs.output_gram is None:
            owner = type(self).__name__
            raise ValueError(
                f"{owner}: indicator='reconstruction' with use_wo=True needs the layer's output projection"
            )
        return inputs.output_gram()

    def _raised(self, scores: torch.Tensor) -> torch.Tensor:
        return scores if self.power == 1 else scores.pow(self.power)

    def smooth(self, scores: torch.Tensor, attention: torch.Tensor, keep: int) -> torch.Tensor:
        """Spatial smoothing of ``[b, h, P]`` scores along positions."""
        if self.spatial == "avgpool":
            return spatial.avgpool(scores, self.kernel)
        if self.spatial == "maxpool":
            return spatial.maxpool(scores, self.kernel)
        if self.spatial == "adaptive":
            return spatial.adaptive_smooth(scores, attention, keep - self.window, self.scale, self.kernel)
        return scores
