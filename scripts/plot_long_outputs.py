"""Figures of long answers and reused caches, drawn from run folders (the report's ``long-outputs`` and
``multi-turn`` artifacts, `restkv.eval.report.long_outputs`).

    python scripts/plot_long_outputs.py lengths --runs results/ --bench math --out figures/
    python scripts/plot_long_outputs.py turns --runs results/ --out figures/

``lengths``: accuracy and mean answer length against the budget, one line per policy and eviction phase.
``turns``: accuracy of each turn of ``evaluation=multi_turn`` runs, one line per policy and budget. Every folder
left out (in progress, stopped, unreadable) is named on stderr; nothing to draw exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from restkv.eval.harness.errors import guarded_script
from restkv.eval.report.long_outputs import NothingToPlot, finished_runs, phase_and_budget, plot_lengths, plot_turns

__all__ = ["finished_runs", "main", "phase_and_budget"]


@guarded_script(out="--out DIR")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("figure", choices=["lengths", "turns"])
    parser.add_argument("--runs", type=Path, default=Path("results"), help="folder holding run folders")
    parser.add_argument("--bench", default=None, help="only runs of this benchmark (lengths)")
    parser.add_argument("--out", type=Path, default=Path("results/figures"), help="where the figures go")
    args = parser.parse_args(argv)
    if not args.runs.is_dir():
        parser.error(f"--runs {args.runs}: no such folder")
    notes: list[str] = []
    runs = finished_runs(args.runs, args.bench, notes)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    try:
        paths = plot_lengths(runs, args.out) if args.figure == "lengths" else plot_turns(runs, args.out)
    except NothingToPlot as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("\n".join(f"figure: {path}" for path in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
