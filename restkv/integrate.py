"""Evict each layer's cache at the end of prefill: the integration layer's entry point.

The integration layer (this module, `restkv.attention`, `restkv.cache`, `restkv.storage.layouts`) is the
only code that knows transformers. One mechanism serves every supported architecture, with no copy
of any model's forward code:

1. the model's attention function (eager, sdpa or flash) is wrapped through transformers'
   ``AttentionInterface`` (`restkv.attention`) so that, during a prefill, the exact queries the
   layer used (position-encoded, normalised, as the model computed them) are captured, and later
   steps are computed over whatever layout the cache is stored in;
2. a forward hook on each attention module, which runs right after the layer's attention,
   hands the captured queries and the layer's cache to the policy and replaces the layer's
   cache by the kept tokens, stored dense, variable-length (heads keeping different numbers) or
   masked (`restkv.storage.layouts`).

Eviction happens once per prompt, when a forward starts from an empty cache with more than one
token; later forwards (a question appended after eviction, decoding) append to the compressed
cache. Positions stay those of the original prompt: `model.generate` passes explicit position
ids, and our own decoding loops must too.

What cannot be done correctly is refused rather than answered wrongly: a prefill from a second
thread while another thread's prefill is in flight (captured queries and the record are per
compressor, not per call), NaN or inf in a layer's keys or values (every score would be NaN),
and a prefill that should have evicted (a prompt longer than the budget, from an empty cache) but
left a layer unevicted because the hooks did not fire or did not find the cache (a transformers
release that calls attention or passes the cache differently): that raises naming the model
class, the transformers version and what was expected, instead of answering with the full cache.

Supported transformers: `SUPPORTED_TRANSFORMERS`. Releases before 5.24 call the cache argument
``past_key_values``, later ones ``cache``: the hook reads the attention modules' name from their
signature, and importing restkv gives the supported classes ``cache=`` and outputs ``.cache``
where they lack them (`restkv.cache.support_cache_keyword`). On 5.2 ``model(ids, cache=cache)``
was otherwise swallowed by ``**kwargs``: the model filled a cache of its own while the hook read
the caller's empty one and evicted nothing, silently.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch
import transformers
from torch import nn
from transformers.cache_utils import Cache, DynamicLayer

from restkv.arguments import check_compress_arguments
from restkv.attention import ACTIVE, install, uninstall
from restkv.cache import (
    CACHE_KEYWORDS,
    DECODE_RESERVE_CHUNK,
    cache_keyword,
    passed_cache,
    support_cache_keyword,
)
from restkv.checks import check_choice, check_finite_cache
from restkv.chunked_prefill import between_chunks, chunk_running
from restkv.decoding.eviction import DecodeEviction, DecodeEvictor, check_decode_eviction
from restkv.devices import synchronize
from restkv.missed_eviction import not_evicted_message, prefill_to_evict
from restkv.models import SUPPORTED_ATTENTION as SUPPORTED_ATTENTION  # re-exported
from restkv.models import SUPPORTED_MODELS as SUPPORTED_MODELS  # re-exported
from restkv.models import SUPPORTED_TRANSFORMERS as SUPPORTED_TRANSFORMERS  # re-exported
from restkv.models import attention_layers as attention_layers  # re-exported
from restkv.models import check_attention, check_layers
from restkv.policy import LayerInputs, Policy
from restkv.prefill_gate import PrefillGate
from restkv.record import PrefillRecord as PrefillRecord  # re-exported
from restkv.scoring import output_gram
from restkv.scoring_pass import asks_scoring_pass, run_scoring_pass
from restkv.select import Budget
from restkv.stages.allocation import HeadSelection
from restkv.storage.layouts import LAYOUTS, layer_size, store
from restkv.storage.pipeline import check_storage, stored_layer
from restkv.storage.quantize import Quantization, enabled_quantization
from restkv.storage.varlen import VARLEN_KERNELS
from restkv.windows import windowed_layers

DECODE_KERNELS = ("model", "gemm")
"""``model``: decode steps use the model's attention function (bit-identical to running without
compression); ``gemm``: on CPU, `restkv.decoding.cpu_attention.decode_attention` (the same attention, computed as
two GEMMs per key/value head, which reads the cache at memory bandwidth)."""

support_cache_keyword(SUPPORTED_MODELS)


class KVCompressor:
    """Context manager that evicts every layer's cache at the end of prefill.

    >>> with KVCompressor(model, ReSTKV(), budget=128):
    ...     model.generate(input_ids, max_new_tokens=32)

    ``decode_reserve`` preallocates room for that many decoded tokens per layer (see
    `restkv.cache.CompressedLayer`), evicted or not: a layer the policy keeps whole (the full
    cache, or a budget at least the prompt) is moved into a preallocated layer too, so that full
    and compressed caches decode alike. 0 keeps transformers' concatenating layers for unevicted
    layers; `reserve_decode` changes it between prompts. ``decode_kernel`` (see `DECODE_KERNELS`)
    picks the attention of decode steps on CPU. ``timed`` synchronises the device around each
    layer's eviction, so that ``record.eviction_seconds`` is the device time of eviction alone
    (two synchronisations per layer on a GPU: for measurements, not for throughput); untimed,
    ``record.eviction_seconds`` is None (a host clock around queued GPU work would measure nothing).
    ``record`` holds what the last prefill kept and how long its eviction took.

    ``layout`` (see `restkv.storage.layouts.LAYOUTS`) stores what is kept: ``auto`` keeps dense layers when
    every head keeps the same number of tokens and a variable-length layer (memory: the sum of what
    the heads keep) under a head-wise allocation; ``varlen`` uses variable-length layers for every
    evicted layer; ``masked`` keeps the full-length cache and masks evicted positions per head
    (eager and sdpa only). ``varlen_kernel`` (`restkv.storage.varlen.VARLEN_KERNELS`) computes attention
    over variable-length layers. Head-wise layers are read by this compressor's attention function
    only: decode them inside the ``with`` block (outside it they refuse to be updated).

    One prefill at a time: the queries captured between a layer's attention and its eviction, and
    ``record``, belong to the compressor, so a prefill started from a second thread while another
    thread's prefill is in flight raises a RuntimeError instead of mixing the two (threads taking
    turns are fine; decoding steps capture nothing and are never refused). A prefill is in flight
    from its first layer's attention to its last layer's eviction; a forward that raises in between
    releases it, and so do the same thread's next prefill, the owner thread's end, and ``__exit__``.
    Before evicting a layer, its keys and values are checked for NaN and inf (`restkv.checks.check_finite_cache`),
    except under policies that keep everything.
    """

    def __init__(
        self,
        model: nn.Module,
        policy: Policy,
        budget: int | float | Budget,
        decode_reserve: int = 0,
        decode_kernel: str = "model",
        timed: bool = False,
        layout: str = "auto",
        varlen_kernel: str = "auto",
        quantization: Quantization | None = None,
        decode_eviction: DecodeEviction | None = None,
        trace_decode: bool = False,
    ) -> None:
        check_compress_arguments(**{name: value for name, value in locals().items() if name != "self"})
        self.model = model
        self.policy = policy
        self.budget = budget if isinstance(budget, Budget) else Budget(budget)
        policy.check_budget(self.budget)
        self.decode_reserve = 0
        self.reserve_decode(decode_reserve)
        self.timed = timed
        check_choice("compress", "decode_kernel", decode_kernel, DECODE_KERNELS)
        self.decode_kernel = decode_kernel
        check_choice("compress", "layout", layout, LAYOUTS)
        check_choice("compress", "varlen_kernel", varlen_kernel, VARLEN_KERNELS)
        self.layout, self.varlen_kernel = layout, varlen_kernel
        self.layers = attention_layers(model)
        self.windowed = windowed_layers(self.layers, model.config)  # sliding-window layers, left whole
        self._last_evicted = check_layers(model, self.layers, self.windowed, policy)
        self.implementation = check_attention(model.config._attn_implementation, layout, SUPPORTED_ATTENTION)
        self.quantization = enabled_quantization(quantization)
        check_storage(policy, layout, self.quantization, model.config)
        if decode_eviction is not None:
            check_decode_eviction(policy, decode_eviction, layout, self.quantization)
        self.decoder = None if decode_eviction is None else DecodeEvictor(decode_eviction, policy.window, trace_decode)
        self._entered, self._guard = False, self._layout_guard()
        attention = type(self.layers[0])
        self._cache_keyword = cache_keyword(attention.forward)
        if self._cache_keyword is None:
            raise NotImplementedError(
                f"{attention.__name__}.forward takes the cache neither as {' nor as '.join(CACHE_KEYWORDS)} on "
                f"transformers {transformers.__version__}: restkv cannot find the cache it must evict "
                f"(supported: transformers{SUPPORTED_TRANSFORMERS})"
            )
        self._model_forward = inspect.signature(model.base_model.forward)
        self.record, self.active = PrefillRecord(), True
        self._captured: dict[int, tuple[torch.Tensor, int]] = {}
        self._grams: dict[int, torch.Tensor] = {}
        self._pending: list[tuple[Any, ...]] = []  # layers scored, not yet evicted (allocation='global')
        self._hooks: list[Any] = []
        self._gate = PrefillGate(self._captured.clear)  # the thread whose prefill is in flight
        self._forward = threading.local()  # per thread: what its forward in flight must evict, what it evicted

    # -- context management ------------------------------------------------------------------------

    def __enter__(self) -> KVCompressor:
        if self._entered:
            raise RuntimeError("this compressor is already active; nested compression is not supported")
        for module in self.layers:
            if module in ACTIVE:
                raise RuntimeError("this model is already under a KVCompressor; nested compression is not supported")
        install(self.implementation)
        for module in self.layers:
            ACTIVE[module] = self
            self._hooks.append(module.register_forward_hook(self._after_attention, with_kwargs=True))
        # Runs also when the forward raises (an Exception), so that a failed prefill releases the compressor.
        self._hooks.append(self.model.register_forward_hook(self._after_forward, always_call=True))
        # On the module that runs the layers (the model's base model), so that calling it directly is checked too.
        base = self.model.base_model
        self._hooks.append(base.register_forward_pre_hook(self._before_layers, with_kwargs=True))
        self._hooks.append(base.register_forward_hook(self._after_layers, always_call=True))
        self._entered = True
        return self

    def __exit__(self, *exc: object) -> None:
        self._entered = False
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        for module in self.layers:
            ACTIVE.pop(module, None)
        uninstall(self.implementation)
        self._gate.reset()
        self._grams.clear()

    def reserve_decode(self, tokens: int) -> None:
        """Preallocate room for ``tokens`` decoded tokens per layer from the next prefill on."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ValueError(f"decode_reserve={tokens!r} must be an integer >= 0")
        self.decode_reserve = tokens

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Run the model with the full cache inside the ``with`` block (e.g. for a reference pass)."""
        previous, self.active = self.active, False
        try:
            yield
        finally:
            self.active = previous

    # -- the two halves of the mechanism ---------------------------------------------------------------

    def _after_forward(self, module: nn.Module, args: tuple, output: Any) -> None:
        self._gate.end()

    # -- no silent no-op: a prefill that should evict must have evicted every layer (restkv.missed_eviction) --

    def _before_layers(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._forward.prompt = prefill_to_evict(self, args, kwargs)
        self._forward.evicted, self._forward.call = set(), (args, kwargs) if asks_scoring_pass(self.policy) else None
        self._forward.use_cache = kwargs.get("use_cache")

    def _after_layers(self, module: nn.Module, args: tuple, output: Any) -> None:
        prompt, self._forward.prompt, self._forward.call = getattr(self._forward, "prompt", None), None, None
        if prompt is None or output is None:  # nothing to evict, or the forward raised: its error stands
            return
        evicted = self._forward.evicted
        if len(evicted) < len(self.layers):
            raise RuntimeError(not_evicted_message(self, prompt, evicted, self._forward.use_cache))

    def _capture(self, module: nn.Module, query: torch.Tensor, softcap: float | None = None) -> None:
        if not self.active:
            return
        self._gate.begin(module.layer_idx)
        length = query.shape[2]
        kept = query if self.policy.needs_all_queries else query[:, :, -self.policy.query_count :]
        self._captured[module.layer_idx] = (kept, length, softcap)

    def _gram(self, module: nn.Module) -> torch.Tensor:
        layer = module.layer_idx
        if layer not in self._grams:
            with torch.no_grad():
                self._grams[layer] = output_gram(module.o_proj.weight, module.config.num_attention_heads)
        return self._grams[layer]

    def _after_attention(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if not self._gate.owned():
            if self.decoder is not None and self.active and module.layer_idx not in self.windowed:
                with torch.no_grad():
                    self._decode_step(module, kwargs)
            return  # a decoding step, a paused prefill, or another thread's forward: nothing captured here
        try:
            self._evict_layer(module, kwargs)
        except BaseException:
            self._gate.end()
            raise
        if module.layer_idx == len(self.layers) - 1:
            self._gate.end()

    def _decode_step(self, module: nn.Module, kwargs: dict) -> None:
        """After a decoding step's attention: cut the layer when `restkv.decoding.eviction` says it is due."""
        cache = passed_cache(module, kwargs, self._cache_keyword)
        if not isinstance(cache, Cache):
            return
        layer, layer_cache = module.layer_idx, cache.layers[module.layer_idx]
        length = layer_cache.get_seq_length()
        inputs = lambda queries: self._layer_inputs(module, layer_cache, queries, self.decoder.softcaps.get(layer))  # noqa: E731
        selection = self.decoder.step(layer, length, inputs, self.policy)
        if selection is not None:
            keys, values = layer_cache.keys, layer_cache.values
            cache.layers[layer] = store(layer_cache, keys, values, selection, "auto", self.decoder.eviction.interval)
        if layer == self._last_evicted:
            self.decoder.end_step([entry.get_seq_length() for entry in cache.layers])

    def _evict_layer(self, module: nn.Module, kwargs: dict) -> None:
        captured = self._captured.pop(module.layer_idx, None)
        cache = passed_cache(module, kwargs, self._cache_keyword)
        if captured is None or not isinstance(cache, Cache):
            return
        queries, length, softcap = captured
        layer_cache = cache.layers[module.layer_idx]
        fresh = layer_cache.get_seq_length() == length or chunk_running(self)  # or a chunk of a chunked prefill
        if self.decoder is not None:  # the decode-time window starts with the prompt's last queries
            self.decoder.start() if fresh and module.layer_idx == 0 else None
            self.decoder.observe(module.layer_idx, queries, softcap)
        if not fresh:
            return  # not a prefill from an empty cache: tokens appended after eviction
        if module.layer_idx == 0:
            self.record = PrefillRecord(prompt_length=length)
            self._pending = []
        if module.layer_idx in self.windowed and self.policy.evicts:
            self._keep_sliding_layer(module.layer_idx, layer_cache)
            return
        if type(layer_cache) is not DynamicLayer and module.layer_idx not in self.windowed:
            raise NotImplementedError(
                f"eviction supports transformers' DynamicCache layers only; layer {module.layer_idx} uses "
                f"{type(layer_cache).__name__}"
            )
        if queries.shape[0] != 1:
            raise NotImplementedError(f"eviction runs on batch size 1; got batch size {queries.shape[0]}")
        if not self.timed:
            with torch.no_grad():
                self._evict(module, cache, layer_cache, queries, softcap)
            return
        synchronize(queries.device)
        start = time.perf_counter()
        with torch.no_grad():
            self._evict(module, cache, layer_cache, queries, softcap)
        synchronize(queries.device)
        self.record.eviction_seconds = (self.record.eviction_seconds or 0.0) + time.perf_counter() - start

    def _layer_inputs(
        self, module: nn.Module, layer_cache: DynamicLayer, queries: torch.Tensor, softcap: float | None
    ) -> LayerInputs:
        """What the policy sees of ``module``'s layer: ``queries`` and the layer's whole cache."""
        return LayerInputs(
            queries=queries,
            keys=layer_cache.keys,
            values=layer_cache.values,
            layer=module.layer_idx,
            num_layers=len(self.layers),
            scaling=getattr(module, "scaling", None),
            output_gram=(lambda: self._gram(module)) if self.policy.needs_output_gram else None,
            output_weight=lambda: module.o_proj.weight,
            softcap=softcap,
        )

    def _keep_sliding_layer(self, layer: int, layer_cache: DynamicLayer) -> None:
        """Record a sliding-window layer as handled: its cache, which holds its window only, stays as it is."""
        self.record.indices.append(None)
        evicted = getattr(self._forward, "evicted", None)
        if evicted is not None:
            evicted.add(layer)
        self._note(layer_cache, None, layer_cache.keys.shape[2])

    def _evict(
        self, module: nn.Module, cache: Cache, layer_cache: DynamicLayer, queries: torch.Tensor, softcap: float | None
    ) -> None:
        layer = module.layer_idx
        keys, values = layer_cache.keys, layer_cache.values
        if self.policy.evicts:
            check_finite_cache(layer, keys, values)
        inputs = self._layer_inputs(module, layer_cache, queries, softcap)
        if between_chunks(self, cache, inputs):  # cut after a chunk before the prompt's last (restkv.chunked_prefill)
            return
        if self.decoder is not None and not self.decoder.eviction.evicts_prefill:
            self._store(cache, layer_cache, inputs, queries, None)  # phase='decode': the prompt stays whole
            return
        if not (self.policy.stages.allocation.across_layers or asks_scoring_pass(self.policy)):
            self._store(cache, layer_cache, inputs, queries, self.policy.select(inputs, self.budget))
            return
        # one budget for all layers: hold each layer (its cache is still whole) until the last one is scored
        self._pending.append((cache, layer_cache, inputs, queries))
        if layer < self._last_evicted:
            return
        pending, self._pending = run_scoring_pass(self, self._pending), []  # a scoring pass first, if asked
        selections = self.policy.select_layers([entry[2] for entry in pending], self.budget)
        for entry, selection in zip(pending, selections, strict=True):
            self._store(*entry, selection)

    def _store(
        self, cache: Cache, layer_cache: DynamicLayer, inputs: LayerInputs, queries: torch.Tensor, selection: Any
    ) -> None:
        """Replace the layer's cache by what ``selection`` keeps, and record it (a sliding-window layer: as it is)."""
        layer = inputs.layer
        if layer in self.windowed:  # a policy that keeps everything (an observer) was shown it
            self._keep_sliding_layer(layer, layer_cache)
            return
        self.record.indices.append(selection)
        evicted = getattr(self._forward, "evicted", None)
        if evicted is not None:
            evicted.add(layer)
        reserve = 0 if self.quantization else min(self.decode_reserve, DECODE_RESERVE_CHUNK)
        stored, pruned = stored_layer(
            self.policy, inputs, queries, selection, layer_cache, self.layout, reserve, self._guard, self.quantization
        )
        cache.layers[layer] = stored
        self._note(stored, selection, inputs.length, pruned)
        if self.decoder is not None:
            self.decoder.after_prefill(layer, selection, inputs.length, inputs.keys.shape[1], inputs.keys.device)

    def _note(self, stored: DynamicLayer, selection: Any, prompt_length: int, pruned_bytes: int = 0) -> None:
        """Record what a layer kept and what its cache costs."""
        if isinstance(selection, HeadSelection):
            lengths = selection.lengths.tolist()
            mean = sum(lengths) / len(lengths)
            self.record.kept.append(int(mean) if mean.is_integer() else round(mean, 2))
            self.record.head_lengths.append(lengths)
        else:
            self.record.kept.append(prompt_length if selection is None else selection.shape[2])
            self.record.head_lengths.append(None)
        size = layer_size(stored)
        if pruned_bytes:
            size = replace(size, logical_bytes=size.logical_bytes - pruned_bytes, pruned_bytes=pruned_bytes)
        self.record.sizes.append(size)

    def _layout_guard(self):
        """What head-wise layers call before each update: refuse unless this compressor is active."""
        owner = weakref.ref(self)

        def guard() -> None:
            compressor = owner()
            if compressor is None or not compressor._entered:
                raise RuntimeError(
                    "this cache holds head-wise compressed layers (varlen or masked), which only the attention "
                    "function of the compress(...) block that built them can read; a model's own attention would "
                    "attend to other heads' or to evicted tokens. Decode inside that with-block"
                )

        return guard


compress = KVCompressor
"""``with compress(model, policy, budget, ...):`` evicts ``model``'s KV cache inside the block (`KVCompressor`)."""
