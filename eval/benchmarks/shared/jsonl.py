"""Reading official JSON-lines data files, with errors that say exactly where the data is wrong.

Every problem is a :class:`DataFileError` (a ``ValueError``) whose message starts with
``<file>:<line>:``; for a file inside an archive the file part is ``<archive>:<member>``. A line
that is not JSON, a line that is not a JSON object, a missing or empty field, a field of the wrong
type and a missing id are all reported that way, naming the benchmark, the task and the field (the
record checks are `restkv.eval.benchmarks.shared.records`, shared by every loader).

Blank lines are skipped (the InfiniteBench scorer does the same); every other line must be one
JSON object.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DataFileError",
    "Field",
    "JsonlSource",
    "all_items",
    "check_fields",
    "iter_jsonl",
    "iter_lines",
    "open_jsonl",
    "resolve_path",
    "task_records",
]

from restkv.eval.benchmarks.contract.reads import note
from restkv.eval.benchmarks.shared.records import ID, DataFileError, Field, all_items, check_fields
from restkv.eval.models.paths import local_path


def resolve_path(path: str | Path) -> Path:
    """``path`` as given if it exists (or is absolute); else under the project root if it exists there.

    A relative path that exists in neither place is returned unchanged, so error messages show
    what the user wrote.
    """
    local = local_path(path)
    return local if local is not None else Path(path).expanduser()


def iter_lines(lines: Iterable[str | bytes], where: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every non-blank line of ``lines``; ``where`` names the source."""
    for number, raw in enumerate(lines, start=1):
        if isinstance(raw, bytes):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataFileError(f"{where}:{number}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        else:
            line = raw
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataFileError(
                f"{where}:{number}: malformed JSON line ({exc.msg}, column {exc.colno}); "
                "each line must be one complete JSON object"
            ) from None
        if not isinstance(record, dict):
            raise DataFileError(f"{where}:{number}: expected a JSON object, got {type(record).__name__}")
        yield number, record


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every non-blank line of the JSON-lines file ``path``."""
    note(path)
    with open(path, "rb") as f:
        yield from iter_lines(f, str(path))


@dataclass
class JsonlSource:
    """Line-numbered records and where they come from (``file`` or ``archive:member``), for messages."""

    where: str
    records: Iterator[tuple[int, dict[str, Any]]]


def open_jsonl(path: Path) -> JsonlSource:
    """The records of the JSON-lines file ``path`` (read lazily)."""
    return JsonlSource(str(path), iter_jsonl(path))


def task_records(
    source: JsonlSource,
    fields: Mapping[str, Field],
    *,
    benchmark: str,
    task: str,
    id_field: str,
    limit: int | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` for the records of one task's file, each checked before it is yielded.

    A record must have ``fields`` (:func:`check_fields`) and an ``id_field`` value (`records.ID` unless ``fields``
    says otherwise; compared as a string) that no earlier record of the file has. At most ``limit`` records are
    read (``None``: all), so a file's lines past the limit are never parsed. A file without any record is refused
    (a task must not vanish from a run unnoticed).
    """
    seen: dict[str, int] = {}
    count = 0
    checked = {id_field: ID, **fields}
    for count, (line, record) in enumerate(source.records, start=1):
        check_fields(record, checked, benchmark=benchmark, task=task, where=source.where, line=line)
        key = str(record[id_field])
        if key in seen:
            raise DataFileError(
                f"{source.where}:{line}: {benchmark} task {task!r}: {id_field} {record[id_field]!r} "
                f"repeats line {seen[key]}"
            )
        seen[key] = line
        yield line, record
        if limit is not None and count >= limit:
            return
    if count == 0:
        raise DataFileError(
            f"{source.where}: {benchmark} task {task!r}: the file holds no record (it is empty or blank); download "
            "it again (scripts/download_data.py) or drop the task from bench.tasks"
        )
