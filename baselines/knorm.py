"""KNorm (Devoto et al., 2024): keep the past tokens whose keys have the smallest L2 norm, plus the window."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from restkv.policy import LayerInputs, Policy
from restkv.registry import register_policy
from restkv.scoring import key_norms


@register_policy("knorm")
@dataclass
class KNorm(Policy):
    """Past tokens ranked by their key's L2 norm, smallest first; the window is kept, as for every policy.

    The ReST-KV authors' variant, which reserves no window, is `restkv.baselines.l2norm.L2Norm`.
    """

    def score(self, inputs: LayerInputs, keep: int) -> torch.Tensor:
        return -key_norms(inputs.keys[:, :, : inputs.length - self.window], inputs.num_heads)
