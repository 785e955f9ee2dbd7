"""No silent no-op: a prefill that should evict must have evicted every layer.

A forward from an empty cache, longer than the budget, under a policy that evicts, must leave every attention
layer evicted. Whether it must is read from the forward's own arguments, not from what the eviction hooks saw,
so that hooks that never fire (a transformers release that calls attention or passes the cache differently)
cannot hide it: the compressor then raises with `not_evicted_message` instead of answering with the full cache.
``compressor`` below is a `restkv.integrate.KVCompressor`.
"""

from __future__ import annotations

from typing import Any

import transformers
from transformers.cache_utils import Cache

from restkv.cache import forward_inputs
from restkv.models import SUPPORTED_MODELS, SUPPORTED_TRANSFORMERS


def prefill_to_evict(compressor: Any, args: tuple, kwargs: dict) -> int | None:
    """The prompt length of a forward of the compressor's model that must evict, else None (inactive, a policy
    that keeps everything, unreadable arguments, a decoding step, a question appended after eviction, a prompt
    within the budget)."""
    if not (compressor.active and compressor.policy.evicts):
        return None
    tokens, cache = forward_inputs(compressor._model_forward, args, kwargs)
    appends = cache is not None and (not isinstance(cache, Cache) or cache.get_seq_length() > 0)
    return None if tokens is None or appends or compressor.budget.tokens(tokens) >= tokens else tokens


def not_evicted_message(compressor: Any, prompt: int, evicted: set[int], use_cache: Any) -> str:
    """Why a ``prompt``-token prefill that should have evicted left layers whole (``evicted``: those it did not)."""
    layers = len(compressor.layers)
    if evicted:
        missed = [layer for layer in range(layers) if layer not in evicted]
        what = f"layers {', '.join(map(str, missed))} of {layers} were not evicted (layers {sorted(evicted)} were)"
    else:
        what = f"none of its {layers} attention layers was evicted"
    no_cache = " or the forward ran without a cache (use_cache=False)" if use_cache is False else ""
    budget = compressor.budget
    return (
        f"compress() did not evict a prefill it should have: {type(compressor.model).__name__} on transformers "
        f"{transformers.__version__} prefilled {prompt} tokens from an empty cache under "
        f"{type(compressor.policy).__name__} with budget {budget} ({budget.tokens(prompt)} tokens per layer "
        f"expected), but {what}, so the cache holds the whole prompt and the outputs are not those of eviction. "
        f"The eviction hooks did not see this forward's attention or its cache (restkv captures the queries in "
        f"the attention function registered for {compressor.implementation!r} in transformers' AttentionInterface "
        f"and evicts in a forward hook on each attention module, which must receive the cache as "
        f"{compressor._cache_keyword}=){no_cache}. This transformers release may call attention or pass the cache "
        f"differently: restkv supports transformers{SUPPORTED_TRANSFORMERS} with {', '.join(SUPPORTED_MODELS)}"
    )
