"""Reading finished runs back: every run folder under a results root, as flat rows.

Folders are found and read by the one reader of run folders (`restkv.eval.harness.folder_state`): a run still
writing (its lock held), a stopped run (no ``metrics.json``, a stale one, or a lock left with no holder) and a
folder whose results the runner would refuse are left out of the report, each with a note saying why and what to
do; so is every folder skipped (`load_runs` collects the notes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from restkv.eval.harness.folder_state import FolderState, read_folder, run_folders, unfinished_reason
from restkv.eval.harness.run_folder import PREDICTIONS, PredictionsError, read_predictions


@dataclass
class RunResult:
    """One run folder's summary."""

    bench: str
    model: str
    policy: str
    budget: str
    variant: str
    """The hash suffix of other overrides ('' for none)."""
    metrics: dict[str, Any]
    folder: Path
    sibling: str = ""
    """``N`` of a ``<name>~N`` folder (``on_change=new_folder``: another experiment beside the first), else ''."""
    source: str = ""
    """The ``out_dir`` below the report's root when runs are nested in several ('' at the root itself)."""
    state: FolderState | None = None

    @property
    def records(self) -> dict[str, dict[str, Any]]:
        """The run's trusted per-sample records by id (empty when it kept none)."""
        return self.state.records if self.state is not None else read_predictions(self.folder / PREDICTIONS).records

    @property
    def config(self) -> dict[str, Any]:
        """The run's resolved configuration (``config.yaml``), e.g. ``config["policy"]["alpha"]``."""
        return (self.state if self.state is not None else read_folder(self.folder)).config

    @property
    def answer_length(self) -> float:
        """Mean generated tokens per answer."""
        return (self.state if self.state is not None else read_folder(self.folder)).answer_length

    @property
    def average(self) -> float:
        return float(self.metrics["average"])

    @property
    def budget_sort_key(self) -> tuple[int, float]:
        try:
            return (0, float(self.budget))
        except ValueError:
            return (1, 0.0)


def sample_scores(run: RunResult) -> dict[str, float]:
    """Each sample's score (0-1) by sample id, from the run's ``predictions.jsonl``."""
    return {key: float(record["score"]) for key, record in run.records.items()}


def folder_scores(folder: Path) -> dict[str, float]:
    """`sample_scores` of the run folder ``folder`` (refused, naming the line, where the runner would refuse it)."""
    path = folder / PREDICTIONS
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: per-sample scores (and their intervals) need it")
    found = read_predictions(path)
    if found.problems:
        raise PredictionsError(found.problems[0])
    return {key: float(record["score"]) for key, record in found.records.items()}


def load_runs(root: Path, notes: list[str] | None = None) -> list[RunResult]:
    """Every finished run under ``root``, at any depth (layout ``.../bench/model/policy.../budget<B>[-hash]``).

    Bench, model and policy come from ``metrics.json`` where it records them (so an ``out_dir`` nested
    in another results root reads right), else from the folder names. Folders left out (in progress,
    stopped before ``metrics.json``, results the runner would refuse) get a line in ``notes``.
    """
    runs, notes = [], notes if notes is not None else []
    for folder in run_folders(Path(root), notes):
        state = read_folder(folder)
        reason = unfinished_reason(state)
        if reason:
            notes.append(f"left out {folder}: {reason}")
            continue
        if state.predictions.unreadable:
            notes.append(
                f"{folder}: {len(state.predictions.unreadable)} unreadable line(s) in {PREDICTIONS} (a run stopped "
                "while writing) are not counted; run the same command again to redo those samples"
            )
        metrics = state.metrics or {}
        parts = folder.relative_to(root).parts
        named = all(metrics.get(key) for key in ("bench", "model", "policy"))
        if not named and len(parts) < 4:
            notes.append(f"left out {folder}: its metrics.json names no bench/model/policy and its path is too short")
            continue
        leaf, _, sibling = parts[-1].partition("~")
        budget, _, variant = leaf.removeprefix("budget").partition("-")
        bench = str(metrics["bench"] if named else parts[0])
        model = str(metrics["model"] if named else parts[1])
        policy = str(metrics["policy"] if named else "/".join(parts[2:-1]))
        depth = 3 + policy.count("/")  # bench / model / policy... / budget
        source = "/".join(parts[: max(0, len(parts) - 1 - depth)])
        runs.append(RunResult(bench, model, policy, budget, variant, metrics, folder, sibling, source, state))
    return runs


def select(runs: Iterable[RunResult], **where: str) -> list[RunResult]:
    """Runs whose named fields equal the given values (e.g. ``bench="ruler"``)."""
    return [r for r in runs if all(getattr(r, key) == value for key, value in where.items())]


def pivot(runs: list[RunResult], value: str = "average") -> tuple[list[str], list[str], dict[tuple[str, str], float]]:
    """Policies x budgets grid of ``value`` (``average`` or a task name)."""
    policies = list(dict.fromkeys(r.policy for r in runs))
    budgets = [r.budget for r in sorted(runs, key=lambda r: r.budget_sort_key)]
    budgets = list(dict.fromkeys(budgets))
    grid = {}
    for r in runs:
        grid[(r.policy, r.budget)] = r.average if value == "average" else float(r.metrics["tasks"][value])
    return policies, budgets, grid


def format_grid(policies: list[str], budgets: list[str], grid: dict[tuple[str, str], float], digits: int = 1) -> str:
    """Plain-text table, policies as rows and budgets as columns (missing cells shown as '-')."""
    width = max(len("policy"), *(len(p) for p in policies))
    lines = [f"{'policy':<{width}}  " + "  ".join(f"{b:>8}" for b in budgets)]
    lines.append("-" * len(lines[0]))
    for policy in policies:
        cells = [grid.get((policy, b)) for b in budgets]
        lines.append(f"{policy:<{width}}  " + "  ".join("       -" if c is None else f"{c:8.{digits}f}" for c in cells))
    return "\n".join(lines)
