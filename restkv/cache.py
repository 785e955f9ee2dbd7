"""The cache layer a layer's keys and values live in after eviction (or, with a decode reserve,
after a prefill that kept everything).

It behaves like transformers' `DynamicLayer` (decoding appends) with two additions:
- ``repeat``: incoming key/value heads are repeated to the query heads, for ``gqa='expand'``
  where the evicted cache keeps one selection per query head;
- ``reserve``: room for that many decoded tokens is allocated once, so each step writes one
  slot instead of copying the whole cache (growing by concatenation copies everything every
  step). Past the reserve it falls back to concatenation.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


class CompressedLayer(DynamicLayer):
    """A dynamic cache layer seeded with the kept keys/values ``[b, heads, n, d]``."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, repeat: int = 1, reserve: int = 0) -> None:
        super().__init__()
        self.repeat = repeat
        self.device = keys.device
        self.is_initialized = True
        self._length = keys.shape[2]
        if reserve > 0:
            shape = (*keys.shape[:2], self._length + reserve, keys.shape[3])
            self._key_buffer = keys.new_empty(shape)
            self._value_buffer = values.new_empty((*shape[:3], values.shape[3]))
            self._key_buffer[:, :, : self._length] = keys
            self._value_buffer[:, :, : self._length] = values
            self._expose()
        else:
            self._key_buffer = self._value_buffer = None
            self.keys, self.values = keys, values

    @property
    def capacity(self) -> int:
        """Tokens that fit without reallocating (the current length when unbuffered)."""
        return self._length if self._key_buffer is None else self._key_buffer.shape[2]

    def _expose(self) -> None:
        self.keys = self._key_buffer[:, :, : self._length]
        self.values = self._value_buffer[:, :, : self._length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.repeat > 1:
            key_states = key_states.repeat_interleave(self.repeat, dim=1)
            value_states = value_states.repeat_interleave(self.repeat, dim=1)
        new = key_states.shape[2]
        if self._key_buffer is not None and self._length + new <= self.capacity:
            self._key_buffer[:, :, self._length : self._length + new] = key_states
            self._value_buffer[:, :, self._length : self._length + new] = value_states
            self._length += new
            self._expose()
        else:
            self._key_buffer = self._value_buffer = None
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
            self._length = self.keys.shape[2]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a compressed cache layer cannot be cropped (assisted decoding is not supported)")
