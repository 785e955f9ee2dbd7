"""Greedy answering and teacher forcing of one prompt under a KV compressor, for both protocols."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from eval.prompting import PromptTokens
from restkv.devices import synchronize
from restkv.integrate import KVCompressor

PROTOCOLS = ("query_aware", "query_agnostic")


@dataclass
class Answer:
    tokens: list[int]
    prefill_seconds: float
    decode_seconds: float
    kept_tokens: float
    """Mean over layers of the prompt tokens kept after eviction."""


def _forward(model: PreTrainedModel, ids: list[int], cache: DynamicCache, start: int, last_only: bool = True):
    device = model.device
    input_ids = torch.tensor([ids], device=device)
    positions = torch.arange(start, start + len(ids), device=device)[None]
    out = model(input_ids=input_ids, cache=cache, position_ids=positions, use_cache=True, logits_to_keep=int(last_only))
    return out.logits[0, -1] if last_only else out.logits[0]


def prefill(
    model: PreTrainedModel, prompt: PromptTokens, protocol: str, compressor: KVCompressor
) -> tuple[DynamicCache, torch.Tensor, float]:
    """Run the prompt into a fresh cache (evicting at the end of the compressed part).

    ``query_aware`` prefills context and query together, so the observation window sees the
    question; ``query_agnostic`` prefills (and compresses) the context alone and appends the
    query to the compressed cache. Returns the cache, the last position's logits and the mean
    number of prompt tokens kept per layer.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol {protocol!r} is not allowed; choose one of: {', '.join(PROTOCOLS)}")
    cache = DynamicCache(config=model.config)
    if protocol == "query_aware":
        logits = _forward(model, prompt.context + prompt.query, cache, 0)
    else:
        logits = _forward(model, prompt.context, cache, 0)
        if prompt.query:
            logits = _forward(model, prompt.query, cache, len(prompt.context))
    kept = compressor.record.kept if compressor.active else []
    return cache, logits, (sum(kept) / len(kept) if kept else float(prompt.length))


@torch.no_grad()
def answer(
    model: PreTrainedModel,
    prompt: PromptTokens,
    compressor: KVCompressor,
    protocol: str,
    max_new_tokens: int,
    eos_ids: set[int],
) -> Answer:
    """Prefill (evicting at its end), then greedy decoding until EOS or ``max_new_tokens``."""
    device = model.device
    compressor.reserve_decode(max_new_tokens)
    synchronize(device)
    start = time.perf_counter()
    cache, logits, kept_tokens = prefill(model, prompt, protocol, compressor)
    synchronize(device)
    prefill_seconds = time.perf_counter() - start

    tokens: list[int] = []
    position = prompt.length
    start = time.perf_counter()
    for step in range(max_new_tokens):
        token = int(logits.argmax())
        if token in eos_ids:
            break
        tokens.append(token)
        if step + 1 < max_new_tokens:
            logits = _forward(model, [token], cache, position)
            position += 1
    synchronize(device)
    return Answer(tokens, prefill_seconds, time.perf_counter() - start, kept_tokens)


@torch.no_grad()
def teacher_forced_logprobs(
    model: PreTrainedModel,
    prompt: PromptTokens,
    compressor: KVCompressor,
    protocol: str,
    continuations: list[list[int]],
) -> list[torch.Tensor]:
    """For each continuation, log-probabilities ``[len, vocab]`` (float32) of its tokens' positions.

    Row ``t`` is the model's distribution for ``continuation[t]`` given the prompt and
    ``continuation[:t]``. The prompt is prefilled (and evicted) once; each continuation is fed
    in one forward on its own copy of the cache.
    """
    if any(not tokens for tokens in continuations):
        raise ValueError("teacher forcing needs at least one token per continuation")
    compressor.reserve_decode(max(len(tokens) for tokens in continuations))
    cache, last, _ = prefill(model, prompt, protocol, compressor)
    results = []
    for index, tokens in enumerate(continuations):
        rows = [last[None]]
        if len(tokens) > 1:
            own = cache if index == len(continuations) - 1 else copy.deepcopy(cache)
            rows.append(_forward(model, tokens[:-1], own, prompt.length, last_only=False))
        results.append(torch.cat(rows).float().log_softmax(-1))
    return results
