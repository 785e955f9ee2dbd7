"""TOVA (Oren et al., 2024): keep the tokens the newest query attends to most, averaged over a layer's heads."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from restkv import scoring
from restkv.policy import LayerInputs
from restkv.registry import register_policy
from restkv.scoring_policy import ScoringPolicy


@register_policy("tova")
@dataclass
class TOVA(ScoringPolicy):
    """Attention of the last prompt token only, averaged over the layer's query heads (every head keeps
    the same positions, as TOVA does); the window (default: that last token) is kept."""

    window: int = 1
    indicator: str = "attention"
    temporal: str = "last"
    spatial: str = "none"

    def score(self, inputs: LayerInputs, keep: int) -> torch.Tensor:
        attention = scoring.window_attention(
            inputs.queries[..., -self.window :, :], inputs.keys, inputs.scaling, inputs.softcap
        )
        last = attention[..., -1, : inputs.length - self.window]  # [b, h, P]
        return last.mean(dim=1, keepdim=True).expand_as(last)
