"""A run's ``metrics.json``: the summary of its predictions (scores per task, timing medians), written atomically as
strict JSON, and the table a finished run prints. Split from `restkv.eval.harness.run_folder` (which re-exports
these names), where the predictions are kept."""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from restkv.eval.harness.errors import naming

METRICS = "metrics.json"


def summarize(records: Iterable[dict[str, Any]], task_order: list[str] | None = None) -> dict[str, Any]:
    """Per-task mean score (0-100), their unweighted average, sample counts and timing medians.

    With no records the average is None (not NaN): an empty run has no score to report.
    """
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_task[record["task"]].append(record)
    order = [t for t in (task_order or []) if t in by_task] + sorted(set(by_task) - set(task_order or []))
    tasks = {task: 100 * statistics.fmean(r["score"] for r in by_task[task]) for task in order}
    summary: dict[str, Any] = {
        "average": statistics.fmean(tasks.values()) if tasks else None,
        "tasks": tasks,
        "samples": {task: len(by_task[task]) for task in order},
    }
    for key in ("prefill_seconds", "decode_seconds"):
        values = [r[key] for rs in by_task.values() for r in rs if key in r]
        if values:
            summary[f"median_{key}"] = statistics.median(values)
    return summary


def write_metrics(folder: Path, summary: dict[str, Any]) -> Path:
    """Write ``metrics.json`` atomically, as strict JSON that any reader accepts.

    NaN and infinite floats anywhere in the summary (a benchmark extra, a timing) are written as
    ``null``, with a warning naming them: JSON has no NaN, and Python's ``NaN`` token breaks
    other readers.
    """
    path = folder / METRICS
    converted: list[str] = []
    clean = _finite_or_null(summary, "", converted)
    if converted:
        print(f"warning: {path}: non-finite value(s) written as null: {', '.join(converted)}", file=sys.stderr)
    tmp = path.with_suffix(".tmp")
    with naming(path):
        tmp.write_text(json.dumps(clean, indent=2, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def _finite_or_null(value: Any, where: str, converted: list[str]) -> Any:
    """``value`` with every non-finite float replaced by None; the dotted paths replaced go to ``converted``."""
    if isinstance(value, float) and not math.isfinite(value):
        converted.append(where or "<top>")
        return None
    if isinstance(value, dict):
        return {k: _finite_or_null(v, f"{where}.{k}" if where else str(k), converted) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(v, f"{where}[{i}]", converted) for i, v in enumerate(value)]
    return value


def format_table(summary: dict[str, Any], title: str = "") -> str:
    """A plain-text score table: one row per task, then the average."""
    tasks = summary["tasks"]

    def cell(score: float | None) -> str:
        return f"{score:6.2f}" if isinstance(score, int | float) else f"{'n/a':>6}"

    width = max([len("average"), *(len(t) for t in tasks)])
    lines = [title] if title else []
    lines.append(f"{'task':<{width}}  {'score':>6}  {'n':>4}")
    lines.append("-" * (width + 14))
    for task, score in tasks.items():
        lines.append(f"{task:<{width}}  {cell(score)}  {summary['samples'][task]:>4}")
    lines.append("-" * (width + 14))
    lines.append(f"{'average':<{width}}  {cell(summary['average'])}  {sum(summary['samples'].values()):>4}")
    return "\n".join(lines)
