"""A run folder as the report must see it: what it holds, whether a run is still writing it, what is wrong.

The runner's reader of ``predictions.jsonl`` (`restkv.eval.harness.run_folder.read_predictions`) is the only
one: the report accepts what the runner accepts and leaves out, saying why, what the runner would refuse. A
folder whose lock is held belongs to a run in progress; ``metrics.json`` must be the object the runner writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from restkv.eval.harness.run_folder import LOCK, METRICS, PREDICTIONS, PredictionsRead, read_predictions


@dataclass
class FolderState:
    """One run folder, read without changing it."""

    folder: Path
    predictions: PredictionsRead
    metrics: dict[str, Any] | None
    in_progress: bool
    problems: list[str] = field(default_factory=list)
    """Why the folder's results cannot be used as they are (each names the file and the fix)."""

    @property
    def records(self) -> dict[str, dict[str, Any]]:
        return self.predictions.records

    @property
    def finished(self) -> bool:
        """A run ended here (``metrics.json`` written), none is writing, and nothing in it is untrustworthy."""
        return self.metrics is not None and not self.in_progress and not self.problems


def lock_held(folder: Path) -> bool:
    """Whether a run holds the folder's lock now (the kernel's lock, not the lock file's text, says so)."""
    path = folder / LOCK
    if not path.is_file():
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    return False


def metrics_problem(metrics: Any) -> str | None:
    """What is wrong with a parsed ``metrics.json`` (the runner writes an object with a numeric or null
    ``average`` and numeric task scores), or None."""
    if not isinstance(metrics, dict):
        return f"is {type(metrics).__name__}, not the object a run writes"
    average = metrics.get("average")
    if average is not None and not _finite(average):
        return f"its 'average' is {average!r}, not a number or null"
    tasks = metrics.get("tasks", {})
    if not isinstance(tasks, dict) or not all(_finite(v) for v in tasks.values()):
        return "its 'tasks' is not a mapping of task names to numbers"
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def read_folder(folder: Path) -> FolderState:
    """Everything the report needs to know about ``folder``, read with the runner's own reader."""
    predictions = read_predictions(folder / PREDICTIONS)
    problems = list(predictions.problems)
    metrics = None
    path = folder / METRICS
    if path.exists():
        try:
            metrics = json.loads(path.read_text(encoding="utf-8"))
            problem = metrics_problem(metrics)
        except (OSError, ValueError) as error:
            problem = f"cannot be read ({error})"
        if problem:
            problems.append(f"{path} {problem}: run the same command again to rewrite it")
            metrics = None
    return FolderState(folder, predictions, metrics, lock_held(folder), problems)
