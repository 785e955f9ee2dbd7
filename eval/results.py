"""Run folders: where a run's predictions and metrics live, and how a killed run resumes.

``predictions.jsonl`` gets one line per finished sample, flushed and synced as it is written,
so a run killed at any moment loses at most the sample in flight. On restart the file is
read back: finished samples are skipped; a line that is not valid JSON (typically the last
one, cut by the kill) is reported, moved to ``predictions.corrupt.jsonl`` for inspection and
its sample is run again.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PREDICTIONS = "predictions.jsonl"
CORRUPT = "predictions.corrupt.jsonl"
METRICS = "metrics.json"
REQUIRED_FIELDS = ("id", "task", "score")


def overrides_hash(overrides: Iterable[str]) -> str:
    """Short stable hash of command-line overrides (order-insensitive); '' when there are none."""
    items = sorted(overrides)
    if not items:
        return ""
    return hashlib.sha1("\n".join(items).encode()).hexdigest()[:8]


def run_folder(root: Path, bench: str, model: str, policy: str, budget: str, other_overrides: Iterable[str]) -> Path:
    """``root/bench/model/policy/budget`` plus ``-<hash>`` of any other override."""
    digest = overrides_hash(other_overrides)
    leaf = f"budget{budget}" + (f"-{digest}" if digest else "")
    return root / bench / model / policy / leaf


class PredictionLog:
    """Append-only JSONL of finished samples, with crash recovery on open."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / PREDICTIONS
        folder.mkdir(parents=True, exist_ok=True)
        self.records: dict[str, dict[str, Any]] = {}
        self.recovered: list[str] = []
        self._load()
        self._file = self.path.open("a", encoding="utf-8")

    def _load(self) -> None:
        if not self.path.exists():
            return
        good: list[str] = []
        bad: list[tuple[int, str]] = []
        with self.path.open(encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                record = _parse(line)
                if record is None:
                    bad.append((number, line.rstrip("\n")))
                    continue
                self.records[str(record["id"])] = record
                good.append(json.dumps(record, ensure_ascii=False))
        if bad:
            with (self.folder / CORRUPT).open("a", encoding="utf-8") as f:
                for number, line in bad:
                    f.write(line + "\n")
                    self.recovered.append(f"{self.path}:{number}")
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(r + "\n" for r in good), encoding="utf-8")
            os.replace(tmp, self.path)
            for where in self.recovered:
                print(
                    f"warning: unreadable result line {where} moved to {CORRUPT}; its sample will be redone",
                    file=sys.stderr,
                )

    def done(self, sample_id: str) -> bool:
        return sample_id in self.records

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False)
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.records[str(record["id"])] = record

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> PredictionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parse(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict) or any(field not in record for field in REQUIRED_FIELDS):
        return None
    return record


def summarize(records: Iterable[dict[str, Any]], task_order: list[str] | None = None) -> dict[str, Any]:
    """Per-task mean score (0-100), their unweighted average, sample counts and timing medians."""
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_task[record["task"]].append(record)
    order = [t for t in (task_order or []) if t in by_task] + sorted(set(by_task) - set(task_order or []))
    tasks = {task: 100 * statistics.fmean(r["score"] for r in by_task[task]) for task in order}
    summary: dict[str, Any] = {
        "average": statistics.fmean(tasks.values()) if tasks else float("nan"),
        "tasks": tasks,
        "samples": {task: len(by_task[task]) for task in order},
    }
    for key in ("prefill_seconds", "decode_seconds"):
        values = [r[key] for rs in by_task.values() for r in rs if key in r]
        if values:
            summary[f"median_{key}"] = statistics.median(values)
    return summary


def write_metrics(folder: Path, summary: dict[str, Any]) -> Path:
    path = folder / METRICS
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def format_table(summary: dict[str, Any], title: str = "") -> str:
    """A plain-text score table: one row per task, then the average."""
    tasks = summary["tasks"]
    width = max([len("average"), *(len(t) for t in tasks)])
    lines = [title] if title else []
    lines.append(f"{'task':<{width}}  {'score':>6}  {'n':>4}")
    lines.append("-" * (width + 14))
    for task, score in tasks.items():
        lines.append(f"{task:<{width}}  {score:6.2f}  {summary['samples'][task]:>4}")
    lines.append("-" * (width + 14))
    lines.append(f"{'average':<{width}}  {summary['average']:6.2f}  {sum(summary['samples'].values()):>4}")
    return "\n".join(lines)
