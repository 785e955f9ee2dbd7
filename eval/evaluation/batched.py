"""Greedy answers for many prompts per decode step (``decode_batch``): each prompt is prefilled and evicted alone,
then decoded as one row of a static decoder shared with the others (`restkv.batching`).

Answers come back in the order the prompts went in, whatever order their rows finish in, so a batched run
writes the records of an unbatched one (timing fields, the decode path and the batch size aside). A prompt's
``decode_seconds`` is its share of the batch's decode time: each window of steps divided among the rows
active in it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from restkv.batching import BatchedDecoding
from restkv.eval.evaluation.base import Session
from restkv.eval.evaluation.decoding import (
    DEFAULT_STOP_CHECK_STEPS,
    STOP_CHECK_STEPS,
    Answer,
    cut_at_eos,
    timed_prefill,
)
from restkv.eval.evaluation.prompting import PromptTokens
from restkv.graphs import static_form
from restkv.worksizes import gpu_free_bytes


def resolve_decode_batch(value: Any, device: torch.device, decode: str, batchable: str | None) -> int | str:
    """``decode_batch`` as the run uses it: an integer, or ``auto`` (rows chosen from free GPU memory).

    ``auto`` is 1 on a CPU and wherever the run cannot batch; ``batchable`` is None when it can, else why not
    (the evaluation, quantized storage). An explicit value above 1 where the run cannot batch is refused with
    that reason, before any work.
    """
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"decode_batch={value!r} is not allowed; use auto or an integer >= 1 (1: one prompt a step)")
    eager = "decode=eager decodes with the model's own loop, one prompt at a time" if decode == "eager" else None
    reason = batchable or eager
    if value == "auto":
        return 1 if device.type != "cuda" or reason else "auto"
    if value > 1 and reason:
        raise ValueError(f"decode_batch={value} cannot batch this run: {reason}; use decode_batch=1 (or auto)")
    return value


@dataclass
class _Waiting:
    """What a prompt's record needs besides its tokens, kept until its row finishes."""

    kept_tokens: float
    prefill_seconds: float
    extras: dict[str, Any]


def batched_answers(
    session: Session,
    work: list[tuple[Any, PromptTokens, int]],
    rows: int | str,
    snapshot: Callable[[], dict[str, Any]],
) -> Iterator[tuple[Any, Answer, dict[str, Any]]]:
    """(key, answer, the prompt's ``snapshot()`` taken right after its prefill) for each (key, prompt, max new
    tokens) of ``work``, in ``work``'s order; the prompts decode ``rows`` at a time (``auto``: from free memory)."""
    model, compressor = session.model, session.compressor
    device = model.device
    record = device.type == "cuda" and session.decode in ("auto", "graph")
    batch = BatchedDecoding(
        model, rows, max(m for _, _, m in work), session.eos_ids,
        STOP_CHECK_STEPS.get(device.type, DEFAULT_STOP_CHECK_STEPS), record, lambda: gpu_free_bytes(device),
    )  # fmt: skip
    path = "graph" if record else "static"
    order = [key for key, _, _ in work]
    waiting: dict[Any, _Waiting] = {}
    ready: dict[Any, tuple[Answer, dict[str, Any]]] = {}

    def finish() -> Iterator[tuple[Any, Answer, dict[str, Any]]]:
        for done in batch.advance():
            wait = waiting.pop(done.key)
            tokens = cut_at_eos(done.tokens, session.eos_ids)
            answer = Answer(tokens, wait.prefill_seconds, done.seconds, wait.kept_tokens, done.forwards, path)
            ready[done.key] = (answer, {**wait.extras, "decode_batch": done.rows})
        while order and order[0] in ready:
            key = order.pop(0)
            yield (key, *ready.pop(key))

    for key, prompt, max_new in work:
        cache, logits, kept, seconds = timed_prefill(model, prompt, session.protocol, compressor, max_new)
        waiting[key] = _Waiting(kept, seconds, snapshot())
        contents = static_form(cache)
        while batch.active and not (batch.has_room() and batch.fits(contents, max_new)):
            yield from finish()
        batch.add(key, contents, logits, prompt.length, max_new)
        del cache, contents
    while batch.active:
        yield from finish()
