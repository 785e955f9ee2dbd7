"""The long-output and multi-turn figures, artifacts of the report (``make_figures.py lengths turns``, or
``scripts/plot_long_outputs.py``).

``long-outputs``: accuracy and mean answer length against the budget, one line per policy and eviction phase (the
decode budget for ``compression.phase=decode|both`` runs, the budget otherwise): low budgets can make answers
longer, so accuracy alone misleads. ``multi-turn``: accuracy of each turn of ``evaluation=multi_turn`` runs, one
line per policy and budget. Both read what the runner wrote into ``metrics.json`` (``answer_length``,
``turn_scores``) through the one reader of run folders (`restkv.eval.report.collect.load_runs`): runs in
progress, stopped or unreadable are left out, each named in the report's notes. Each figure is written as PNG
and PDF.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from restkv.eval.report.accuracy import Report
from restkv.eval.report.collect import RunResult, load_runs


class NothingToPlot(ValueError):
    """No run of the kind a figure draws (the message says which)."""


def finished_runs(root: Path, bench: str | None = None, notes: list[str] | None = None) -> list[RunResult]:
    """Every finished run under ``root`` (of ``bench`` when given); why each other folder is left out goes to
    ``notes``."""
    return [run for run in load_runs(root, notes) if bench is None or run.bench == bench]


def phase_and_budget(run: RunResult) -> tuple[str, int | float]:
    """The run's eviction phase and the budget that bounds its cache while it answers."""
    compression = run.config.get("compression") or {}
    phase = compression.get("phase", "prefill")
    budget = compression.get("decode_budget") if phase != "prefill" else run.config.get("budget", run.budget)
    return phase, budget


def plot_lengths(runs: list[RunResult], out: Path) -> list[Path]:
    """Accuracy (left) and mean answer length (right) against the budget, per policy and phase."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for run in runs:
        multi_turn = str((run.config.get("evaluation") or {}).get("_target_", "")).endswith("MultiTurn")
        if multi_turn or run.metrics.get("average") is None:
            continue
        phase, budget = phase_and_budget(run)
        label = f"{run.policy} ({phase})"
        series[label].append((float(budget), run.average, run.answer_length))
    if not series:
        raise NothingToPlot("no finished generation run under --runs (for --bench) to plot")
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for label, points in sorted(series.items()):
        points.sort()
        budgets = [p[0] for p in points]
        left.plot(budgets, [p[1] for p in points], marker="o", label=label)
        right.plot(budgets, [p[2] for p in points], marker="o", label=label)
    ticks = sorted({p[0] for points in series.values() for p in points})
    for axis, name in ((left, "accuracy (%)"), (right, "mean answer length (tokens)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(ticks, [f"{t:g}" for t in ticks])
        axis.set_xlabel("budget (tokens per layer)")
        axis.set_ylabel(name)
    right.legend(fontsize=8, bbox_to_anchor=(1.02, 1), loc="upper left")
    figure.suptitle("accuracy and answer length against the budget (decode-time runs: their decode budget)")
    return save(figure, out / "long-outputs-lengths")


def plot_turns(runs: list[RunResult], out: Path) -> list[Path]:
    """Accuracy of each turn, per policy and budget, for ``evaluation=multi_turn`` runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [(f"{r.policy} @ {r.budget}", r.metrics["turn_scores"]) for r in runs if r.metrics.get("turn_scores")]
    if not curves:
        raise NothingToPlot("no finished evaluation=multi_turn run under --runs to plot")
    figure, axis = plt.subplots(figsize=(6, 4))
    for label, scores in sorted(curves):
        axis.plot(range(1, len(scores) + 1), scores, marker="o", label=label)
    axis.set_xlabel("turn (questions on one compressed context)")
    axis.set_ylabel("accuracy (%)")
    axis.set_xticks(range(1, max(len(s) for _, s in curves) + 1))
    axis.legend(fontsize=8, bbox_to_anchor=(1.02, 1), loc="upper left")
    axis.set_title("accuracy per turn")
    return save(figure, out / "multi-turn")


def save(figure: Any, stem: Path) -> list[Path]:
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    for path in paths:
        figure.savefig(path, bbox_inches="tight", dpi=150)
    return paths


def lengths(report: Report) -> list[Path]:
    """The ``long-outputs`` artifact: `plot_lengths` of the report's runs (nothing when none is a generation run)."""
    return _drawn(plot_lengths, report)


def turns(report: Report) -> list[Path]:
    """The ``multi-turn`` artifact: `plot_turns` of the report's runs (nothing when none has turns)."""
    return _drawn(plot_turns, report)


def _drawn(draw: Any, report: Report) -> list[Path]:
    try:
        return draw(report.runs, report.out)
    except NothingToPlot:
        return []
