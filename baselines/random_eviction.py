"""Random eviction: the floor any scoring policy must beat."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from restkv.checks import check_number
from restkv.policy import LayerInputs, Policy
from restkv.registry import register_policy


@register_policy("random")
@dataclass
class RandomEviction(Policy):
    """Keeps a uniformly random subset of past tokens (plus the window), reproducibly.

    The draw depends on ``seed`` and the layer index only, so reruns keep the same tokens.
    """

    seed: int = 0

    def validate(self) -> None:
        super().validate()
        check_number(type(self).__name__, "seed", self.seed, low=0, low_open=False, integer=True)

    def score(self, inputs: LayerInputs, keep: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + inputs.layer)
        b, h = inputs.queries.shape[:2]
        scores = torch.rand(b, h, inputs.length - self.window, generator=generator)
        return scores.to(inputs.keys.device)
