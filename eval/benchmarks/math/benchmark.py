"""Long-output math benchmarks: MATH-500, AIME 2024, AIME 2025 and GSM8K, from their public data files.

Reasoning models answer these with thousands of tokens, so the cache grows during decoding: run them with
decode-time eviction (``compression.phase=decode``) and read accuracy beside answer length (``new_tokens`` in
every record; per task in ``metrics.json``), since low budgets can make answers longer.

Data: ``python scripts/download_data.py math`` writes one JSON-lines file per task into ``data/math``, each
record as the hub dataset holds it (MATH-500's ``test.jsonl``; AIME 2024's and GSM8K's parquet rows; AIME 2025's
two halves). Prompt: the problem, then the sentence the public math evaluators give chat models ("Please reason
step by step, and put your final answer within \\boxed{}."), through the model's chat template. Score: the final
answer (`restkv.eval.benchmarks.math.answers`) equal to the reference; GSM8K's reference is the number after
its ``####``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from restkv.eval.benchmarks.contract.sample import Sample
from restkv.eval.benchmarks.math.answers import extract_answer, gsm8k_reference, same_answer
from restkv.eval.benchmarks.shared.jsonl import Field, task_records
from restkv.eval.benchmarks.shared.official import LocalTaskFiles, cap_new_tokens

INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."
"""What follows the problem (Qwen2.5-Math's chain-of-thought sentence, used by most reasoning-model evaluations)."""


@dataclass(frozen=True)
class MathTask:
    """Where a task's problem, reference and id are in its records, and how long an answer may be."""

    problem: str
    answer: str
    id: str | None
    max_new_tokens: int
    reference: Callable[[str], str] = str.strip


TASKS = {
    "math500": MathTask("problem", "answer", "unique_id", 16384),
    "aime24": MathTask("problem", "answer", "id", 32768),
    "aime25": MathTask("question", "answer", "id", 32768),
    "gsm8k": MathTask("question", "answer", None, 8192, gsm8k_reference),
}
"""The tasks, with the answer lengths R-KV's and kvpress's evaluations allow (GSM8K: R-KV's 8192)."""


@dataclass
class MathBenchmark(LocalTaskFiles):
    """``tasks`` of `TASKS` from ``data_dir``; ``samples`` per task (None: all); ``max_new_tokens`` overrides every
    task's answer length, ``max_new_tokens_cap`` lowers it (quick checks)."""

    tasks: list[str]
    data_dir: str = "data/math"
    samples: int | None = None
    max_new_tokens: int | None = None
    max_new_tokens_cap: int | None = None
    name: str = "math"

    task_names: ClassVar[tuple[str, ...]] = tuple(TASKS)
    benchmark: ClassVar[str] = "math"
    dataset: ClassVar[str] = "math"

    def __post_init__(self) -> None:
        self.check_knobs("samples", "max_new_tokens", "max_new_tokens_cap")

    def task_samples(self, task: str, source: Any) -> list[Sample]:
        spec = TASKS[task]
        fields = {
            spec.problem: Field((str,), "the problem (non-empty text)", nonempty=True),
            spec.answer: Field((str, int), "the answer (text or an integer)", nonempty=True),
        }
        new_tokens = cap_new_tokens(self.max_new_tokens or spec.max_new_tokens, self.max_new_tokens_cap)
        samples = []
        for line, record in task_records(
            source, fields, benchmark="math", task=task, id_field=spec.id or spec.problem, limit=self.samples
        ):
            key = str(record[spec.id]) if spec.id else str(line)
            samples.append(
                Sample(
                    id=f"{task}-{key}",
                    task=task,
                    context=record[spec.problem],
                    question=INSTRUCTION,
                    references=[spec.reference(str(record[spec.answer]))],
                    max_new_tokens=new_tokens,
                    metric="math_answer",
                    meta={"source": f"{Path(source.where).name}:{line}"},
                )
            )
        return samples

    def score(self, sample: Sample, prediction: str) -> float:
        return float(same_answer(extract_answer(prediction), sample.references[0]))

    def report(self, records: list[dict[str, Any]], folder: Path) -> dict[str, Any]:
        """Mean answer length (new tokens) per task, beside the scores: long answers cost cache."""
        lengths: dict[str, list[int]] = {}
        for record in records:
            if "new_tokens" in record:
                lengths.setdefault(record["task"], []).append(record["new_tokens"])
        return {"mean_new_tokens": {task: round(sum(v) / len(v), 1) for task, v in lengths.items()}}
