"""L2Norm as the ReST-KV authors run it (after Devoto et al., 2024): the tokens of smallest key norm, no window."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from restkv.policy import LayerInputs, Policy
from restkv.registry import register_policy
from restkv.scoring import key_norms
from restkv.select import Budget


@register_policy("l2norm")
@dataclass
class L2Norm(Policy):
    """The ReST-KV authors' L2Norm: each key/value head keeps the ``budget`` tokens of smallest key norm.

    No window is reserved: the last tokens compete like the others (``window`` only bounds the
    budget from below, as for every policy). Nothing is evicted from a prompt no longer than the
    budget. One selection per key/value head (``gqa=expand``: per query head, over repeated keys).
    With a window kept, the same score is `restkv.baselines.knorm.KNorm`.
    """

    allows_allocation: ClassVar[bool] = False  # it selects over the whole prompt, not past tokens plus a window

    def select(self, inputs: LayerInputs, budget: Budget) -> torch.Tensor | None:
        keep = self.layer_keep(inputs.length, budget, inputs.layer, inputs.num_layers)
        if keep >= inputs.length:
            return None
        heads = inputs.num_heads if self.gqa == "expand" else inputs.num_kv_heads
        norms = key_norms(inputs.keys, heads)
        return (-norms).topk(keep, dim=-1).indices.sort(dim=-1).values
