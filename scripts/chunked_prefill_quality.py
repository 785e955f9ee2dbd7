"""Which policies survive chunked prefill: accuracy one-shot vs ``compression.prefill_chunk``, on the same prompts.

    nice -n 10 python scripts/chunked_prefill_quality.py            # micro suite at 2048 tokens, every native policy
    python scripts/chunked_prefill_quality.py --policies snapkv restkv --budgets 128 --chunks 512

For every policy, budget and chunk size (and one-shot prefill) it runs the accuracy benchmark through the normal
runner (each run in its usual results folder; a rerun resumes), then writes, under ``--summary``: a text table
(accuracy per chunk size, and chunked minus one-shot in points with 95 % paired bootstrap intervals over the same
prompts), the raw numbers as JSON and a figure of accuracy against chunk size, one line per policy and a panel per
budget. Policies that cannot be chunked (H2O's accumulated attention) are listed as refused, with the reason.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from restkv.eval.harness.run_folder import run_folder
from restkv.eval.harness.runner import RunSettings, run_benchmark
from restkv.eval.report.collect import folder_scores
from restkv.eval.report.uncertainty import paired_difference
from restkv.eval.run import CONFIGS

SKIPPED = ("full", "kvpress")
"""Left out of the default list: the full cache evicts nothing; kvpress needs a press named (policy.press)."""


def default_policies() -> list[str]:
    """Every policy and preset of ``configs/policy/`` (as `scripts/compare_policies.py --all` lists them) but
    `SKIPPED`; those chunked prefill refuses show as refused in the table."""
    from restkv.eval.report.compare import comparable_policies

    return [name for name in comparable_policies() if name not in SKIPPED]


TASKS = ["micro_single_2", "micro_multikey_1", "micro_multivalue", "passkey"]
ONE_SHOT = "one-shot"


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="micro-llama")
    parser.add_argument("--policies", nargs="+", default=None, help="default: default_policies()")
    parser.add_argument("--budgets", nargs="+", default=["128", "256"])
    parser.add_argument("--chunks", nargs="+", type=int, default=[512, 1024])
    parser.add_argument("--tasks", nargs="+", default=TASKS)
    parser.add_argument("--lengths", nargs="+", type=int, default=[2048])
    parser.add_argument("--samples", type=int, default=5, help="prompts per task")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default="results/runs", help="the runs' results folder")
    parser.add_argument("--summary", default="results/summaries/chunked-prefill-quality", help="output stem")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, policy: str, budget: str, chunk: int | None) -> Path:
    """Run (or resume) one configuration through the runner; its results folder."""
    hashed = [
        "bench=micro",
        f"bench.tasks=[{','.join(args.tasks)}]",
        f"bench.lengths=[{','.join(map(str, args.lengths))}]",
        f"bench.samples={args.samples}",
        f"bench.seed={args.seed}",
        *([f"compression.prefill_chunk={chunk}"] if chunk else []),
    ]
    overrides = [*hashed, f"model={args.model}", f"policy={policy}", f"budget={budget}", f"out_dir={args.out}"]
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    run_benchmark(cfg, RunSettings("micro", args.model, policy, overrides=hashed, out_dir=Path(args.out)))
    return run_folder(Path(args.out), "micro", args.model, policy, str(budget), hashed)


def collect(args: argparse.Namespace) -> dict:
    """Every configuration's per-sample scores (or the reason it was refused)."""
    modes: list[int | None] = [None, *args.chunks]
    scores: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    refused: dict[str, str] = {}
    total, done, started = len(args.policies) * len(args.budgets) * len(modes), 0, time.monotonic()
    for policy in args.policies:
        for budget in args.budgets:
            for chunk in modes:
                done += 1
                name = ONE_SHOT if chunk is None else str(chunk)
                print(f"\nquality: {done}/{total} {policy}@{budget} {name} ({time.monotonic() - started:.0f} s)")
                try:
                    folder = run(args, policy, budget, chunk)
                except (NotImplementedError, ValueError) as error:
                    if chunk is None:
                        raise
                    refused[policy] = str(error).splitlines()[0]
                    continue
                scores.setdefault(policy, {}).setdefault(budget, {})[name] = folder_scores(folder)
    return {"scores": scores, "refused": refused, "seconds": round(time.monotonic() - started, 1)}


def tables(args: argparse.Namespace, found: dict) -> str:
    modes = [ONE_SHOT, *map(str, args.chunks)]
    lines = [
        f"# nice -n 10 python scripts/chunked_prefill_quality.py ({found['seconds']} s; {args.model}, micro suite at "
        f"{'/'.join(map(str, args.lengths))} tokens, tasks {', '.join(args.tasks)}, {args.samples} prompts each, "
        f"seed {args.seed}, protocol query_aware: the question ends the last chunk)",
    ]
    for budget in args.budgets:
        lines += [
            "",
            f"budget {budget}: accuracy (%) by prefill; chunked minus one-shot (points) [95 % paired bootstrap]",
        ]
        header = f"{'policy':<18}" + "".join(f"{m:>10}" for m in modes)
        header += "".join(f"{'Δ ' + m:>24}" for m in modes[1:]) + "     n"
        lines += [header, "-" * len(header)]
        for policy in args.policies:
            if policy in found["refused"]:
                lines.append(f"{policy:<18}refused: {found['refused'][policy]}")
                continue
            cells = found["scores"].get(policy, {}).get(budget, {})
            row = f"{policy:<18}" + "".join(
                f"{100 * sum(cells[m].values()) / len(cells[m]):>10.1f}" if m in cells else f"{'-':>10}" for m in modes
            )
            for mode in modes[1:]:
                if mode in cells and ONE_SHOT in cells:
                    d = paired_difference(cells[mode], cells[ONE_SHOT])
                    row += f"{f'{d.mean:+.1f} [{d.low:+.1f}, {d.high:+.1f}]':>24}"
                else:
                    row += f"{'-':>24}"
            lines.append(row + f"{len(cells.get(ONE_SHOT, {})):>6}")
    return "\n".join(lines) + "\n"


def plot(args: argparse.Namespace, found: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [*map(str, sorted(args.chunks)), ONE_SHOT]
    figure, axes = plt.subplots(1, len(args.budgets), figsize=(6 * len(args.budgets), 4.8), squeeze=False)
    colors = plt.get_cmap("tab20")
    for ax, budget in zip(axes[0], args.budgets, strict=True):
        for index, policy in enumerate(args.policies):
            cells = found["scores"].get(policy, {}).get(budget, {})
            points = [(x, 100 * sum(cells[m].values()) / len(cells[m])) for x, m in enumerate(modes) if m in cells]
            if len(points) > 1:
                ax.plot(*zip(*points, strict=True), marker="o", color=colors(index % 20), label=policy)
        ax.set_xticks(range(len(modes)), [f"chunk {m}" if m != ONE_SHOT else m for m in modes])
        ax.set_xlabel("prefill")
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(0, 100)
        ax.set_title(f"{args.model}, budget {budget}")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    args.policies = args.policies or default_policies()
    found = collect(args)
    stem = Path(args.summary)
    stem.parent.mkdir(parents=True, exist_ok=True)
    text = tables(args, found)
    stem.with_suffix(".txt").write_text(text)
    stem.with_suffix(".json").write_text(json.dumps({"arguments": vars(args), **found}, indent=1) + "\n")
    plot(args, found, stem.with_suffix(".png"))
    print(text)
    print(f"results: {stem}.txt, .json, .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
