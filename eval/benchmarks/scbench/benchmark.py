"""SCBench (Li et al., 2024) read from its own files: one long context, several questions about it.

Each record of ``microsoft/SCBench``'s ``data/scbench_<task>.jsonl`` holds an ``id``, a shared ``context`` and
``multi_turns``, a list of ``{input, answer}``. A record becomes one sample: the context (after the task's
instruction), the first turn's input as its question, the later turns in ``meta["turns"]``, which
``evaluation=multi_turn`` asks in turn on the same compressed cache (``evaluation=generate`` asks the first
only). Data: ``python scripts/download_data.py scbench`` (or the files in ``bench.data_dir``).

Tasks read here, with SCBench's answer lengths: ``kv``, ``prefix_suffix``, ``vt``, ``mf``, ``many_shot``,
``qa_eng``, ``qa_chn``, ``choice_eng``, ``summary``. Scores: the reference contained in the answer
(``string_match_all``) for the retrieval tasks, token F1 for QA, ROUGE-L for summaries. Not reproduced:
SCBench's own per-task prompt templates (only the key-value task's instruction is theirs; the others give the
context then the question) and its repository-QA and mixed tasks, which need their own scorers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from restkv.eval.benchmarks.contract.metrics import score as score_metric
from restkv.eval.benchmarks.contract.sample import Sample
from restkv.eval.benchmarks.shared.jsonl import Field, task_records
from restkv.eval.benchmarks.shared.official import LocalTaskFiles, cap_new_tokens


@dataclass(frozen=True)
class SCBenchTask:
    metric: str
    max_new_tokens: int
    instruction: str = ""


TASKS = {
    "kv": SCBenchTask(
        "string_match_all", 150, "Extract the value corresponding to the specified key in the JSON object below."
    ),
    "prefix_suffix": SCBenchTask("string_match_all", 150),
    "vt": SCBenchTask("string_match_all", 30),
    "mf": SCBenchTask("string_match_all", 5),
    "many_shot": SCBenchTask("string_match_all", 10),
    "qa_eng": SCBenchTask("qa_f1", 40),
    "qa_chn": SCBenchTask("qa_f1_zh", 40),
    "choice_eng": SCBenchTask("string_match_all", 40),
    "summary": SCBenchTask("rouge", 200),
}
"""SCBench's tasks read here: metric, answer length (SCBench's), instruction before the context."""


ANSWER = Field(
    (str, int, float, list), "the turn's answer: text, a number or a list", nonempty=True, items=(str, int, float)
)
TURN = {"input": Field((str,), "the turn's question (text)", nonempty=True), "answer": ANSWER}
TURNS = Field((list,), "a non-empty list of turns, each {input, answer}", nonempty=True, fields=TURN)
CONTEXT = Field((str, list), "the shared context (text, or a list of texts)", nonempty=True, items=(str, int, float))
"""What a record must hold (checked by `restkv.eval.benchmarks.shared.records`): a null or object answer is
refused, never turned into the reference ``'None'``."""


def _text(value: Any) -> str:
    """A context or answer as text (the ``mf`` task stores numbers)."""
    if isinstance(value, list):
        return " ".join(_text(item) for item in value)
    return str(value)


@dataclass
class SCBenchBenchmark(LocalTaskFiles):
    """``tasks`` of `TASKS` from ``data_dir`` (``scbench_<task>.jsonl``); ``samples`` per task (None: all)."""

    tasks: list[str] = field(default_factory=lambda: ["kv", "prefix_suffix", "vt", "qa_eng"])
    data_dir: str = "data/scbench"
    samples: int | None = None
    max_new_tokens_cap: int | None = None
    name: str = "scbench"

    task_names: ClassVar[tuple[str, ...]] = tuple(TASKS)
    benchmark: ClassVar[str] = "SCBench"
    dataset: ClassVar[str] = "scbench"
    file_prefix: ClassVar[str] = "scbench_"

    def __post_init__(self) -> None:
        self.check_knobs("samples", "max_new_tokens_cap")

    def task_samples(self, task: str, source: Any) -> list[Sample]:
        spec = TASKS[task]
        fields = {"context": CONTEXT, "multi_turns": TURNS}
        new_tokens = cap_new_tokens(spec.max_new_tokens, self.max_new_tokens_cap)
        samples = []
        for line, record in task_records(
            source, fields, benchmark="SCBench", task=task, id_field="id", limit=self.samples
        ):
            turns = [
                {"question": f"\n\n{turn['input']}", "answer_prefix": "", "references": [_text(turn["answer"])]}
                for turn in record["multi_turns"]
            ]
            head = f"{spec.instruction}\n\n" if spec.instruction else ""
            samples.append(
                Sample(
                    id=f"scbench_{task}-{record['id']}",
                    task=task,
                    context=head + _text(record["context"]),
                    question=turns[0]["question"],
                    references=turns[0]["references"],
                    max_new_tokens=new_tokens,
                    metric=spec.metric,
                    meta={"turns": turns[1:], "source": f"{source.where}:{line}"},
                )
            )
        return samples

    def score(self, sample: Sample, prediction: str) -> float:
        return score_metric(sample.metric, prediction, sample.references)
