"""L2Norm and KNorm (Devoto et al., 2024): keep the tokens whose keys have the smallest L2 norm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from restkv.policy import LayerInputs, Policy
from restkv.registry import register_policy
from restkv.select import Budget


def key_norms(keys: torch.Tensor, heads: int) -> torch.Tensor:
    """L2 norm of every key ``[b, heads, L]`` (float32), key/value heads repeated to ``heads``."""
    norms = keys.float().norm(dim=-1)
    return norms.repeat_interleave(heads // norms.shape[1], dim=1) if norms.shape[1] != heads else norms


@register_policy("knorm")
@dataclass
class KNorm(Policy):
    """Past tokens ranked by their key's L2 norm, smallest first; the window is kept, as for every policy."""

    def score(self, inputs: LayerInputs, keep: int) -> torch.Tensor:
        return -key_norms(inputs.keys[:, :, : inputs.length - self.window], inputs.num_heads)


@register_policy("l2norm")
@dataclass
class L2Norm(Policy):
    """The ReST-KV authors' L2Norm: each key/value head keeps the ``budget`` tokens of smallest key norm.

    No window is reserved: the last tokens compete like the others (``window`` only bounds the
    budget from below, as for every policy). Nothing is evicted from a prompt no longer than the
    budget. One selection per key/value head (``gqa=expand``: per query head, over repeated keys).
    """

    allows_allocation: ClassVar[bool] = False  # it selects over the whole prompt, not past tokens plus a window

    def select(self, inputs: LayerInputs, budget: Budget) -> torch.Tensor | None:
        keep = self.layer_keep(inputs.length, budget, inputs.layer, inputs.num_layers)
        if keep >= inputs.length:
            return None
        heads = inputs.num_heads if self.gqa == "expand" else inputs.num_kv_heads
        norms = key_norms(inputs.keys, heads)
        return (-norms).topk(keep, dim=-1).indices.sort(dim=-1).values
