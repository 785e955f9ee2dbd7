"""A run folder as every reader must see it: what it holds, whether a run is still writing it, what is wrong.

This is the one reader of run folders outside the runner's own writing (the report, ``make_figures.py``,
``plot_long_outputs.py``, ``compare_policies.py``; a structure test keeps it so). It reads ``predictions.jsonl``
with the runner's reader (`restkv.eval.harness.run_folder.read_predictions`), so a report accepts what the runner
accepts. A folder whose lock is held belongs to a run in progress; a lock left with no live holder, or more
predictions than ``metrics.json`` counts, marks a run stopped after an earlier one finished (``metrics.json`` is
then stale): both are unfinished, with a note (`unfinished_reason`). `run_folders` finds every run folder under a
root, symlinked ones included, and names every folder it skips.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from restkv.eval.harness.run_folder import LOCK, METRICS, PREDICTIONS, PredictionsRead, read_predictions

CONFIG = "config.yaml"


@dataclass
class FolderState:
    """One run folder, read without changing it."""

    folder: Path
    predictions: PredictionsRead
    metrics: dict[str, Any] | None
    in_progress: bool
    problems: list[str] = field(default_factory=list)
    """Why the folder's results cannot be used as they are (each names the file and the fix)."""
    stale_lock: bool = False
    """A ``.lock`` is there and nobody holds it: a run in this folder was killed (a finished run deletes it)."""
    config: dict[str, Any] = field(default_factory=dict)
    """The run's resolved ``config.yaml`` ({} when absent)."""

    @property
    def records(self) -> dict[str, dict[str, Any]]:
        return self.predictions.records

    @property
    def finished(self) -> bool:
        """A run ended here and nothing since: `unfinished_reason` has nothing to say."""
        return unfinished_reason(self) is None

    @property
    def metrics_samples(self) -> int | None:
        """How many samples ``metrics.json`` covers (``ran.samples``, else the per-task counts), None if unsaid."""
        metrics = self.metrics or {}
        ran = metrics.get("ran")
        if isinstance(ran, dict) and _count(ran.get("samples")):
            return int(ran["samples"])
        counts = metrics.get("samples")
        if isinstance(counts, dict) and counts and all(_count(v) for v in counts.values()):
            return sum(counts.values())
        return None

    @property
    def answer_length(self) -> float:
        """Mean generated tokens per answer: ``metrics.json``'s ``answer_length`` (written by the runner), else,
        for folders written before it was, counted from the trusted records (0 without records)."""
        recorded = (self.metrics or {}).get("answer_length")
        return float(recorded) if _finite(recorded) else mean_answer_length(self.records.values())


def mean_answer_length(records: Iterable[dict[str, Any]]) -> float:
    """Mean ``new_tokens`` per record (0 without records): the ``answer_length`` the runner writes."""
    lengths = [r.get("new_tokens", 0) for r in records]
    return sum(lengths) / max(len(lengths), 1)


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


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def read_folder(folder: Path) -> FolderState:
    """Everything a reader needs to know about ``folder``, read with the runner's own reader."""
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
    config = _read_config(folder / CONFIG, problems)
    held = lock_held(folder)
    stale = not held and (folder / LOCK).is_file()
    return FolderState(folder, predictions, metrics, held, problems, stale, config)


def _read_config(path: Path, problems: list[str]) -> dict[str, Any]:
    """``config.yaml`` as a mapping ({} when absent); a file that cannot be read adds a problem."""
    import yaml

    if not path.exists():
        return {}
    try:
        parsed = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as error:
        first = str(error).splitlines()[0]
        problems.append(f"{path} cannot be read ({first}): run the same command again to rewrite it")
        return {}
    if parsed is not None and not isinstance(parsed, dict):
        problems.append(f"{path} is not the mapping a run writes: run the same command again to rewrite it")
        return {}
    return parsed or {}


def unfinished_reason(state: FolderState) -> str | None:
    """Why ``state``'s results are not a finished run's, with what to do; None when they are."""
    count = len(state.records)
    if state.in_progress:
        return f"a run is still writing it ({count} samples so far); read it again when that run has finished"
    if state.problems:
        return "; ".join(state.problems)
    again = "run the same command again to finish it (finished samples are kept)"
    if state.metrics is None:
        return f"{count} samples and no {METRICS}: a run stopped before it finished; {again}"
    counted = state.metrics_samples
    if (state.folder / PREDICTIONS).is_file() and counted is not None and counted != count:
        return (
            f"unfinished: {PREDICTIONS} holds {count} samples but {METRICS} counts {counted} (it is stale: a later "
            f"run stopped before rewriting it); {again}"
        )
    if state.stale_lock:
        return (
            f"unfinished: a run was stopped here ({state.folder / LOCK} is left with no live holder; a finished run "
            f"deletes it); {again}"
        )
    return None


def run_folders(root: Path, notes: list[str]) -> list[Path]:
    """Every run folder (``budget<B>[-hash][~N]`` holding ``metrics.json`` or ``predictions.jsonl``) under
    ``root``, at any depth, symlinked folders followed (each real folder once). A folder that holds run files but
    is not a run folder, a broken link and a link loop are named in ``notes``; sweep summaries (``.sweeps``) are
    not run folders and are passed over."""
    found: list[Path] = []
    seen: dict[Path, Path] = {}
    for top, folders, files in os.walk(root, followlinks=True, onerror=lambda e: notes.append(_walk_note(e))):
        here = Path(top)
        real = here.resolve()
        if real in seen:
            notes.append(f"skipped {here}: the same folder as {seen[real]} (a link), read once")
            folders[:] = []
            continue
        seen[real] = here
        folders[:] = sorted(f for f in folders if f != ".sweeps")
        for name in sorted(f for f in files if (here / f).is_symlink() and not (here / f).exists()):
            notes.append(f"skipped {here / name}: a broken link (its target {os.readlink(here / name)} is gone)")
        if METRICS not in files and PREDICTIONS not in files:
            continue
        if here.name.startswith("budget"):
            found.append(here)
        else:
            notes.append(f"skipped {here}: it holds run files but is not a run folder (budget<B>[-hash])")
    return sorted(found)


def _walk_note(error: OSError) -> str:
    return f"skipped {error.filename}: cannot be read ({error.strerror or error})"
