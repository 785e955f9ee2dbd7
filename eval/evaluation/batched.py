"""Greedy answers for many prompts per decode step (``decode_batch``): each prompt is prefilled and evicted alone,
then decoded as one row of a static decoder shared with the others (`restkv.decoding.rows`).

Answers come back in the order the prompts went in, whatever order their rows finish in, so a batched run
writes the records of an unbatched one (timing fields, the decode path and the batch size aside). A prompt's
``decode_seconds`` is its share of the batch's decode time: each window of steps divided among the rows
active in it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from restkv.decoding import static_decoder
from restkv.decoding.rows import BatchedDecoding, Finished
from restkv.decoding.static_decoder import static_form
from restkv.devices import model_devices, synchronize
from restkv.eval.evaluation.base import Session
from restkv.eval.evaluation.decoding import (
    DEFAULT_STOP_CHECK_STEPS,
    STOP_CHECK_STEPS,
    TIE_MARGIN,
    Answer,
    cut_at_eos,
    decode_check_key,
    greedy,
    timed_prefill,
    token_disagreement,
)
from restkv.eval.evaluation.prompting import PromptTokens
from restkv.fastpath import CHECKS, Verdict, describe, with_fallbacks
from restkv.worksizes import gpu_free_bytes


@dataclass
class _Waiting:
    """What a prompt's record needs besides its tokens, kept until its row finishes."""

    kept_tokens: float
    prefill_seconds: float
    extras: dict[str, Any]


def _rows_decoder(session: Session, rows: int | str, max_new: int, record: bool) -> BatchedDecoding:
    """The decoder the session's prompts share, ``rows`` at a time (``record``: as recorded steps)."""
    device = session.model.device
    stops = STOP_CHECK_STEPS.get(device.type, DEFAULT_STOP_CHECK_STEPS)
    return BatchedDecoding(session.model, rows, max_new, session.eos_ids, stops, record, lambda: gpu_free_bytes(device))


def batched_answers(
    session: Session,
    work: list[tuple[Any, PromptTokens, int]],
    rows: int | str,
    snapshot: Callable[[], dict[str, Any]],
) -> Iterator[tuple[Any, Answer, dict[str, Any]]]:
    """(key, answer, the prompt's ``snapshot()`` taken right after its prefill) for each (key, prompt, max new
    tokens) of ``work``, in ``work``'s order; the prompts decode ``rows`` at a time (``auto``: from free memory).

    Under ``decode=auto`` each recorded decoder is checked on the first prompt it is built for (`_Checked`): that
    prompt decodes alone and its tokens are compared with the eager loop's; a failed check answers the prompts
    that would build a decoder of that signature with the eager loop, the reason in their records."""
    model, compressor = session.model, session.compressor
    record = model.device.type in static_decoder.RECORDING_DEVICES and session.decode in ("auto", "graph")
    batch = _rows_decoder(session, rows, max(m for _, _, m in work), record)
    checker = _Checked(batch, session.eos_ids, rows) if record and session.decode == "auto" else None
    path = "graph" if record else "static"
    order = [key for key, _, _ in work]
    waiting: dict[Any, _Waiting] = {}
    ready: dict[Any, tuple[Answer, dict[str, Any]]] = {}

    def settle(done: Finished) -> None:
        wait = waiting.pop(done.key)
        tokens = cut_at_eos(done.tokens, session.eos_ids)
        answer = Answer(tokens, wait.prefill_seconds, done.seconds, wait.kept_tokens, done.forwards, path)
        ready[done.key] = (answer, {**wait.extras, "decode_batch": done.rows})

    def release() -> Iterator[tuple[Any, Answer, dict[str, Any]]]:
        while order and order[0] in ready:
            key = order.pop(0)
            yield (key, *ready.pop(key))

    def finish() -> Iterator[tuple[Any, Answer, dict[str, Any]]]:
        for done in batch.advance():
            settle(done)
        yield from release()

    for key, prompt, max_new in work:
        cache, logits, kept, seconds = timed_prefill(model, prompt, session.protocol, compressor, max_new)
        waiting[key] = _Waiting(kept, seconds, with_fallbacks(snapshot(), CHECKS.drain()))
        contents = static_form(cache)
        while batch.active and not (batch.has_room() and batch.fits(contents, max_new)):
            yield from finish()
        checked = checker is not None and batch.needs_build(contents, max_new)
        outcome = checker.first_prompt(key, cache, contents, logits, prompt.length, max_new) if checked else None
        if outcome is not None:
            if isinstance(outcome, Finished):
                settle(outcome)
            else:
                ready[key] = outcome.reply(waiting.pop(key))
            yield from release()
            continue
        batch.add(key, contents, logits, prompt.length, max_new)
        del cache, contents
    while batch.active:
        yield from finish()


@dataclass
class _Eager:
    """A prompt answered by the eager loop because its decoder's check failed."""

    tokens: list[int]
    forwards: int
    seconds: float
    reason: str

    def reply(self, wait: _Waiting) -> tuple[Answer, dict[str, Any]]:
        """The prompt's answer and record fields (decoded alone, eagerly, with the reason)."""
        answer = Answer(self.tokens, wait.prefill_seconds, self.seconds, wait.kept_tokens, self.forwards, "eager")
        return answer, with_fallbacks({**wait.extras, "decode_batch": 1}, [self.reason])


@dataclass
class _Checked:
    """``decode=auto``'s check of each recorded decoder a batch builds (`restkv.fastpath`), keyed by the decoder's
    signature and rows setting: its first prompt decodes alone in it and must give the eager loop's tokens."""

    batch: BatchedDecoding
    eos_ids: set[int]
    rows: int | str

    def first_prompt(
        self, key: Any, cache: Any, contents: list[dict[str, Any]], logits: torch.Tensor, position: int, max_new: int
    ) -> Finished | _Eager | None:
        """For a prompt that builds a decoder: None where its signature was checked good (add it as usual), its
        answer decoded alone where this is the check, the eager loop's where the check failed (now or before)."""
        model, eos = self.batch.model, self.eos_ids
        signature = decode_check_key(model, contents, self.batch.max_steps, eos, ("rows", self.rows))
        verdict = CHECKS.verdict(signature)
        if verdict is not None and verdict.ok:
            return None
        own = [{**c, "keys": c["keys"].clone(), "values": c["values"].clone()} for c in contents]  # eager writes
        devices = model_devices(model)
        synchronize(*devices)
        start = time.perf_counter()
        margins = torch.ones(max_new, dtype=torch.float32, device=logits.device)
        generated, forwards = greedy(model, cache, logits, position, max_new, eos, margins)
        synchronize(*devices)
        eager = _Eager(cut_at_eos(generated.tolist(), eos), forwards, time.perf_counter() - start, "")
        if verdict is not None:
            CHECKS.apply(verdict)
            eager.reason = verdict.message()
            return eager
        try:
            done = self._decode_alone(key, own, logits, position, max_new)
            tie = TIE_MARGIN.get(logits.dtype, 0.0)
            reason = token_disagreement(cut_at_eos(done.tokens, eos), eager.tokens, margins.tolist(), tie)
        except Exception as error:  # any failure of the recorded step is the finding
            reason = describe(error)
        verdict = CHECKS.settle(signature, Verdict("decode", "graph", "eager", reason))
        if verdict.ok:
            return done
        self.batch.reset()
        eager.reason = verdict.message()
        return eager

    def _decode_alone(
        self, key: Any, contents: list[dict[str, Any]], logits: torch.Tensor, position: int, max_new: int
    ) -> Finished:
        self.batch.add(key, contents, logits, position, max_new)
        while True:
            for done in self.batch.advance():
                if done.key == key:
                    return done
