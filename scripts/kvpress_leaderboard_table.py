"""The kvpress-leaderboard table of every policy run by ``experiment=kvpress_leaderboard[_micro]``, in one command.

    python scripts/kvpress_leaderboard_table.py --runs results --model micro-llama
    python scripts/kvpress_leaderboard_table.py --runs results --model llama-3.1-8b-instruct \\
        --kvpress-out results/kvpress_format --hub-model meta-llama/Llama-3.1-8B-Instruct

Reads each run folder ``<runs>/<bench>/<model>/<policy>/budget<B>[...]/predictions.jsonl`` and prints a
Markdown table: one row per policy, one column per compression ratio (``1 - budget``, kvpress's axis), each
cell the mean score in points and, for every policy but ReST-KV, its paired difference to ReST-KV at that
ratio with a 95 % bootstrap interval over the prompts both answered (`restkv.eval.report.uncertainty`).
``--kvpress-out`` also writes every run in kvpress's evaluation layout (its ``evaluate.py``):
``<dataset>__<data_dir>__<org--name>__<press>__<ratio>/predictions.csv`` and ``metrics.json`` (per task,
``{"string_match": points}``), so a number computed here can be set beside theirs.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

from restkv.eval.report.uncertainty import bootstrap_interval, paired_difference

REFERENCE = "restkv"


def runs(root: Path, model: str) -> dict[tuple[str, float], list[dict]]:
    """(policy, budget) -> the run's records, for every finished folder of ``model`` under ``root``."""
    found: dict[tuple[str, float], list[dict]] = {}
    for path in sorted(root.glob(f"*/{model}/*/budget*/predictions.jsonl")):
        budget = float(path.parent.name.removeprefix("budget").split("-")[0].split("~")[0])
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if records:
            found[(path.parent.parent.name, budget)] = records
    return found


def ratio_of(budget: float) -> float:
    return round(1.0 - budget, 4)


def table(found: dict[tuple[str, float], list[dict]]) -> str:
    """The Markdown table (see the module's docstring)."""
    budgets = sorted({budget for _, budget in found}, reverse=True)
    policies = sorted({policy for policy, _ in found}, key=lambda p: (p != REFERENCE, p))
    head = "| policy | " + " | ".join(f"ratio {ratio_of(b):g}" for b in budgets) + " |"
    lines = [head, "|" + " --- |" * (len(budgets) + 1)]
    for policy in policies:
        cells = []
        for budget in budgets:
            records = found.get((policy, budget))
            if records is None:
                cells.append("")
                continue
            mean = bootstrap_interval([float(r["score"]) for r in records])
            cell = f"{mean.mean:.1f} (n={mean.samples})"
            reference = found.get((REFERENCE, budget))
            if policy != REFERENCE and reference is not None:
                delta = paired_difference(
                    {r["id"]: float(r["score"]) for r in records}, {r["id"]: float(r["score"]) for r in reference}
                )
                cell += f"; {delta.mean:+.1f} [{delta.low:+.1f}, {delta.high:+.1f}]"
            cells.append(cell)
        lines.append(f"| `{policy}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_kvpress_layout(found: dict[tuple[str, float], list[dict]], out: Path, hub_model: str, data_dir: str) -> int:
    """Every run as kvpress's evaluate.py would save it; returns the folders written."""
    for (policy, budget), records in found.items():
        folder = out / "__".join(["ruler", data_dir, hub_model.replace("/", "--"), policy, f"{ratio_of(budget):.2f}"])
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "predictions.csv").open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["task", "answer", "predicted_answer", "compression_ratio"])
            for record in records:
                writer.writerow(
                    [record["task"], json.dumps(record["references"]), record["prediction"], ratio_of(budget)]
                )
        by_task: dict[str, list[float]] = defaultdict(list)
        for record in records:
            by_task[record["task"]].append(float(record["score"]))
        metrics = {task: {"string_match": round(100 * sum(s) / len(s), 2)} for task, s in sorted(by_task.items())}
        (folder / "metrics.json").write_text(json.dumps(metrics, indent=4), encoding="utf-8")
    return len(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("results"), help="the runs' out_dir")
    parser.add_argument("--model", default="micro-llama", help="the model's config name (its folder)")
    parser.add_argument("--kvpress-out", type=Path, default=None, help="also write kvpress's evaluation layout here")
    parser.add_argument("--hub-model", default=None, help="the model's hub id in kvpress's folder names")
    parser.add_argument("--data-dir", default="4096", help="kvpress's data_dir in its folder names")
    args = parser.parse_args(argv)
    found = runs(args.runs, args.model)
    if not found:
        print(f"error: no run folders of model {args.model!r} under {args.runs}", file=sys.stderr)
        return 2
    print(table(found))
    if args.kvpress_out is not None:
        count = write_kvpress_layout(found, args.kvpress_out, args.hub_model or args.model, args.data_dir)
        print(f"wrote {count} runs in kvpress's layout under {args.kvpress_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
