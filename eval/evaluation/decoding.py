"""Greedy answering and teacher forcing of one prompt under a KV compressor, for both protocols."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from restkv.choices import PROTOCOLS as PROTOCOLS  # re-exported
from restkv.chunked_prefill import chunked_prefill
from restkv.decoding import static_decoder
from restkv.decoding.static_decoder import (
    DECODE_PATHS,
    STEPS_STEP,
    decode_static,
    forget,
    round_up,
    signature,
    static_form,
)
from restkv.devices import model_devices, synchronize
from restkv.eval.evaluation.prompting import PromptTokens
from restkv.fastpath import CHECKS
from restkv.integrate import KVCompressor
from restkv.interop.press_builds import question_in_prefill

STOP_CHECK_STEPS = {"cpu": 1}
"""Decode steps between two host reads of the "has an EOS come?" flag, per device type (default
`DEFAULT_STOP_CHECK_STEPS`). Reading it waits for the device; on a GPU that wait every step would
put the host's launch time on every step, so up to that many steps past an EOS may run (and are
counted in ``decode_steps``); the answer is cut at the first EOS either way."""
DEFAULT_STOP_CHECK_STEPS = 16


@dataclass
class Answer:
    tokens: list[int]
    prefill_seconds: float
    decode_seconds: float
    kept_tokens: float
    """Mean over layers of the prompt tokens kept after eviction."""
    decode_steps: int = 0
    """Decode forwards run (``decode_seconds`` is their time): one per answer token after the first
    (the prefill gives the first), plus those run past an EOS before the host looked (`STOP_CHECK_STEPS`)."""
    decode_path: str = "eager"
    """How the tokens were decoded (`restkv.choices.DECODE_PATHS`): ``eager``, ``static`` or ``graph``."""


def check_decode(decode: str, device: torch.device) -> None:
    """Refuse, before any work, a decode path that cannot run here (naming the setting)."""
    if decode not in DECODE_PATHS:
        raise ValueError(f"decode={decode!r} is not allowed; choose one of: {', '.join(DECODE_PATHS)}")
    if decode == "graph" and device.type not in static_decoder.RECORDING_DEVICES:
        raise ValueError(
            f"decode=graph records the decode step as a CUDA graph; this run's device is {device.type!r}: run on a "
            "GPU (device=cuda), or use decode=static (the same step, run eagerly) or decode=auto"
        )


def _path(decode: str, cache: DynamicCache, device: torch.device) -> tuple[str, list | None]:
    """The path that decodes ``cache`` for the setting ``decode`` and the cache's static form (None for eager).

    ``auto`` records on CUDA where every layer has a static form, else decodes eagerly; ``static`` and
    ``graph`` refuse a cache without one (quantized layers), naming the way out."""
    if decode == "eager" or (decode == "auto" and device.type not in static_decoder.RECORDING_DEVICES):
        return "eager", None
    try:
        contents = static_form(cache)
    except NotImplementedError as error:
        if decode == "auto":
            return "eager", None
        raise NotImplementedError(f"decode={decode}: {error} (decode=auto or eager decodes it)") from None
    return ("graph" if decode in ("auto", "graph") else "static"), contents


def forward_tokens(model: PreTrainedModel, ids: list[int], cache: DynamicCache, start: int, last_only: bool = True):
    """Run token ``ids`` at positions ``start...`` into ``cache``: the last position's logits (all with ``last_only``
    False)."""
    device = model.device
    input_ids = torch.tensor([ids], device=device)
    positions = torch.arange(start, start + len(ids), device=device)[None]
    return _forward_tensors(model, input_ids, cache, positions, last_only)


def _forward_tensors(
    model: PreTrainedModel, input_ids: torch.Tensor, cache: DynamicCache, positions: torch.Tensor, last_only: bool
) -> torch.Tensor:
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
    run = lambda ids, start: forward_tokens(model, ids, cache, start)  # noqa: E731
    if protocol == "query_aware":  # under compression.prefill_chunk, in chunks: the question ends the last one
        with question_in_prefill(len(prompt.query)):  # a press whose window is the question reads its length
            logits = chunked_prefill(compressor, prompt.context + prompt.query, run)
    else:
        logits = chunked_prefill(compressor, prompt.context, run)
        if prompt.query:
            logits = forward_tokens(model, prompt.query, cache, len(prompt.context))
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
    decode: str = "eager",
) -> Answer:
    """Prefill (evicting at its end), then greedy decoding until EOS or ``max_new_tokens``.

    Decoding keeps its tokens and positions on the model's device and reads the stop flag every
    `STOP_CHECK_STEPS` steps; every device the model uses is synchronised around each timer. ``decode``
    (`restkv.choices.DECODE_PATHS`) picks the model's own loop or the static step (recorded on CUDA); every path
    gives the eager loop's tokens.
    """
    devices = model_devices(model)
    cache, logits, kept_tokens, prefill_seconds = timed_prefill(model, prompt, protocol, compressor, max_new_tokens)
    start = time.perf_counter()
    path, contents = _path(decode, cache, logits.device)
    if contents is None:
        generated, forwards = greedy(model, cache, logits, prompt.length, max_new_tokens, eos_ids)
    elif decode == "auto":
        path, generated, forwards = _checked(model, cache, contents, logits, prompt.length, max_new_tokens, eos_ids)
    else:
        every = STOP_CHECK_STEPS.get(logits.device.type, DEFAULT_STOP_CHECK_STEPS)
        decoded = decode_static(
            model, contents, logits, prompt.length, max_new_tokens, eos_ids, every, record=path == "graph"
        )
        generated, forwards = decoded.tokens, decoded.forwards
    synchronize(*devices)
    seconds = time.perf_counter() - start
    return Answer(cut_at_eos(generated.tolist(), eos_ids), prefill_seconds, seconds, kept_tokens, forwards, path)


def decode_check_key(model: PreTrainedModel, contents: list, max_new: int, eos_ids: set[int], rows: Any) -> tuple:
    """The signature a recorded decoder is checked under (`restkv.fastpath`): its shapes and its rows setting."""
    return ("decode", *signature(model, contents, round_up(max_new, STEPS_STEP), sorted(eos_ids) or [-1]), rows)


TIE_MARGIN = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
"""A greedy choice whose `relative_margin` is at most this (per the logits' dtype) is a near tie: two correct
kernels may round it either way, so answers that first part there are not a disagreement."""


def relative_margin(logits: torch.Tensor) -> torch.Tensor:
    """How clearly greedy picks its token: (top logit - runner-up) / max(|top logit|, 1), on the device."""
    top = logits.float().topk(2).values
    return (top[0] - top[1]) / top[0].abs().clamp_min(1.0)


def token_disagreement(fast: list[int], eager: list[int], margins: list[float] | None = None, tie=0.0) -> str | None:
    """Where a fast path's answer (cut at EOS) leaves the eager loop's, None where they are equal or first part at
    a near tie of the eager loop (``margins[i] <= tie``: rounding may pick either token)."""
    if fast == eager:
        return None
    at = next((i for i, (a, b) in enumerate(zip(fast, eager, strict=False)) if a != b), min(len(fast), len(eager)))
    if margins is not None and at < len(margins) and margins[at] <= tie:
        return None
    return f"tokens differ from the eager loop's from answer token {at} on ({len(fast)} vs {len(eager)} tokens)"


def _checked(
    model: PreTrainedModel,
    cache: DynamicCache,
    contents: list,
    logits: torch.Tensor,
    position: int,
    max_new_tokens: int,
    eos_ids: set[int],
) -> tuple[str, torch.Tensor, int]:
    """``decode=auto``'s recorded step, checked against the eager loop on the first prompt of each decoder
    signature (`restkv.fastpath`): (path that answered, tokens, forwards). The recording runs first (it copies the
    cache into its buffers), then the eager loop on the cache itself."""
    every = STOP_CHECK_STEPS.get(logits.device.type, DEFAULT_STOP_CHECK_STEPS)
    key = decode_check_key(model, contents, max_new_tokens, eos_ids, 1)

    def fast() -> tuple[torch.Tensor, int]:
        try:
            decoded = decode_static(model, contents, logits, position, max_new_tokens, eos_ids, every, record=True)
        except Exception:
            forget(model, contents, max_new_tokens, eos_ids)
            raise
        return decoded.tokens, decoded.forwards

    margins = torch.ones(max_new_tokens, dtype=torch.float32, device=logits.device)

    def eager() -> tuple[torch.Tensor, int]:
        return greedy(model, cache, logits, position, max_new_tokens, eos_ids, margins)

    def differ(a: tuple[torch.Tensor, int], b: tuple[torch.Tensor, int]) -> str | None:
        fast, slow = cut_at_eos(a[0].tolist(), eos_ids), cut_at_eos(b[0].tolist(), eos_ids)
        return token_disagreement(fast, slow, margins.tolist(), TIE_MARGIN.get(logits.dtype, 0.0))

    generated, forwards = CHECKS.run(key, ("decode", "graph", "eager"), fast, eager, differ)
    verdict = CHECKS.verdict(key)
    if verdict is not None and not verdict.ok:
        forget(model, contents, max_new_tokens, eos_ids)
        return "eager", generated, forwards
    return "graph", generated, forwards


def timed_prefill(
    model: PreTrainedModel, prompt: PromptTokens, protocol: str, compressor: KVCompressor, max_new_tokens: int
) -> tuple[DynamicCache, torch.Tensor, float, float]:
    """`prefill` with room reserved for the answer, timed with every device synchronised: (cache, last logits,
    tokens kept, seconds)."""
    devices = model_devices(model)
    compressor.reserve_decode(max_new_tokens)
    synchronize(*devices)
    start = time.perf_counter()
    cache, logits, kept_tokens = prefill(model, prompt, protocol, compressor)
    synchronize(*devices)
    return cache, logits, kept_tokens, time.perf_counter() - start


def cut_at_eos(tokens: list[int], eos_ids: set[int]) -> list[int]:
    """The answer: ``tokens`` up to (without) the first EOS."""
    ends = [index for index, token in enumerate(tokens) if token in eos_ids]
    return tokens[: ends[0]] if ends else tokens


def greedy(
    model: PreTrainedModel,
    cache: DynamicCache,
    logits: torch.Tensor,
    position: int,
    max_new_tokens: int,
    eos_ids: set[int],
    margins: torch.Tensor | None = None,
) -> tuple[torch.Tensor, int]:
    """Greedy tokens from ``logits`` on (EOS included, possibly followed by a few more) and the forwards run;
    ``margins`` (float32, one per token), when given, receives each token's `relative_margin`."""
    device = logits.device
    every = STOP_CHECK_STEPS.get(device.type, DEFAULT_STOP_CHECK_STEPS)
    eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device)
    generated = torch.empty(max_new_tokens, dtype=torch.long, device=device)
    positions = torch.arange(position, position + max_new_tokens, device=model.device)
    ended = torch.zeros((), dtype=torch.bool, device=device)
    forwards = 0
    for step in range(max_new_tokens):
        token = logits.argmax()
        generated[step] = token
        if margins is not None:
            margins[step] = relative_margin(logits)
        ended |= torch.isin(token, eos)
        if ((step + 1) % every == 0 or step + 1 == max_new_tokens) and bool(ended):
            return generated[: step + 1], forwards
        if step + 1 < max_new_tokens:
            input_ids = token.view(1, 1).to(model.device)
            logits = _forward_tensors(model, input_ids, cache, positions[step : step + 1].view(1, 1), True)
            forwards += 1
    return generated, forwards


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
            rows.append(forward_tokens(model, tokens[:-1], own, prompt.length, last_only=False))
        results.append(torch.cat(rows).float().log_softmax(-1))
    return results
