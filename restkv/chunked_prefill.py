"""Chunked prefill with eviction between chunks (``compression.prefill_chunk``).

Serving engines prefill a long prompt a few thousand tokens at a time. Under `chunked_prefill` the prompt is run
``chunk`` tokens per forward; after each chunk every layer is cut back to its budget (window included) by the
policy's own scores over what the layer still holds (the tokens kept so far, then the chunk), the chunk's last
``window`` tokens serving as the observation window, and the next chunk attends to that compressed cache. Tokens
keep their original positions. A layer's cache so never holds more than ``keep + piece`` tokens, where a piece is
at most ``chunk + window`` tokens (a last piece no longer than the window joins the one before it, so that the
final window is a whole one): at most ``budget + window + chunk`` tokens per layer, whatever the prompt's length.

What is decided when:

- between chunks (every chunk but the last) a layer keeps ``keep`` tokens per key/value head, stored dense and in
  full precision: the policy's scores, its schedule and its value merging; under a head-wise allocation (AdaKV,
  HeadKV, Layer-DefensiveKV) every head keeps the layer's budget there, so that the working cache stays dense;
- the last chunk is evicted as a one-shot prefill is: the allocation across heads or layers, the layout
  (dense, varlen, masked), ThinK's channel pruning and quantized storage act there, on what the layers hold.

A prompt no longer than one chunk is prefilled in one forward: byte for byte today's one-shot prefill. A
fractional budget is resolved against the whole prompt's length before the first chunk.

Refused by name before any work (`check_chunked_prefill`): policies that read every query of the prompt (H2O's
accumulated attention has no value on a compressed cache), policies that score by a pass over the whole context
after the prefill (KVzip), kvpress presses that run through kvpress's own hooks, decode-time eviction,
``gqa='expand'`` on a grouped-query model (its cache per query head cannot take the next chunk's key/value heads),
and a chunk no longer than the window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from restkv.head_selection import HeadSelection
from restkv.scoring_pass import asks_scoring_pass
from restkv.select import Budget, gather_positions, keep_indices

if TYPE_CHECKING:
    from restkv.inputs import LayerInputs
    from restkv.policy import Policy

T = TypeVar("T")


def check_chunked_prefill(policy: Policy, chunk: int, config: Any = None, decode_eviction: Any = None) -> None:
    """Raise, before any work, for a chunk size or a combination that chunked prefill cannot run (``config``: the
    model's, when known)."""
    owner = type(policy).__name__
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"compression.prefill_chunk={chunk!r} is not allowed; use null (off) or an integer >= 1")
    if policy.evicts and chunk <= policy.window:
        raise ValueError(
            f"compression.prefill_chunk={chunk} is not more than {owner}'s window ({policy.window}): each chunk's last "
            "window tokens are its observation window, so a chunk must be longer than the window"
        )
    if policy.needs_all_queries:
        raise NotImplementedError(
            f"compression.prefill_chunk with {owner}: {owner} scores with every query of the whole prompt "
            "(accumulated attention), which a cache compressed chunk by chunk no longer has; use prefill_chunk=null"
        )
    if asks_scoring_pass(policy):
        raise NotImplementedError(
            f"compression.prefill_chunk with {owner}: {owner} scores by extra forwards over the whole context once "
            "the prefill is done (a scoring pass), which a cache compressed chunk by chunk no longer holds; use "
            "prefill_chunk=null"
        )
    if getattr(policy, "route", None) == "kvpress_hooks":
        raise NotImplementedError(
            f"compression.prefill_chunk with kvpress's {getattr(policy, 'press', owner)}: that press runs through "
            "kvpress's own hooks, which compress at the end of a forward from an empty cache (here the first "
            "chunk's) and know nothing of the chunks after it; use prefill_chunk=null"
        )
    if decode_eviction is not None:
        raise NotImplementedError(
            "compression.prefill_chunk evicts during prefill and cannot be combined with decode-time eviction "
            "(compression.phase=decode|both): use compression.phase=prefill"
        )
    text = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", None)
    if policy.gqa == "expand" and heads is not None and getattr(text, "num_key_value_heads", heads) != heads:
        raise NotImplementedError(
            f"compression.prefill_chunk with {owner}.gqa='expand' on a grouped-query model: the cache would hold "
            "query heads, which the next chunk's key/value heads cannot extend; use gqa='mean' (or 'max')"
        )


def chunk_bounds(length: int, chunk: int, window: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` pieces a ``length``-token prompt is prefilled in: ``chunk`` tokens each, the last
    joined to the one before when it is no longer than ``window`` (each piece ends with a whole window)."""
    pieces = [(start, min(start + chunk, length)) for start in range(0, length, chunk)]
    if len(pieces) > 1 and pieces[-1][1] - pieces[-1][0] <= window:
        pieces[-2:] = [(pieces[-2][0], length)]
    return pieces


@dataclass
class ChunkedPrefill:
    """A compressor's chunked-prefill state: the chunk size, where the prefill is, and each evicted layer's
    tokens as original positions ``[1, heads, held]`` (what its record's indices are mapped back to)."""

    chunk: int
    running: bool = False
    last: bool = False
    start: int = 0
    end: int = 0
    positions: dict[int, torch.Tensor] = field(default_factory=dict)
    handled: set[int] = field(default_factory=set)
    peak_tokens: dict[int, int] = field(default_factory=dict)
    """Per layer, the most tokens it held at an eviction (before cutting) during the last chunked prefill."""


def enable_chunked_prefill(compressor: Any, chunk: int | None) -> None:
    """Prefill ``chunk`` tokens at a time under ``compressor`` from now on (None: one forward per prompt)."""
    if chunk is None:
        compressor.chunked = None
        return
    check_chunked_prefill(compressor.policy, chunk, compressor.model.config, compressor.decoder)
    compressor.chunked = ChunkedPrefill(chunk)


def chunk_running(compressor: Any) -> bool:
    """Whether a chunk of a chunked prefill is in flight (its layers are evicted although the cache was not
    empty before it)."""
    state = getattr(compressor, "chunked", None)
    return state is not None and state.running


def between_chunks(compressor: Any, cache: Any, inputs: LayerInputs) -> bool:
    """Cut a layer after a chunk that is not the prompt's last; False (the integration's one-shot path runs)
    otherwise. The layer's `DynamicLayer` is kept and its tensors replaced by the kept tokens'."""
    state = getattr(compressor, "chunked", None)
    if state is None or not state.running:
        return False
    layer = inputs.layer
    held = state.positions.get(layer)
    state.peak_tokens[layer] = max(state.peak_tokens.get(layer, 0), inputs.length)
    if not state.last:
        heads = inputs.keys.shape[1]
        new = torch.arange(state.start, state.end, device=inputs.keys.device).expand(1, heads, -1)
        held = new if held is None else torch.cat([held, new], dim=2)
        selection = _select_between(compressor.policy, inputs, compressor.budget)
        layer_cache = cache.layers[layer]
        if selection is not None:
            values = compressor.policy.merged_values(inputs, selection)
            layer_cache.keys = gather_positions(inputs.keys, selection)
            layer_cache.values = gather_positions(values, selection)
            held = held.gather(2, selection)
        state.positions[layer] = held
        state.handled.add(layer)
        evicted = getattr(compressor._forward, "evicted", None)
        if evicted is not None:
            evicted.add(layer)
        return True
    if held is not None:  # the last chunk: its tokens' positions follow what the layer held
        new = torch.arange(state.start, state.end, device=held.device).expand(1, held.shape[1], -1)
        state.positions[layer] = torch.cat([held, new], dim=2)
    state.handled.add(layer)
    return False


def _select_between(policy: Policy, inputs: LayerInputs, budget: Budget) -> torch.Tensor | None:
    """What a layer keeps between chunks: the policy's own selection, every head the layer's budget (positions
    ``[1, heads, keep]``, None when it holds no more than that)."""
    allocation = policy.stages.allocation
    if not allocation.headwise and not allocation.across_layers:
        selection = policy.select(inputs, budget)
        if isinstance(selection, HeadSelection):
            raise NotImplementedError(f"{type(policy).__name__} kept a different count per head between chunks")
        return selection
    scored = policy.layer_scores(inputs, budget)
    if scored is None:
        return None
    scores, keep = scored
    return keep_indices(scores, keep, policy.window)


def chunked_prefill(compressor: Any, ids: list[int], forward: Callable[[list[int], int], T], start: int = 0) -> T:
    """Run ``ids`` (from position ``start``) through ``forward(piece, position)`` in chunks under ``compressor``
    (one call when chunking is off, the compressor paused, or the prompt fits one chunk); returns the last
    call's result. Afterwards ``compressor.record`` covers the whole prompt: its prompt length, the eviction
    time summed over chunks (when timed) and the kept tokens as positions in the prompt."""
    state = getattr(compressor, "chunked", None)
    if state is None or not compressor.active or not compressor.policy.evicts:
        return forward(ids, start)
    pieces = chunk_bounds(len(ids), state.chunk, compressor.policy.window)
    if len(pieces) == 1:
        return forward(ids, start)
    budget = compressor.budget
    if budget.is_ratio:
        compressor.budget = Budget(budget.tokens(len(ids)))
    state.positions.clear()
    state.peak_tokens.clear()
    seconds = None
    try:
        for number, (first, end) in enumerate(pieces):
            state.running, state.last, state.start, state.end = True, number == len(pieces) - 1, first, end
            state.handled = set()
            result = forward(ids[first:end], start + first)
            taken = compressor.record.eviction_seconds
            seconds = None if taken is None else (seconds or 0.0) + taken
            _check_handled(compressor, state, first, end)
    finally:
        state.running = state.last = False
        compressor.budget = budget
    record = compressor.record
    record.prompt_length, record.eviction_seconds = len(ids), seconds
    record.indices = [_in_prompt(state.positions.get(n), kept) for n, kept in enumerate(record.indices)]
    return result


def _check_handled(compressor: Any, state: ChunkedPrefill, first: int, end: int) -> None:
    """No silent no-op: every layer that is not a sliding-window one must have been cut after the chunk."""
    missed = [n for n in range(len(compressor.layers)) if n not in state.handled and n not in compressor.windowed]
    if missed:
        raise RuntimeError(
            f"chunked prefill: after the chunk of tokens [{first}, {end}) layers {missed} were not handed to the "
            "policy (the eviction hooks did not see their attention or cache), so their caches were not cut"
        )


def _in_prompt(held: torch.Tensor | None, kept: Any) -> Any:
    """A last-chunk selection (indices into what a layer held) as positions in the prompt."""
    if held is None:
        return kept
    if kept is None:
        return held
    if isinstance(kept, HeadSelection):
        heads = [held[0, head % held.shape[1]][part] for head, part in enumerate(kept.per_head())]
        return HeadSelection.from_heads(heads)
    return held.gather(2, kept) if kept.shape[1] == held.shape[1] else kept
