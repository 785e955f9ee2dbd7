"""The attention function the integration registers: it captures prefill queries and reads every layout.

transformers' attention modules call the function registered for the model's implementation in
``AttentionInterface`` (eager, sdpa, flash) with the layer's position-encoded queries and the keys
and values its cache layer returned. While a `restkv.integrate.KVCompressor` is active, that
function is `capturing_attention`'s, for every module of every model (one registration per
implementation, counted by users); for modules under a compressor it

1. records the prefill queries the policy needs (``compressor._capture``);
2. adapts the model's mask to a layer whose cache length differs from layer 0's (PyramidKV);
3. computes attention over a head-wise layout: `restkv.storage.varlen.varlen_attention` for a varlen
   layer, the model's own kernel with a per-head mask for a masked one (`restkv.storage.layouts`), and
   `restkv.decoding.static_layers.static_attention` for a static-shape one (a captured decode step's);
4. otherwise calls what would have run without it (a locally registered override, else the
   implementation's function), with ``decode_kernel='gemm'`` decode steps on CPU computed by
   `restkv.decoding.cpu_attention.decode_attention`.

Modules not under a compressor get exactly the function that would have run.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from restkv.decoding.cpu_attention import can_use_decode_attention, decode_attention
from restkv.decoding.static_layers import StaticLayer, static_attention
from restkv.storage.layouts import MaskedLayer, VarlenLayer, layout_of, reader_installed
from restkv.storage.varlen import varlen_attention

ACTIVE: weakref.WeakKeyDictionary[nn.Module, Any] = weakref.WeakKeyDictionary()
"""Attention modules under compression -> their `restkv.integrate.KVCompressor` (which imports this module)."""
_INSTALLED: dict[str, tuple[int, Any, Any]] = {}  # implementation -> (users, previous local entry, ours)


def _original_attention(module: nn.Module, implementation: str) -> Callable[..., Any]:
    if implementation == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS._global_mapping[implementation]


def mask_for_layer(mask: torch.Tensor, kv_length: int, q_length: int) -> torch.Tensor:
    """The attention mask for a layer whose cache length differs from layer 0's.

    The model builds one mask from layer 0's cache; after eviction with a per-layer schedule
    (PyramidKV) the other layers hold fewer or more tokens. Every kept token is visible (batch 1,
    no padding) and the new tokens, the last ``q_length`` columns in every layer, keep the
    model's own mask among themselves.
    """
    if mask.shape[-1] == kv_length:
        return mask
    new = mask[..., -q_length:]
    visible = torch.ones if mask.dtype == torch.bool else torch.zeros
    past = visible((*new.shape[:-1], kv_length - q_length), dtype=mask.dtype, device=mask.device)
    return torch.cat([past, new], dim=-1)


def _masked_call(
    original: Callable[..., Any],
    layer: MaskedLayer,
    implementation: str,
    module: nn.Module,
    query,
    key,
    value,
    args,
    kwargs,
):
    """The model's attention over a masked layer, with the layer's mask in place of the model's."""
    given = args[0] if args and torch.is_tensor(args[0]) else None
    dtype = given.dtype if given is not None else (query.dtype if implementation == "eager" else torch.bool)
    mask = layer.attention_mask(query.shape[2], query.shape[1], dtype)
    rest = args[1:] if args else ()
    kwargs.pop("attention_mask", None)
    return original(module, query, key, value, mask, *rest, **kwargs)


def capturing_attention(implementation: str, previous: Callable[..., Any] | None) -> Callable[..., Any]:
    """The attention function registered for ``implementation`` while compressors are active."""

    def attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args, **kwargs):
        compressor = ACTIVE.get(module)
        original = previous or _original_attention(module, implementation)
        if compressor is None or attention.retired:
            return original(module, query, key, value, *args, **kwargs)
        if query.shape[2] > 1:
            compressor._capture(module, query, kwargs.get("softcap"))
        elif compressor.active and compressor.decoder is not None:  # the decode-time observation window
            compressor.decoder.observe(module.layer_idx, query)
        layout = layout_of(key)
        if isinstance(layout, VarlenLayer):
            return varlen_attention(module, query, layout, compressor.varlen_kernel, **kwargs)
        if isinstance(layout, StaticLayer):
            return static_attention(original, module, query, layout, args, kwargs, implementation)
        if isinstance(layout, MaskedLayer):
            if implementation.startswith("flash"):
                raise NotImplementedError(
                    f"{type(layout).__name__} needs a per-slot mask, which {implementation} does not take; "
                    "use sdpa or eager"
                )
            return _masked_call(original, layout, implementation, module, query, key, value, args, kwargs)
        if args and torch.is_tensor(args[0]) and args[0].dim() == 4:
            args = (mask_for_layer(args[0], key.shape[2], query.shape[2]), *args[1:])
        if compressor.decode_kernel == "gemm" and can_use_decode_attention(module, query, kwargs):
            return decode_attention(module, query, key, value, *args, **kwargs)
        groups = getattr(module, "num_key_value_groups", 1)
        if key.shape[1] == query.shape[1] and groups > 1:  # cache holds per-query-head selections
            module.num_key_value_groups = 1
            try:
                return original(module, query, key, value, *args, **kwargs)
            finally:
                module.num_key_value_groups = groups
        return original(module, query, key, value, *args, **kwargs)

    attention.retired = False  # set by `uninstall` when another library registered over it: a pass-through since
    return attention


def install(implementation: str) -> None:
    """Register `capturing_attention` for ``implementation`` (counted: one registration for all users)."""
    users, previous, ours = _INSTALLED.get(implementation, (0, None, None))
    reader_installed(+1)
    if users == 0:
        previous = ALL_ATTENTION_FUNCTIONS._local_mapping.get(implementation)
        ours = capturing_attention(implementation, previous)
        ALL_ATTENTION_FUNCTIONS[implementation] = ours
    _INSTALLED[implementation] = (users + 1, previous, ours)


def uninstall(implementation: str) -> None:
    """Undo one `install`; the last user restores what was registered before.

    Another library may have registered its own function over ours meanwhile (kvpress patches every attention
    function when it is first imported, which can happen inside a ``compress`` block): its function, which calls
    ours, then stays registered, and ours is retired (it passes every call through from then on), so that neither
    loses the other's work.
    """
    users, previous, ours = _INSTALLED[implementation]
    reader_installed(-1)
    if users > 1:
        _INSTALLED[implementation] = (users - 1, previous, ours)
        return
    del _INSTALLED[implementation]
    if ALL_ATTENTION_FUNCTIONS._local_mapping.get(implementation) is not ours:
        ours.retired = True
    elif previous is None:
        del ALL_ATTENTION_FUNCTIONS[implementation]
    else:
        ALL_ATTENTION_FUNCTIONS[implementation] = previous
