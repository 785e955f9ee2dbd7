"""Scoring passes: extra forwards a policy asks for after the prefill and before eviction.

Most policies score the prompt from what the prefill itself computed (its queries, keys and values).
Some score it by running the model further: KVzip (`restkv.baselines.kvzip`) feeds a repeat prompt
followed by the context and ranks each cached pair by the attention the reconstruction pays it.
This module is the one seam through which such a policy does it, so the next method of the kind
needs no change to the integration:

1. a policy that subclasses `ScoringPassPolicy` is held, layer by layer, like a policy whose
   allocation spans layers: nothing is evicted until the last layer of the prefill has run;
2. at that point `run_scoring_pass` asks the policy for its chunks (`ScoringPassPolicy.scoring_chunks`:
   token ids to feed after the prompt, each naming the prompt positions it scores), feeds each one
   through the model's base model over a *copy* of the cache (the copy's layers share the prompt's
   keys and values; what a chunk appends is dropped after each layer, so the prompt's cache is
   never changed and the chunks are independent, each placed right after the prompt), and hands
   each layer's queries and keys to the policy (`ScoringPassPolicy.observe`);
3. the policy then selects every layer at once (``select_layers``) and the integration stores the
   kept tokens as for any other policy (dense, variable-length or masked).

Importing this module (a policy does) loads no model stack; the pass imports the integration's parts.
The pass is counted in the prefill's record: ``scoring_forwards`` (forwards run), ``scoring_tokens``
(tokens fed) and ``scoring_seconds`` (their time, the device synchronised around the pass; inside
``eviction_seconds`` when the compressor is timed).
"""

from __future__ import annotations

import copy
import inspect
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from restkv.policy import Policy

KVCompressor = Any
"""`restkv.integrate.KVCompressor` (not imported: the integration imports this module)."""


@dataclass(frozen=True)
class ScoringChunk:
    """One forward of a scoring pass: ``ids`` ``[1, n]`` fed right after the prompt, scoring prompt positions
    ``start`` to ``end`` (end excluded)."""

    ids: torch.Tensor
    start: int
    end: int


@dataclass(frozen=True)
class ScoringContext:
    """What a policy may read to build its chunks: the prompt's ids ``[1, L]`` and the model's tokenizer."""

    prompt_ids: torch.Tensor
    name_or_path: str

    def tokenizer(self) -> Any:
        """The model's tokenizer (``AutoTokenizer`` from the model's ``name_or_path``), loaded once per path."""
        return _tokenizer(self.name_or_path)


@dataclass(frozen=True)
class ScoringLayer:
    """One layer's view of one chunk: the chunk's ``queries`` ``[1, h, n, d]`` (as the model's attention got them,
    position-encoded) and the layer's ``keys`` ``[1, h_kv, L + n, d]`` (the prompt's, then the chunk's own)."""

    layer: int
    queries: torch.Tensor
    keys: torch.Tensor
    prompt_length: int
    chunk: ScoringChunk


class ScoringPassPolicy(Policy):
    """A policy that scores the prompt by extra forwards after the prefill (see the module's docstring).

    Subclasses implement `scoring_chunks`, `observe` and ``select_layers`` (every layer's selection from what
    `observe` saw); `select` is never called for them.
    """

    def scoring_chunks(self, context: ScoringContext) -> list[ScoringChunk]:
        raise NotImplementedError(f"{type(self).__name__} does not implement scoring_chunks()")

    def observe(self, seen: ScoringLayer) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not implement observe()")


_TOKENIZERS: dict[str, Any] = {}


def _tokenizer(name_or_path: str) -> Any:
    if not name_or_path:
        raise ValueError(
            "the scoring pass needs the model's tokenizer, but model.config.name_or_path is empty: load the model "
            "with from_pretrained (a path or hub name that holds its tokenizer)"
        )
    if name_or_path not in _TOKENIZERS:
        from transformers import AutoTokenizer

        _TOKENIZERS[name_or_path] = AutoTokenizer.from_pretrained(name_or_path)
    return _TOKENIZERS[name_or_path]


def asks_scoring_pass(policy: Policy) -> bool:
    """Whether ``policy`` scores by extra forwards (its layers are then held until the pass has run)."""
    return isinstance(policy, ScoringPassPolicy)


class _QueryTap:
    """Stands in for the compressor in `restkv.attention.ACTIVE` during a pass: keeps each layer's queries and
    lets the model's own attention run over the (dense, whole) cache copy."""

    active = True
    decoder = None
    decode_kernel = "model"

    def __init__(self, varlen_kernel: str) -> None:
        self.varlen_kernel = varlen_kernel
        self.queries: dict[int, torch.Tensor] = {}

    def _capture(self, module: nn.Module, query: torch.Tensor, softcap: float | None = None) -> None:
        self.queries[module.layer_idx] = query


def prompt_ids(compressor: KVCompressor) -> torch.Tensor:
    """The token ids of the prefill in flight (kept by the compressor's pre-hook), refused where there are none."""
    call = getattr(compressor._forward, "call", None)
    bound: dict[str, Any] = {}
    if call is not None:
        bound = compressor._model_forward.bind_partial(*call[0], **call[1]).arguments
        for parameter in compressor._model_forward.parameters.values():
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                bound = {**bound.pop(parameter.name, {}), **bound}
    ids = bound.get("input_ids")
    if not torch.is_tensor(ids):
        raise NotImplementedError(
            f"{type(compressor.policy).__name__} builds its scoring pass from the prompt's token ids, and this "
            "prefill gave none (inputs_embeds only): pass input_ids"
        )
    return ids


def _cache_copy(cache: Any) -> Any:
    """A cache whose layers share ``cache``'s tensors: appending to it leaves ``cache`` as it is."""
    duplicate = copy.copy(cache)
    duplicate.layers = [copy.copy(layer) for layer in cache.layers]
    return duplicate


def run_scoring_pass(compressor: KVCompressor, pending: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Run the policy's scoring pass over the prefill's cache, if it asks for one; return ``pending`` as it was.

    Called by the integration once every layer of the prefill is held (``pending``: (cache, layer cache, inputs,
    queries) per layer), before any is selected.
    """
    from restkv.devices import synchronize  # the model stack, imported where a pass runs (not by the policy)

    policy = compressor.policy
    if not asks_scoring_pass(policy) or not pending:
        return pending
    if compressor.windowed:
        raise NotImplementedError(
            f"{type(policy).__name__}'s scoring pass runs over every layer's whole prompt, and this model has "
            f"sliding-window layers ({sorted(compressor.windowed)}) that hold their window only"
        )
    cache, length = pending[0][0], pending[0][2].length
    ids = prompt_ids(compressor)
    chunks = policy.scoring_chunks(ScoringContext(ids, getattr(compressor.model.config, "name_or_path", "")))
    device = pending[0][1].keys.device
    synchronize(device)
    start = time.perf_counter()
    _feed(compressor, cache, length, chunks)
    synchronize(device)
    record = compressor.record
    record.scoring_forwards = len(chunks)
    record.scoring_tokens = sum(chunk.ids.shape[1] for chunk in chunks)
    record.scoring_seconds = time.perf_counter() - start
    return pending


def _feed(compressor: KVCompressor, cache: Any, length: int, chunks: list[ScoringChunk]) -> None:
    """Each chunk through the base model over a copy of ``cache``, every layer's view handed to the policy."""
    from restkv.attention import ACTIVE
    from restkv.cache import CACHE_KEYWORDS, passed_cache

    base = compressor.model.base_model
    keyword = next(name for name in CACHE_KEYWORDS if name in compressor._model_forward.parameters)
    tap = _QueryTap(compressor.varlen_kernel)
    current: dict[str, Any] = {}

    def after_attention(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        layer = module.layer_idx
        seen = passed_cache(module, kwargs, compressor._cache_keyword)
        queries = tap.queries.pop(layer, None)
        if queries is None or seen is None:
            raise RuntimeError(f"the scoring pass saw no queries or no cache at layer {layer}")
        view = seen.layers[layer]
        compressor.policy.observe(ScoringLayer(layer, queries, view.keys, length, current["chunk"]))
        view.__dict__.update(current["originals"][layer])  # drop what the chunk appended

    saved_state = dict(vars(compressor._forward))
    saved_active = {module: ACTIVE.get(module) for module in compressor.layers}
    hooks = [module.register_forward_hook(after_attention, with_kwargs=True) for module in compressor.layers]
    previous, compressor.active = compressor.active, False
    try:
        for module in compressor.layers:
            ACTIVE[module] = tap
        for chunk in chunks:
            duplicate = _cache_copy(cache)
            current["chunk"] = chunk
            current["originals"] = [dict(vars(layer)) for layer in duplicate.layers]
            ids = chunk.ids.to(device=compressor.layers[0].o_proj.weight.device)
            positions = torch.arange(length, length + ids.shape[1], device=ids.device)[None]
            base(input_ids=ids, position_ids=positions, use_cache=True, **{keyword: duplicate})
    finally:
        compressor.active = previous
        for hook in hooks:
            hook.remove()
        for module, owner in saved_active.items():
            if owner is None:
                ACTIVE.pop(module, None)
            else:
                ACTIVE[module] = owner
        vars(compressor._forward).clear()
        vars(compressor._forward).update(saved_state)


__all__ = [
    "ScoringChunk",
    "ScoringContext",
    "ScoringLayer",
    "ScoringPassPolicy",
    "asks_scoring_pass",
    "run_scoring_pass",
]
