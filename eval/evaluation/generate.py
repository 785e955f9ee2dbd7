"""Generate-and-score: what every accuracy benchmark (RULER, LongBench, NIAH, ...) runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from restkv.devices import model_devices
from restkv.eval.benchmarks.contract.base import Benchmark
from restkv.eval.benchmarks.contract.sample import Sample
from restkv.eval.evaluation.base import Session
from restkv.eval.evaluation.batched import batched_answers
from restkv.eval.evaluation.decoding import Answer, answer
from restkv.eval.evaluation.prompting import PromptTokens


@dataclass
class Generate:
    """Greedy decoding under the compressor (up to the sample's ``max_new_tokens``), scored by the benchmark."""

    def evaluate(self, benchmark: Benchmark, session: Session, sample: Sample, prompt: PromptTokens) -> dict[str, Any]:
        gpus = [d for d in model_devices(session.model) if d.type == "cuda"]
        for gpu in gpus:
            torch.cuda.reset_peak_memory_stats(gpu)
        reply = answer(
            session.model,
            prompt,
            session.compressor,
            session.protocol,
            sample.max_new_tokens,
            session.eos_ids,
            session.decode,
        )
        return outcome(benchmark, session, sample, reply, gpus)

    def evaluate_many(
        self,
        benchmark: Benchmark,
        session: Session,
        work: list[tuple[Sample, PromptTokens]],
        rows: int | str,
        snapshot: Callable[[], dict[str, Any]],
    ) -> Iterator[tuple[Sample, PromptTokens, dict[str, Any]]]:
        """The outcomes of ``work``, in its order, the prompts decoded ``rows`` at a time (`batched_answers`);
        each outcome also holds ``snapshot()`` taken after its prompt's prefill and the batch size."""
        gpus = [d for d in model_devices(session.model) if d.type == "cuda"]
        items = [(index, prompt, sample.max_new_tokens) for index, (sample, prompt) in enumerate(work)]
        for index, reply, extras in batched_answers(session, items, rows, snapshot):
            sample, prompt = work[index]
            yield sample, prompt, {**outcome(benchmark, session, sample, reply, gpus), **extras}

    def report(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return {}


def outcome(
    benchmark: Benchmark, session: Session, sample: Sample, reply: Answer, gpus: list[torch.device]
) -> dict[str, Any]:
    """A generated answer's record fields: the prediction, its score, what was kept, the timings; on CUDA the
    peak allocated memory (weights included) over the model's GPUs since it was last reset: the sample's own
    when it is decoded alone, the batch's so far when batched."""
    prediction = session.tokenizer.decode(reply.tokens, skip_special_tokens=True)
    measured = {"peak_memory_bytes": sum(torch.cuda.max_memory_allocated(g) for g in gpus)} if gpus else {}
    return {
        "prediction": prediction,
        "score": float(benchmark.score(sample, prediction)),
        "kept_tokens": reply.kept_tokens,
        "prefill_seconds": round(reply.prefill_seconds, 4),
        "decode_seconds": round(reply.decode_seconds, 4),
        "new_tokens": len(reply.tokens),
        "decode_steps": reply.decode_steps,
        "decode_path": reply.decode_path,
        **measured,
    }
