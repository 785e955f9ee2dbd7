"""Each attention layer's prefill call, for scorers that need more than `LayerInputs` carries.

kvpress scores a layer from the attention module itself (its projections, config, rotary
embedding), the layer's input hidden states, the forward's keyword arguments (rotary position
embeddings) and, with eager attention, the attention weights. Our integration hands a policy the
captured queries, keys and values only, so `LayerCalls` records the rest: while a `LayerCalls` is
open, a process-wide forward hook notes, per thread, the last prefill call of any attention module
(a module with ``o_proj`` and ``layer_idx``, as `restkv.integrate` finds them). Process-wide hooks
run before a module's own hooks, so when the compressor's hook asks a policy to select a layer's
tokens, the call noted is that layer's (`LayerCalls.current` checks the layer and the length).

Only the newest call is held, and a decoding step drops it, so no more than one layer's inputs
outlive their forward. This is a stopgap: it would be one argument of `LayerInputs` if the
integration passed the layer's call along.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook


@dataclass
class LayerCall:
    """One attention layer's prefill forward: the module, its keyword inputs and its output weights."""

    module: nn.Module
    kwargs: dict[str, Any]
    attentions: torch.Tensor | None

    @property
    def hidden_states(self) -> torch.Tensor:
        return self.kwargs["hidden_states"]


CACHE_KEYS = ("past_key_values", "past_key_value", "cache")
"""Forward arguments not recorded: the cache (scorers get its keys and values from the integration)."""

_local = threading.local()
_lock = threading.Lock()
_users = 0
_handle: Any = None


def _is_attention(module: nn.Module) -> bool:
    return hasattr(module, "o_proj") and isinstance(getattr(module, "layer_idx", None), int)


def _record(module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
    if not _is_attention(module):
        return
    hidden = kwargs.get("hidden_states", args[0] if args else None)
    if not torch.is_tensor(hidden) or hidden.shape[1] <= 1:
        _local.call = None  # a decoding step: nothing to score
        return
    weights = output[1] if isinstance(output, tuple) and len(output) > 1 and torch.is_tensor(output[1]) else None
    kept = {k: v for k, v in kwargs.items() if k not in CACHE_KEYS}  # the cache itself is not held
    _local.call = LayerCall(module, {**kept, "hidden_states": hidden}, weights)


class LayerCalls:
    """Reference-counted switch of the recording hook (`open` / `close`), plus the lookup."""

    def __init__(self) -> None:
        self.opened = False

    def open(self) -> None:
        global _users, _handle
        with _lock:
            if not self.opened:
                self.opened = True
                _users += 1
                if _handle is None:
                    _handle = register_module_forward_hook(_record, with_kwargs=True)

    def close(self) -> None:
        global _users, _handle
        with _lock:
            if self.opened:
                self.opened = False
                _users -= 1
                if _users == 0 and _handle is not None:
                    _handle.remove()
                    _handle = None

    @staticmethod
    def current(layer: int, length: int) -> LayerCall:
        """This thread's call of attention layer ``layer`` over ``length`` tokens (the one being evicted)."""
        call: LayerCall | None = getattr(_local, "call", None)
        if call is None or call.module.layer_idx != layer or call.hidden_states.shape[1] != length:
            seen = "none" if call is None else f"layer {call.module.layer_idx}, {call.hidden_states.shape[1]} tokens"
            raise RuntimeError(
                f"no recorded prefill call of attention layer {layer} over {length} tokens (last seen: {seen}); "
                "kvpress scores need the layer's call, recorded while the policy exists, during a prefill from "
                "an empty cache"
            )
        _local.call = None
        return call


def recording() -> bool:
    """Whether the recording hook is installed (some `LayerCalls` is open)."""
    return _handle is not None
