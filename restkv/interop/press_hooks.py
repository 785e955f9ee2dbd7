"""kvpress presses that run through kvpress's own hooks around our prefill (``route='kvpress_hooks'``).

Presses that evict per layer from what the prefill computed run through our integration
(`restkv.interop.kvpress_policy`: the cache shrinks, head-wise ones stored variable-length). The
presses listed in `HOOKED` do more than that (extra forwards after the prefill, re-rotated keys,
compression during decoding), so they run as kvpress runs them: around each prefill from an empty
cache that exceeds the budget, the press's own context manager (``with press(model):``) is entered
just before the model's forward and left right after it (KVzip-style presses score and compress
when it is left); a decoding press's stays entered while the prompt decodes, until the next prefill.
The press's ``compression_ratio`` is set per prompt from the budget
(`restkv.interop.compression_ratio`); decoding presses take the budget as their ``target_size``.

Our integration then keeps what the press left (the policy's ``evicts`` is False), and the record
says what was kept: per layer the cache's length, and per head, for presses that evict head-wise,
the length less the pairs kvpress masks (they stay in the cache: kvpress masks head-wise evictions
at attention time rather than shrinking the cache; ``kvpress_cache='masked'`` in the records), and what
drove the press (``kvpress_driven_by``: the budget, or the press's own setting for those of `NOT_BUDGETED`, which
run on every prompt). Presses that need more than a ratio are built in `restkv.interop.press_builds`.

Two presses need their prefill's call adjusted to see what kvpress's pipeline gives them. KVComposePress runs
the prompt a second time over the same cache: our explicit ``position_ids`` (``0..L-1``) are dropped from that
call (the model derives the same ones), so that its second pass takes positions ``L..2L-1`` as in kvpress. Presses
that re-rotate the kept keys (`REROTATING`) leave them at positions ``0..kept-1``: the calls after the prefill
(question, decoding) are moved back by the tokens evicted, so that they continue at ``kept``, as kvpress's pipeline
continues after a re-rotated cache.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch
from torch import nn

from restkv.interop import compression_ratio, press_builds
from restkv.interop.hub_presses import attached, fit_budget
from restkv.interop.press_catalogue import DECODING, HOOKED, HOOKED_WRAPPERS, NOT_BUDGETED, REROTATING, SIZED

__all__ = ["DECODING", "HOOKED", "HOOKED_WRAPPERS", "SIZED", "PressHooks", "press_hooks", "route_summary"]


def hooked_press(policy: Any, model: nn.Module, keep: int, tokens: int) -> Any:
    """The kvpress press ``policy`` names for a prompt of ``tokens`` of which the budget keeps ``keep``: built for
    that ratio (prefill presses), ``keep`` tokens (decoding presses) or their own settings (`press_builds`)."""
    from restkv.interop import require_kvpress
    from restkv.interop.kvpress_policy import SUPPORTED

    if policy.press in press_builds.BUILT_HERE:
        return press_builds.build(policy, model, keep, tokens, SUPPORTED)
    built_press = press_builds.built_press
    kvpress, ratio, target = require_kvpress(), compression_ratio(keep, tokens), keep
    settings = policy.settings()
    own = {k: v for k, v in settings.items() if k in HOOKED[policy.press]}
    if policy.press == "DuoAttentionPress":  # its budget is a share of heads (`hub_presses.fit_budget`)
        return built_press(kvpress, policy.press, own)
    if policy.inner is None:
        return built_press(kvpress, policy.press, own, compression_ratio=ratio)
    rest = {k: v for k, v in settings.items() if k not in own}
    inner = built_press(kvpress, policy.inner, rest, compression_ratio=ratio)
    if policy.press in SIZED:
        return built_press(kvpress, policy.press, own, base_press=inner, target_size=target)
    if policy.press == "CompressionRatioDecodingPress":
        return built_press(kvpress, policy.press, own, base_press=inner, target_compression_ratio=ratio)
    if policy.press == "PrefillDecodingPress":
        return built_press(kvpress, policy.press, own, prefilling_press=inner)
    if policy.press == "LUKVPress":
        return built_press(kvpress, policy.press, own, press=inner, compression_ratio=ratio)
    return built_press(kvpress, policy.press, own, press=inner)


class PressHooks:
    """Enter the policy's press around each prefill of ``model`` that exceeds ``budget`` (see the module)."""

    def __init__(self, model: nn.Module, policy: Any, budget: Any) -> None:
        from restkv.cache import forward_inputs
        from restkv.models import attention_layers

        self.model, self.policy, self.budget = model, policy, budget
        self.layers = attention_layers(model)
        self._signature = inspect.signature(model.forward)
        self._inputs = forward_inputs
        self._stack: contextlib.ExitStack | None = None
        self._length = 0
        self._shift: torch.Tensor | None = None  # positions a re-rotating press moved the prompt's keys back by
        self._hooks: list[Any] = []

    def __enter__(self) -> PressHooks:
        self._hooks.append(self.model.register_forward_pre_hook(self._before, with_kwargs=True))
        self._hooks.append(self.model.register_forward_hook(self._after, always_call=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    @property
    def stays_entered(self) -> bool:
        """Whether the press compresses while decoding too (its context stays entered until the next prefill)."""
        return self.policy.press in DECODING or (self.policy.press == "DMSPress" and bool(self.policy.decoding))

    def _before(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        tokens, cache = self._inputs(self._signature, args, kwargs)
        if tokens is None:
            return None
        if cache is not None and cache.get_seq_length() > 0:
            return self._shifted(args, kwargs)
        if self._stack is not None:  # a decoding press left entered by the previous prompt
            self._stack.close()
            self._stack = None
        if self._shift is not None:
            self._shift.fill_(0)  # in place: a recorded decoding step reads the current prompt's shift
        if tokens < 2:
            return None
        keep = self.budget.tokens(tokens)
        if keep >= tokens and self.policy.press not in NOT_BUDGETED:
            return None
        if self.policy.press in SIZED and self.budget.is_ratio:
            raise ValueError(f"{self.policy.press} keeps a number of tokens (its target_size): give budget as tokens")
        press = hooked_press(self.policy, self.model, min(keep, tokens), tokens)
        self._length = tokens
        self._stack = contextlib.ExitStack()
        with attached(self.policy, self.model):  # kvpress loads a hub press's per-model files here (checked first)
            fit_budget(press, self.model, keep, tokens)
            self._stack.enter_context(press(self.model))
        if self.policy.press == "KVComposePress":
            return args, _without_positions(kwargs, tokens)
        return None

    def _shifted(self, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """A call after a re-rotated prefill, its positions moved back by the tokens evicted (see the module)."""
        positions = kwargs.get("position_ids")
        if self._shift is None or positions is None:
            return None
        return args, {**kwargs, "position_ids": positions - self._shift}

    def _set_shift(self, shift: int, device: torch.device) -> None:
        """Hold the shift in one tensor, changed in place (a recorded decoding step replays with the new value)."""
        if self._shift is None or self._shift.device != device:
            self._shift = torch.zeros((), dtype=torch.long, device=device)
        self._shift.fill_(shift)

    def _after(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self._stack is None or not self._length:
            return
        self._length, length = 0, self._length
        if not self.stays_entered:
            stack, self._stack = self._stack, None
            with torch.no_grad():
                stack.close()  # KVzip-style presses score and compress here
        cache = getattr(output, "past_key_values", None)
        if cache is not None:
            if self.policy.press in REROTATING and self.policy.settings().get("rerotate_keys", True):
                self._set_shift(length - cache.get_seq_length(), cache.layers[0].keys.device)
            self._write_record(cache, length)

    def _write_record(self, cache: Any, length: int) -> None:
        """The compressor's record from what the press left: each layer's length, less what kvpress masks."""
        from restkv.attention import ACTIVE
        from restkv.record import PrefillRecord
        from restkv.storage.layouts import layer_size

        compressor = ACTIVE.get(self.layers[0])
        if compressor is None:
            return
        record = PrefillRecord(prompt_length=length)
        for module, layer in zip(self.layers, cache.layers, strict=False):
            length, heads = layer.keys.shape[2], layer.keys.shape[1]
            masked = getattr(module, "masked_key_indices", None)
            if masked is None:
                record.kept.append(length)
                record.head_lengths.append(None)
            else:
                lengths = (length - torch.bincount(masked[1], minlength=heads)).tolist()
                mean = sum(lengths) / heads
                record.kept.append(int(mean) if mean.is_integer() else round(mean, 2))
                record.head_lengths.append(lengths)
            record.indices.append(None)
            record.sizes.append(layer_size(layer))
        record.notes = {
            "kvpress_route": "kvpress_hooks",
            "kvpress_cache": cache_kind(self.layers),
            "kvpress_driven_by": press_builds.driven_by(self.policy),
        }
        compressor.record = record


def _without_positions(kwargs: dict, tokens: int) -> dict:
    """``kwargs`` less ``position_ids`` where they are ``0..tokens-1`` (what the model derives from an empty cache)."""
    positions = kwargs.get("position_ids")
    if positions is None:
        return kwargs
    if not torch.equal(positions.cpu(), torch.arange(tokens).expand_as(positions)):
        raise ValueError("KVComposePress's prefill must start at position 0 of an empty cache")
    return {k: v for k, v in kwargs.items() if k != "position_ids"}


def cache_kind(layers: list[nn.Module]) -> str:
    """``masked`` where kvpress left head-wise masks (the cache keeps its length), else ``shrunk``."""
    return "masked" if any(getattr(m, "masked_key_indices", None) is not None for m in layers) else "shrunk"


def route_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """For ``metrics.json``: the kvpress route the samples ran and whether the press masked or shrank their cache
    (empty for runs that never took kvpress's hooks)."""
    hooked = [r for r in records if r.get("kvpress_route") == "kvpress_hooks"]
    if not hooked:
        return {}
    driven = sorted({r.get("kvpress_driven_by", "budget") for r in hooked})
    summary = {"kvpress_route": "kvpress_hooks", "kvpress_cache": sorted({r["kvpress_cache"] for r in hooked})}
    return {**summary, "kvpress_driven_by": driven}


def press_hooks(model: nn.Module, policy: Any, budget: Any) -> contextlib.AbstractContextManager:
    """`PressHooks` for a kvpress policy on the hooks route; a no-op context for every other policy."""
    if getattr(policy, "route", None) != "kvpress_hooks":
        return contextlib.nullcontext()
    return PressHooks(model, policy, budget)
