"""The end of a sweep (``eval/run.py -m ...``): one table of every run's score, after the jobs' own outputs.

Each job writes a one-line summary beside Hydra's bookkeeping of the sweep (``<sweep dir>/<job>/run.json``); the
callback reads them all once the sweep ends, whichever launcher ran the jobs (in this process or in workers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

JOB_SUMMARY = "run.json"


def write_job_summary(job_folder: Path, summary: dict[str, Any]) -> None:
    """This job's line of the sweep's table (called by the job once its run has finished; ``summary``: what
    `restkv.eval.harness.runner.run_benchmark` returned)."""
    job_folder.mkdir(parents=True, exist_ok=True)
    ran = summary.get("ran") or {}
    line = {
        "bench": summary.get("bench"),
        "model": summary.get("model"),
        "policy": summary.get("policy"),
        "budget": summary.get("budget"),
        "average": summary.get("average"),
        "samples": ran.get("samples"),
        "folder": summary.get("folder"),
    }
    (job_folder / JOB_SUMMARY).write_text(json.dumps(line) + "\n", encoding="utf-8")


def summary_table(sweep: Path) -> str:
    """Every finished job of the sweep in ``sweep`` as a table, in job order."""
    jobs = sorted(
        (p for p in sweep.glob(f"*/{JOB_SUMMARY}")), key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0
    )
    rows = [json.loads(p.read_text(encoding="utf-8")) for p in jobs]
    header = ("bench", "model", "policy", "budget", "average", "n", "folder")
    cells = [
        (
            str(r["bench"]),
            str(r["model"]),
            str(r["policy"]),
            str(r["budget"]),
            "-" if r["average"] is None else f"{r['average']:.2f}",
            str(r["samples"] or "-"),
            r["folder"],
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines.append("-" * len(lines[0]))
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)).rstrip() for cell in cells]
    return "\n".join(lines)


class SweepSummary(Callback):
    """Prints the sweep's table when it ends (configs/config.yaml registers it for every run)."""

    def __init__(self) -> None:
        self.sweep: Path | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.sweep = Path(str(config.hydra.sweep.dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = self.sweep or Path(str(config.hydra.sweep.dir))
        if not sweep.is_dir() or not any(sweep.glob(f"*/{JOB_SUMMARY}")):
            print("\nsweep summary: no run finished (see the jobs' errors above)")
            return
        print(f"\nsweep summary ({sweep}):")
        print(summary_table(sweep))
