"""A static-shape cache layer, so that a decode step can be captured once and replayed (CUDA graphs).

Every tensor a decode step touches keeps its shape and address: the keys/values live in buffers of
a fixed ``capacity``, the number of tokens held is a device tensor, each step writes its token at
that index and advances it in place, and attention reads the whole buffer with a mask built from
that tensor (`restkv.attention` applies it, as for the masked layout). No step reads a value back to
the host, so the step's kernels can be recorded once (`torch.cuda.CUDAGraph`) and replayed with one
launch, which takes the host's per-kernel launch time out of the step.

For the efficiency benchmark (``latency.decode_caches=[static]``); `to_static` converts a dense
cache after eviction. Decoding only: a layer refuses a multi-token update.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from restkv.cache import CompressedLayer
from restkv.layouts import register_layout, require_reader


class StaticLayer(DynamicLayer):
    """``keys``/``values`` ``[b, h, n, d]`` in buffers of ``n + spare`` slots; ``length`` counts the filled ones."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, spare: int) -> None:
        super().__init__()
        if spare < 1:
            raise ValueError(f"a static layer needs room for at least one decoded token; got spare={spare}")
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        b, h, n, d = keys.shape
        self.keys = keys.new_zeros((b, h, n + spare, d))
        self.values = values.new_zeros((b, h, n + spare, values.shape[-1]))
        self.keys[:, :, :n], self.values[:, :, :n] = keys, values
        self.length = torch.tensor([n], dtype=torch.long, device=keys.device)
        self._host_length = n  # what eager updates added; replays of a captured step do not advance it
        self._slots = torch.arange(n + spare, device=keys.device)
        register_layout(self.keys, self)

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    @property
    def filled_tokens(self) -> int:
        """Slots filled, as counted on the host (`restkv.layouts.layer_size` reads it)."""
        return self._host_length

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        require_reader()  # a model's own attention would read the free slots unmasked
        if key_states.shape[2] != 1:
            raise NotImplementedError(f"a static layer decodes one token a step; got {key_states.shape[2]}")
        self.keys.index_copy_(2, self.length, key_states)
        self.values.index_copy_(2, self.length, value_states)
        self.length.add_(1)
        self._host_length += 1
        return self.keys, self.values

    def attention_mask(self, query_length: int, query_heads: int, dtype: torch.dtype) -> torch.Tensor:
        """``[1, 1, 1, capacity]``: the filled slots (the new token's included). Boolean for ``torch.bool``,
        else additive in ``dtype``."""
        visible = (self._slots < self.length).view(1, 1, 1, -1)
        if dtype == torch.bool:
            return visible
        return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(
            ~visible, torch.finfo(dtype).min
        )

    def get_seq_length(self, *args: object) -> int:
        """Tokens held, as counted on the host (eager steps); a replayed step does not advance it."""
        return self._host_length

    def get_max_length(self) -> int:
        return self.capacity

    def sync_host_length(self) -> None:
        """Set the host's count from the device's (one read): after replays, which the host does not see."""
        self._host_length = int(self.length)


def to_static(cache: DynamicCache, spare: int) -> DynamicCache:
    """``cache`` with each (dense) layer moved into a `StaticLayer` with ``spare`` free slots."""
    for index, layer in enumerate(cache.layers):
        if type(layer) not in (DynamicLayer, CompressedLayer):
            raise NotImplementedError(
                f"layer {index} is a {type(layer).__name__}; a static layer holds a dense cache "
                "(not a head-wise, quantized or sliding-window one)"
            )
        if getattr(layer, "repeat", 1) > 1:
            raise NotImplementedError(f"layer {index} repeats key/value heads (gqa=expand); not supported statically")
        cache.layers[index] = StaticLayer(layer.keys, layer.values, spare)
    return cache
