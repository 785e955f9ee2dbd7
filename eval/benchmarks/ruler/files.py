"""Official RULER files: reading the prompts NVIDIA/RULER's own generator made.

Three layouts are recognised under a data folder, one sub-folder per context length:

* ``<length>/<task>/validation.jsonl`` (or ``test.jsonl``): what RULER's ``scripts/data/prepare.py``
  writes with ``--save_dir <folder>/<length>``;
* ``<length>/data/<task>/validation.jsonl``: RULER's own ``run.sh`` results folder;
* ``<length>/<task>.jsonl``: what the ReST-KV authors' ``run_ruler.py`` reads (``data/RULER``).

The official generator's ``input`` ends with the question and its ``answer_prefix`` field holds the
answer prefix since NVIDIA/RULER 48cbc8b (January 2025); older files keep the prefix at the end of
``input`` (no ``answer_prefix`` field), which then stays in ``Sample.question``. The fit rule that
:mod:`.fitting` reproduces is the one of c3f5e3b (the search arrived in 56ea4ef, June 2025; before it,
niah and cwe grew the haystack linearly). A file made with a model template
(``--model_template_type``) is fed as it is, template included.

A record holds ``input`` (the prompt up to the end of the question: RULER keeps the answer prefix in
its own field, ``answer_prefix``) and ``outputs`` (the answers). The prompt is cut where the task's
question starts so that the ``query_agnostic`` protocol can compress the context alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from restkv.eval.benchmarks.contract.sample import Sample
from restkv.eval.benchmarks.ruler.tasks import TASK_CONFIGS, task_config
from restkv.eval.benchmarks.ruler.templates import FAMILIES, QUESTION_MARKERS, split_prompt
from restkv.eval.benchmarks.shared.jsonl import DataFileError, Field, check_fields, iter_jsonl, resolve_path

SUBSETS = ("validation.jsonl", "test.jsonl")


@dataclass(frozen=True)
class TaskFile:
    """One task's file at one length."""

    task: str
    length: int
    path: Path


@dataclass(frozen=True)
class Found:
    """What a data folder holds: the recognised files and the entries that are not RULER tasks."""

    files: list[TaskFile]
    ignored: list[str]

    def lengths(self) -> dict[int, list[str]]:
        """Length -> the tasks found at it."""
        out: dict[int, list[str]] = {}
        for f in sorted(self.files, key=lambda f: (f.length, f.task)):
            out.setdefault(f.length, []).append(f.task)
        return out

    def summary(self) -> str:
        """One line: the tasks per length, and what was ignored."""
        parts = [f"{length}: {len(tasks)} tasks ({', '.join(tasks)})" for length, tasks in self.lengths().items()]
        ignored = f"; ignored (not RULER tasks): {', '.join(self.ignored)}" if self.ignored else ""
        return "; ".join(parts) + ignored


LAYOUT = (
    "<data_dir>/<length>/<task>/validation.jsonl, <data_dir>/<length>/data/<task>/validation.jsonl or "
    "<data_dir>/<length>/<task>.jsonl, <length> a positive number of tokens"
)


def find_files(data_dir: str | Path) -> Found:
    """The task files under ``data_dir``; raises naming the entry when the layout is not RULER's.

    A folder whose name is not a length is ignored (listed) unless it holds task files, which would
    otherwise be lost: then it is an error.
    """
    root = resolve_path(data_dir)
    if not root.is_dir():
        raise ValueError(f"bench.data_dir={str(data_dir)!r} is not a folder")
    files: list[TaskFile] = []
    ignored: list[str] = []
    for entry in sorted(p for p in root.iterdir() if not p.name.startswith(".")):
        is_length = re.fullmatch(r"[0-9]+", entry.name) is not None and int(entry.name) > 0
        found, skipped = _length_folder(entry, int(entry.name) if is_length else 0, root)
        if found and not is_length:
            raise ValueError(
                f"bench.data_dir={str(data_dir)!r}: {entry} holds task files but its name is not a context "
                f"length; the layout is {LAYOUT}"
            )
        if is_length:
            files += found
            ignored += skipped
        else:
            ignored.append(entry.name)
    duplicates = _duplicates(files)
    if duplicates:
        raise ValueError(f"bench.data_dir={str(data_dir)!r} holds two files for {', '.join(duplicates)}; keep one")
    if not files:
        listed = ", ".join(ignored) if ignored else "nothing"
        raise ValueError(
            f"bench.data_dir={str(data_dir)!r} holds no RULER task files (found: {listed}); expected {LAYOUT}, "
            f"<task> one of {', '.join(TASK_CONFIGS)}"
        )
    return Found(files, ignored)


def _length_folder(entry: Path, length: int, root: Path) -> tuple[list[TaskFile], list[str]]:
    """The task files of one length folder (RULER's own runs nest them in ``data/``) and what else it holds."""
    if not entry.is_dir():
        return [], []
    files: list[TaskFile] = []
    ignored: list[str] = []
    items = sorted(p for p in entry.iterdir() if not p.name.startswith("."))
    nested = entry / "data"
    if nested.is_dir() and nested.name not in TASK_CONFIGS:
        items = [p for p in items if p != nested] + sorted(p for p in nested.iterdir() if not p.name.startswith("."))
    for item in items:
        task_file = _task_file(item, length)
        if task_file is None:
            ignored.append(str(item.relative_to(root)))
        else:
            files.append(task_file)
    return files, ignored


def _task_file(item: Path, length: int) -> TaskFile | None:
    if item.is_file() and item.suffix == ".jsonl" and item.stem in TASK_CONFIGS:
        return TaskFile(item.stem, length, item)
    if item.is_dir() and item.name in TASK_CONFIGS:
        for subset in SUBSETS:
            if (item / subset).is_file():
                return TaskFile(item.name, length, item / subset)
    return None


def _duplicates(files: list[TaskFile]) -> list[str]:
    seen: set[tuple[str, int]] = set()
    twice = []
    for f in files:
        if (f.task, f.length) in seen:
            twice.append(f"{f.task} at {f.length}")
        seen.add((f.task, f.length))
    return twice


TEMPLATE_STARTS = (
    "<|begin_of_text|>",
    "[INST]",
    "<|user|>",
    "<BOS_TOKEN>",
    "<|im_start|>",
    "[gMASK]",
    "<|startoftext|>",
)
"""How prompts wrapped in a model template by ``prepare.py --model_template_type`` begin."""


def templated(sample: Sample) -> bool:
    """Whether the file's prompt already carries a model's chat template (``prepare.py`` added it)."""
    return sample.context.lstrip().startswith(TEMPLATE_STARTS)


FIELDS = {
    "input": Field((str,), "the prompt text"),
    "outputs": Field((list,), "a non-empty list of answer strings", nonempty=True, items=(str,)),
    "answer_prefix": Field((str,), "the answer prefix text", required=False),
}


def read_samples(
    file: TaskFile, limit: int | None, max_new_tokens: int | None, answer_prefix: bool, chat_template: bool
) -> list[Sample]:
    """The first ``limit`` records of ``file`` (all when ``None``) as samples; a malformed line raises
    naming the file and the line."""
    family_name = task_config(file.task).family
    family = FAMILIES[family_name]
    samples: list[Sample] = []
    if limit == 0:
        return samples
    for number, record in iter_jsonl(file.path):
        where = {"benchmark": "RULER", "task": file.task, "where": str(file.path), "line": number}
        check_fields(record, FIELDS, **where)
        outputs = record["outputs"]
        split = split_prompt(record["input"], family_name)
        if split is None:
            markers = " or ".join(repr(m) for m in QUESTION_MARKERS[family_name])
            raise DataFileError(f"{file.path}:{number}: no {file.task} question in 'input' (looked for {markers})")
        samples.append(
            Sample(
                id=f"ruler/{file.task}/{file.length}/file/{len(samples)}",
                task=file.task,
                context=split[0],
                question=split[1],
                answer_prefix=record.get("answer_prefix", "") if answer_prefix else "",
                references=list(outputs),
                max_new_tokens=max_new_tokens or family.max_new_tokens,
                metric=family.metric,
                chat_template=chat_template,
                meta={
                    "benchmark": "ruler",
                    "context_length": file.length,
                    "source": str(file.path),
                    "line": number,
                    "index": len(samples),
                    "official_length": record.get("length"),
                },
            )
        )
        if limit is not None and len(samples) >= limit:
            break  # the next line is not even parsed
    if not samples:
        raise DataFileError(f"{file.path}: no records (an empty task file would drop the task from the averages)")
    return samples
