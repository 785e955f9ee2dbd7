"""Greedy answering of one prompt under a KV compressor, timed, for both evaluation protocols."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from eval.prompting import PromptTokens
from restkv.integrate import KVCompressor

PROTOCOLS = ("query_aware", "query_agnostic")


@dataclass
class Answer:
    tokens: list[int]
    prefill_seconds: float
    decode_seconds: float
    kept_tokens: float
    """Mean over layers of the prompt tokens kept after eviction."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _forward(model: PreTrainedModel, ids: list[int], cache: DynamicCache, start: int) -> torch.Tensor:
    device = model.device
    input_ids = torch.tensor([ids], device=device)
    positions = torch.arange(start, start + len(ids), device=device)[None]
    out = model(input_ids=input_ids, cache=cache, position_ids=positions, use_cache=True, logits_to_keep=1)
    return out.logits[0, -1]


@torch.no_grad()
def answer(
    model: PreTrainedModel,
    prompt: PromptTokens,
    compressor: KVCompressor,
    protocol: str,
    max_new_tokens: int,
    eos_ids: set[int],
) -> Answer:
    """Prefill (evicting at its end), then greedy decoding until EOS or ``max_new_tokens``.

    ``query_aware`` prefills context and query together, so the observation window sees the
    question; ``query_agnostic`` prefills (and compresses) the context alone and appends the
    query to the compressed cache.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol {protocol!r} is not allowed; choose one of: {', '.join(PROTOCOLS)}")
    device = model.device
    cache = DynamicCache(config=model.config)
    compressor.decode_reserve = max_new_tokens
    _sync(device)
    start = time.perf_counter()
    if protocol == "query_aware":
        logits = _forward(model, prompt.context + prompt.query, cache, 0)
    else:
        logits = _forward(model, prompt.context, cache, 0)
        if prompt.query:
            logits = _forward(model, prompt.query, cache, len(prompt.context))
    _sync(device)
    prefill = time.perf_counter() - start
    kept = compressor.record.kept
    kept_tokens = sum(kept) / len(kept) if kept else float(prompt.length)

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
    _sync(device)
    return Answer(tokens, prefill, time.perf_counter() - start, kept_tokens)
