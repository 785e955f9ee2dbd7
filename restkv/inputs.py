"""What a policy sees of one attention layer at the end of prefill: `LayerInputs` (no model objects)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class LayerInputs:
    """What a policy sees of one attention layer at the end of prefill.

    ``queries`` are the last ``window`` queries ``[b, h, w, d]`` (all ``L`` of them for
    policies with ``needs_all_queries``); ``keys``/``values`` are the whole prompt's cache
    ``[b, h_kv, L, d]``, position-encoded. ``output_gram`` lazily gives the per-head
    ``W_o^h^T W_o^h`` matrices ``[h, d, d]`` (None when the layer has no output projection);
    ``output_weight`` lazily gives the output projection's weight ``[hidden, h * d]`` itself.
    ``softcap``: the logit soft-capping the model applies (``tanh(x / c) * c``, Gemma 2), None for none.
    ``fraction``: the budget as the share of the prompt it was given as (``budget=0.3``), None for a token budget:
    for scorers whose authors compute with the ratio itself rather than its rounded token count (DefensiveKV).
    """

    queries: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    layer: int
    num_layers: int
    scaling: float | None = None
    output_gram: Callable[[], torch.Tensor] | None = None
    output_weight: Callable[[], torch.Tensor] | None = None
    softcap: float | None = None
    fraction: float | None = None

    @property
    def num_heads(self) -> int:
        return self.queries.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self.keys.shape[1]

    @property
    def length(self) -> int:
        return self.keys.shape[2]
