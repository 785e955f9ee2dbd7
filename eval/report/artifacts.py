"""The paper's artifacts as a registry: what each draws, and which runs (with the command) it needs.

``make_all`` draws every artifact whose runs exist under a results root and lists, for the paper's
own settings, the artifacts whose runs are missing with the command that makes them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from restkv.eval.harness.errors import naming
from restkv.eval.report import accuracy, efficiency, long_outputs
from restkv.eval.report.accuracy import Report
from restkv.eval.report.collect import load_runs
from restkv.eval.report.table import run_table, sample_frame, to_markdown

MICRO = "bash scripts/paper_micro.sh"


@dataclass(frozen=True)
class Needs:
    """Runs an artifact needs for one of the paper's settings: a bench and model present, and how to make them."""

    bench: str
    model: str
    command: str


@dataclass(frozen=True)
class Artifact:
    name: str
    description: str
    draw: Callable[[Report], list[Path]]
    needs: tuple[Needs, ...] = field(default_factory=tuple)


_LLAMA31 = "llama-3.1-8b-instruct"
ARTIFACTS: tuple[Artifact, ...] = (
    Artifact(
        "budgets",
        "average score against the budget per policy (LongBench figures)",
        accuracy.budgets,
        (
            Needs("longbench", _LLAMA31, "python eval/run.py experiment=longbench_llama3"),
            Needs("longbench", "llama-2-7b-chat", "python eval/run.py experiment=longbench_llama2"),
            Needs("longbench", "mistral-7b-instruct-v0.3", "python eval/run.py experiment=longbench_mistral"),
            Needs("micro", "micro-llama", MICRO),
        ),
    ),
    Artifact(
        "tasks",
        "per-task tables (LongBench, InfiniteBench)",
        accuracy.tasks,
        (
            Needs("longbench", _LLAMA31, "python eval/run.py experiment=longbench_llama3"),
            Needs("infinitebench", _LLAMA31, "python eval/run.py experiment=infinitebench_llama3"),
            Needs("micro", "micro-llama", MICRO),
        ),
    ),
    Artifact(
        "lengths",
        "average by context length (the RULER table)",
        accuracy.lengths,
        (
            Needs("ruler", _LLAMA31, "python eval/run.py experiment=ruler_llama3"),
            Needs("micro", "micro-llama", MICRO),
        ),
    ),
    Artifact(
        "niah",
        "needle heatmaps, one per policy, one colour scale",
        accuracy.niah,
        (
            Needs("niah", _LLAMA31, "python eval/run.py experiment=niah_llama3"),
            Needs("niah_micro", "micro-llama", "python eval/run.py experiment=paper_micro/niah"),
        ),
    ),
    Artifact(
        "ablation",
        "indicator / temporal / spatial ablation table",
        accuracy.ablation,
        (
            Needs("longbench", _LLAMA31, "python eval/run.py experiment=ablation_llama3"),
            Needs("micro", "micro-llama", "python eval/run.py experiment=paper_micro/ablation"),
        ),
    ),
    Artifact(
        "sensitivity",
        "ReST-KV against alpha and scale",
        accuracy.sensitivity,
        (
            Needs("longbench", _LLAMA31, "python eval/run.py experiment=sensitivity_alpha (and sensitivity_scale)"),
            Needs("micro", "micro-llama", "python eval/run.py experiment=paper_micro/alpha (and paper_micro/scale)"),
        ),
    ),
    Artifact(
        "paired",
        "ReST-KV minus each policy, paired bootstrap",
        accuracy.comparisons,
        (Needs("micro", "micro-llama", MICRO),),
    ),
    Artifact(
        "headwise",
        "head-wise allocations next to uniform ones",
        accuracy.headwise,
        (Needs("micro", "micro-llama", MICRO),),
    ),
    Artifact(
        "quantized",
        "quantized caches next to full-precision ones",
        accuracy.quantized,
        (Needs("micro", "micro-llama", "python eval/run.py experiment=paper_micro/quant"),),
    ),
    Artifact(
        "efficiency",
        "latency and memory against context, next to the paper's ratios",
        efficiency.efficiency,
        (Needs("latency", "", "python -m restkv.eval.latency latency=gpu-h200-paper (CPU: latency=tiny)"),),
    ),
    Artifact("long-outputs", "accuracy and answer length against the budget, per phase", long_outputs.lengths),
    Artifact("multi-turn", "accuracy of each turn of evaluation=multi_turn runs", long_outputs.turns),
)
NAMES = tuple(a.name for a in ARTIFACTS)


def build_report(root: Path, out: Path) -> Report:
    """Read every run under ``root`` once: the tidy table and the per-sample frame."""
    if not Path(root).is_dir():
        raise FileNotFoundError(f"--runs {root}: no such folder (run folders live under out_dir, default results/)")
    blocked = next((p for p in (Path(out), *Path(out).parents) if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise ValueError(f"--out {out}: {blocked} is a file, not a folder; choose another output folder")
    notes: list[str] = []
    runs = load_runs(Path(root), notes)
    efficiency.latency_records(Path(root), notes)  # only for the notes: a record that cannot be read is named
    return Report(run_table(root, runs=runs), sample_frame(runs), Path(out), Path(root), notes, runs)


def write_table(report: Report) -> list[Path]:
    """The tidy table as ``runs.csv`` and ``runs.md`` in the output folder."""
    report.out.mkdir(parents=True, exist_ok=True)
    csv, markdown = report.out / "runs.csv", report.out / "runs.md"
    write_atomically(csv, report.table.to_csv(index=False))
    write_atomically(markdown, to_markdown(report.table.drop(columns=["folder"])) + "\n")
    return [csv, markdown]


def write_atomically(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a full disk leaves the previous file (or none), never a truncated one."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with naming(path):
            tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _missing(artifact: Artifact, report: Report, drawn: list[Path]) -> list[Needs]:
    if artifact.name == "efficiency":
        return [] if drawn else list(artifact.needs)
    present = set(zip(report.table.bench, report.table.model, strict=True))
    return [n for n in artifact.needs if (n.bench, n.model) not in present or not drawn]


def make_all(report: Report, only: tuple[str, ...] = NAMES) -> tuple[dict[str, list[Path]], list[tuple[str, Needs]]]:
    """Draw the artifacts named in ``only``; return what each wrote and the (artifact, needs) still missing."""
    unknown = sorted(set(only) - set(NAMES))
    if unknown:
        raise ValueError(f"unknown artifact {', '.join(unknown)}; artifacts: {', '.join(NAMES)}")
    written: dict[str, list[Path]] = {"table": write_table(report)}
    missing: list[tuple[str, Needs]] = []
    for artifact in ARTIFACTS:
        if artifact.name in only:
            written[artifact.name] = artifact.draw(report)
            missing += [(artifact.name, n) for n in _missing(artifact, report, written[artifact.name])]
    return written, missing


def headline_markdown(table: pd.DataFrame) -> str:
    """Each run's headline row (average over tasks and lengths) as markdown, for printing."""
    rows = table[(table.task == "average") & (table.length == "all")].drop(columns=["folder", "task", "length"])
    return to_markdown(rows)
