"""Official RULER files: reading the prompts NVIDIA/RULER's own generator made.

Two layouts are recognised under a data folder, one sub-folder per context length:

* ``<length>/<task>/validation.jsonl`` (or ``test.jsonl``): what RULER's ``scripts/data/prepare.py``
  writes with ``--save_dir <folder>/<length>``;
* ``<length>/<task>.jsonl``: what the ReST-KV authors' ``run_ruler.py`` reads (``data/RULER``).

A record holds ``input`` (the prompt up to the end of the question: RULER keeps the answer prefix in
its own field, ``answer_prefix``) and ``outputs`` (the answers). The prompt is cut where the task's
question starts so that the ``query_agnostic`` protocol can compress the context alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eval.benchmarks.jsonl import DataFileError, Field, all_items, check_fields, iter_jsonl, resolve_path
from eval.benchmarks.ruler.tasks import TASK_CONFIGS, task_config
from eval.benchmarks.ruler.templates import FAMILIES, QUESTION_MARKERS, split_prompt
from eval.sample import Sample

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


def find_files(data_dir: str | Path) -> Found:
    """The task files under ``data_dir``; raises naming the entry when the layout is not RULER's."""
    root = resolve_path(data_dir)
    if not root.is_dir():
        raise ValueError(f"bench.data_dir={str(data_dir)!r} is not a folder")
    files: list[TaskFile] = []
    ignored: list[str] = []
    for entry in sorted(p for p in root.iterdir() if not p.name.startswith(".")):
        if not entry.is_dir():
            ignored.append(entry.name)
            continue
        if not entry.name.isdigit() or int(entry.name) < 1:
            raise ValueError(
                f"bench.data_dir={str(data_dir)!r}: {entry} is not a context-length folder; the layout is "
                "<data_dir>/<length>/<task>/validation.jsonl or <data_dir>/<length>/<task>.jsonl, "
                "<length> a positive number of tokens"
            )
        for item in sorted(p for p in entry.iterdir() if not p.name.startswith(".")):
            task_file = _task_file(item, int(entry.name))
            if task_file is None:
                ignored.append(str(item.relative_to(root)))
            else:
                files.append(task_file)
    duplicates = _duplicates(files)
    if duplicates:
        raise ValueError(f"bench.data_dir={str(data_dir)!r} holds two files for {', '.join(duplicates)}; keep one")
    if not files:
        listed = ", ".join(ignored) if ignored else "nothing"
        raise ValueError(
            f"bench.data_dir={str(data_dir)!r} holds no RULER task files (found: {listed}); expected "
            f"<length>/<task>/validation.jsonl or <length>/<task>.jsonl with <task> one of {', '.join(TASK_CONFIGS)}"
        )
    return Found(files, ignored)


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


FIELDS = {
    "input": Field((str,), "the prompt text"),
    "outputs": Field((list,), "a list of answer strings"),
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
    for number, record in iter_jsonl(file.path):
        if limit is not None and len(samples) >= limit:
            break
        where = {"benchmark": "RULER", "task": file.task, "where": str(file.path), "line": number}
        check_fields(record, FIELDS, **where)
        outputs = record["outputs"]
        if not outputs or not all_items(outputs, (str,)):
            raise DataFileError(f"{file.path}:{number}: 'outputs' must be a non-empty list of answer strings")
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
    return samples
