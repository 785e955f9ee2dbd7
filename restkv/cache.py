"""The cache layer a layer's keys and values live in after eviction (or, with a decode reserve,
after a prefill that kept everything), and the cache argument across transformers releases.

`CompressedLayer` behaves like transformers' `DynamicLayer` (decoding appends) with two additions:
- ``repeat``: incoming key/value heads are repeated to the query heads, for ``gqa='expand'``
  where the evicted cache keeps one selection per query head;
- ``reserve``: room for that many decoded tokens is allocated at once, so each step writes one
  slot instead of copying the whole cache (growing by concatenation copies everything every
  step). Past it the buffer grows by another ``reserve`` tokens: one copy per ``reserve`` steps.
  `restkv.integrate.KVCompressor` caps the reserve at `DECODE_RESERVE_CHUNK` tokens, so a long
  generation (InfiniteBench's ``math_calc`` asks for 30,000) does not allocate its whole length
  up front.

The cache argument: transformers before 5.24 call it ``past_key_values`` (models' and attention
modules' ``forward``, outputs' field); 5.24 renamed it ``cache`` and keeps ``past_key_values`` as a
deprecated alias (until 5.40). `cache_keyword` reads a ``forward``'s name for it;
`support_cache_keyword` gives model classes that only know ``past_key_values`` the ``cache=``
keyword, and outputs a ``.cache`` attribute, so that one spelling works on every release. Without
it, ``model(ids, cache=cache)`` on 5.2 lands in ``**kwargs`` unused: the model fills a cache of
its own and the caller's stays empty.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch
import transformers
from torch import nn
from transformers.cache_utils import Cache, DynamicLayer
from transformers.utils import ModelOutput

DECODE_RESERVE_CHUNK = 1024
"""The most decoded tokens a layer preallocates at once (and then grows by): 128 MiB at an 8B model's
128 KiB per token, where a 30,000-token reserve would be 3.66 GiB allocated before the first token."""

CACHE_KEYWORDS = ("cache", "past_key_values")
"""The cache argument's name in models' and attention modules' ``forward``: the newer name first."""


class CompressedLayer(DynamicLayer):
    """A dynamic cache layer seeded with the kept keys/values ``[b, heads, n, d]``."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, repeat: int = 1, reserve: int = 0) -> None:
        super().__init__()
        self.repeat = repeat
        self.dtype, self.device = keys.dtype, keys.device  # as DynamicLayer.lazy_initialization sets them
        self.is_initialized = True
        self._length = keys.shape[2]
        self.growth = reserve
        if reserve > 0:
            self._allocate(keys, values, reserve)
        else:
            self._key_buffer = self._value_buffer = None
            self.keys, self.values = keys, values

    def _allocate(self, keys: torch.Tensor, values: torch.Tensor, spare: int) -> None:
        """Buffers holding ``keys``/``values`` (the layer's whole content) and ``spare`` free slots."""
        shape = (*keys.shape[:2], keys.shape[2] + spare, keys.shape[3])
        key_buffer = keys.new_empty(shape)
        value_buffer = values.new_empty((*shape[:3], values.shape[3]))
        key_buffer[:, :, : keys.shape[2]] = keys
        value_buffer[:, :, : keys.shape[2]] = values
        self._key_buffer, self._value_buffer = key_buffer, value_buffer
        self._length = keys.shape[2]
        self._expose()

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
        if self.growth > 0 and self._length + new > self.capacity:  # full: grow by another reserve
            self._allocate(self.keys, self.values, new + self.growth)
        if self._key_buffer is not None and self._length + new <= self.capacity:
            self._key_buffer[:, :, self._length : self._length + new] = key_states
            self._value_buffer[:, :, self._length : self._length + new] = value_states
            self._length += new
            self._expose()
        else:
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
            self._length = self.keys.shape[2]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a compressed cache layer cannot be cropped (assisted decoding is not supported)")


def cache_keyword(function: Callable[..., Any]) -> str | None:
    """The name under which ``function`` (a ``forward``) takes the cache, or None."""
    parameters = inspect.signature(function).parameters
    return next((name for name in CACHE_KEYWORDS if name in parameters), None)


def passed_cache(module: nn.Module, kwargs: dict[str, Any], keyword: str) -> Any:
    """The cache ``module`` (an attention module) was called with, read as ``keyword``.

    Raises a TypeError if a different cache came under the other name: the caller passed it under
    a name this release does not read, so the model used a cache of its own.
    """
    cache = kwargs.get(keyword)
    for name in CACHE_KEYWORDS:
        unused = kwargs.get(name)
        if name != keyword and isinstance(unused, Cache) and unused is not cache:
            raise TypeError(
                f"the cache passed as {name}= reached {type(module).__name__} unused: on transformers "
                f"{transformers.__version__} it takes the cache as {keyword}=, so the model filled a cache of its "
                f"own and the one passed stays empty. Pass it as {keyword}="
            )
    return cache


def forward_inputs(signature: inspect.Signature, args: tuple, kwargs: dict[str, Any]) -> tuple[int | None, Any]:
    """(new tokens, the cache passed or None) of a call ``forward(*args, **kwargs)`` of a model with ``signature``.

    The token count is None when the arguments do not bind (the forward will say why) or hold no
    ``input_ids`` or ``inputs_embeds``.
    """
    try:
        bound = signature.bind_partial(*args, **kwargs).arguments
    except TypeError:
        return None, None
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            bound = {**bound.pop(parameter.name, {}), **bound}
    cache = next((bound[name] for name in CACHE_KEYWORDS if bound.get(name) is not None), None)
    ids, embeds = bound.get("input_ids"), bound.get("inputs_embeds")
    if torch.is_tensor(ids):
        return ids.shape[-1], cache
    if torch.is_tensor(embeds) and embeds.dim() >= 2:
        return embeds.shape[1], cache
    return None, cache


def _output_cache(output: ModelOutput) -> Any:
    try:
        return output.past_key_values
    except AttributeError:
        raise AttributeError(f"{type(output).__name__} has no cache") from None


def accept_cache_keyword(cls: type) -> bool:
    """Let ``cls.forward`` take the cache as ``cache=`` where it only knows ``past_key_values``.

    The wrapper keeps the signature (``inspect.signature`` follows it to the original, as
    `GenerationMixin` reads it). Returns whether ``cls`` was changed.
    """
    forward = cls.forward
    if getattr(forward, "_restkv_cache_keyword", False) or cache_keyword(forward) != "past_key_values":
        return False

    @functools.wraps(forward)
    def forward_taking_cache(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if "cache" in kwargs:
            cache = kwargs.pop("cache")
            if kwargs.get("past_key_values") is not None:
                raise TypeError(f"{cls.__name__}.forward got both cache= and past_key_values=; pass one of them")
            kwargs["past_key_values"] = cache
        return forward(self, *args, **kwargs)

    forward_taking_cache._restkv_cache_keyword = True
    cls.forward = forward_taking_cache
    return True


BASE_MODELS = {"Gemma3ForCausalLM": "Gemma3TextModel"}
"""Base models not named after their ``*ForCausalLM`` (``Gemma3Model`` is the multimodal one)."""


def support_cache_keyword(model_classes: Iterable[str]) -> None:
    """Give the named ``*ForCausalLM`` classes and their base models ``cache=`` where they only take
    ``past_key_values``, and then outputs a ``.cache`` attribute; a no-op from transformers 5.24 on."""
    changed = False
    for name in model_classes:
        for class_name in (name, BASE_MODELS.get(name, name.replace("ForCausalLM", "Model"))):
            cls = getattr(transformers, class_name, None)
            if cls is not None:
                changed = accept_cache_keyword(cls) or changed
    if changed and not hasattr(ModelOutput, "cache"):
        ModelOutput.cache = property(_output_cache, doc="The output's cache (``past_key_values`` on this release).")
