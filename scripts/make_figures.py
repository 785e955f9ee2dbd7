"""The paper's figures and tables from finished runs, each with bootstrap intervals over samples.

    python scripts/make_figures.py table --runs results/            # the tidy table of every run
    python scripts/make_figures.py all --runs results/              # every artifact whose runs exist
    python scripts/make_figures.py budgets sensitivity --runs results/   # some of them

``table`` prints every run's headline row (average over tasks and lengths, 95% interval, samples)
and writes the whole tidy table (run x task x length bucket, with averages) as ``runs.csv`` and
``runs.md``. ``all`` (or artifact names) draws each artifact as PNG and PDF (tables also as markdown
and CSV), next to the paper's reported numbers where the paper gives them, and lists the paper's
settings whose runs are missing with the command that makes them. Output: ``<runs>/figures`` or
``--out``. Artifacts: see ``eval/report/artifacts.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from restkv.eval.harness.errors import guarded_script
from restkv.eval.report.artifacts import ARTIFACTS, NAMES, build_report, headline_markdown, make_all, write_table


def _parse(argv: list[str] | None) -> argparse.Namespace:
    choices = ["table", "all", *NAMES]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="+", metavar="WHAT", help=f"one or more of: {', '.join(choices)}")
    parser.add_argument("--runs", type=Path, default=Path("results"), help="results root (default: results)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <runs>/figures)")
    args = parser.parse_args(argv)
    unknown = [w for w in args.what if w not in choices]
    if unknown:
        parser.error(f"unknown {', '.join(unknown)}; choose from: {', '.join(choices)}")
    return args


@guarded_script(out="--out DIR")
def main(argv: list[str] | None = None) -> int:
    """Refusals (a missing or unwritable folder, a full disk) end with one line and exit 2, nothing half-written."""
    args = _parse(argv)
    report = build_report(args.runs, args.out or args.runs / "figures")
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.what == ["table"]:
        print(headline_markdown(report.table))
        print(*write_table(report), sep="\n")
        return 0
    only = NAMES if "all" in args.what else tuple(w for w in args.what if w != "table")
    written, missing = make_all(report, only)
    for name, paths in written.items():
        shown = [p for p in paths if p.suffix == ".png" or name == "table"]
        print(f"{name}: " + (", ".join(map(str, shown)) or "nothing (no runs fit)"))
    if missing:
        described = {a.name: a.description for a in ARTIFACTS}
        print("\nmissing runs (artifact · bench/model · command):")
        for name, needs in missing:
            where = f"{needs.bench}/{needs.model}" if needs.model else needs.bench
            print(f"  {name} ({described[name]}) · {where} · {needs.command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
