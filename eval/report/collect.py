"""Reading finished runs back: every ``metrics.json`` under a results root, as flat rows."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from restkv.eval.harness.run_folder import METRICS, PREDICTIONS


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

    @property
    def config(self) -> dict[str, Any]:
        """The run's resolved configuration (``config.yaml``), e.g. ``config["policy"]["alpha"]``."""
        import yaml

        path = self.folder / "config.yaml"
        return yaml.safe_load(path.read_text()) if path.exists() else {}

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
    """Each sample's score (0-1) by sample id, from the run's ``predictions.jsonl`` (the last line per id)."""
    return folder_scores(run.folder)


def folder_scores(folder: Path) -> dict[str, float]:
    """`sample_scores` of the run folder ``folder``."""
    path = folder / PREDICTIONS
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: per-sample scores (and their intervals) need it")
    scores: dict[str, float] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                record = json.loads(line)
                scores[str(record["id"])] = float(record["score"])
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(
                    f"{path}:{number}: not a prediction record with an id and a score ({error})"
                ) from error
    return scores


def load_runs(root: Path) -> list[RunResult]:
    """Every run under ``root``, at any depth (layout ``.../bench/model/policy.../budget<B>[-hash]/metrics.json``).

    Bench, model and policy come from ``metrics.json`` where it records them (so an ``out_dir`` nested
    in another results root reads right), else from the folder names.
    """
    runs = []
    for path in sorted(Path(root).rglob(METRICS)):
        folder = path.parent
        parts = folder.relative_to(root).parts
        if not parts[-1].startswith("budget") or ".sweeps" in parts:
            continue
        metrics = json.loads(path.read_text())
        named = all(metrics.get(key) for key in ("bench", "model", "policy"))
        if not named and len(parts) < 4:
            continue
        budget, _, variant = parts[-1].removeprefix("budget").partition("-")
        bench = str(metrics["bench"] if named else parts[0])
        model = str(metrics["model"] if named else parts[1])
        policy = str(metrics["policy"] if named else "/".join(parts[2:-1]))
        runs.append(RunResult(bench, model, policy, budget, variant, metrics, folder))
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
