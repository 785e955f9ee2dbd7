"""The paper's figures from finished runs under ``results/``.

    python scripts/make_figures.py budgets --bench longbench --model llama-3.1-8b-instruct
    python scripts/make_figures.py sensitivity --knob alpha      # after experiment=sensitivity_alpha
    python scripts/make_figures.py sensitivity --knob scale      # after experiment=sensitivity_scale

``budgets``: average score against the KV budget, one line per policy (the paper's LongBench
figures). ``sensitivity``: ReST-KV's average against one knob, with the paper's reported values
for comparison. Figures are written to ``results/figures/`` (PNG and PDF).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eval.collect import RunResult, load_runs, select

# LongBench averages reported in the paper (Figure 5, Llama-3.1-8B-Instruct, budget 128), for comparison.
PAPER_SENSITIVITY = {
    "alpha": (
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
        [34.83, 35.25, 35.69, 35.58, 35.51, 35.57, 35.39, 35.24, 35.17],
    ),
    "scale": ([200, 400, 800, 1200, 1600, 2000, 2400, 3000], [35.00, 35.19, 35.74, 35.65, 35.61, 35.89, 35.57, 35.39]),
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: Path, name: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    for path in paths:
        fig.savefig(path, dpi=150)
    return paths


def budget_figure(runs: list[RunResult], bench: str, model: str, out: Path, variant: str | None) -> list[Path]:
    """Average score vs budget per policy; the full cache as a dashed line."""
    chosen = select(runs, bench=bench, model=model)
    variants = sorted({r.variant for r in chosen})
    if variant is None and len(variants) > 1:
        raise SystemExit(f"runs of {bench}/{model} come with different overrides {variants}; pick one with --variant")
    chosen = [r for r in chosen if r.variant == (variant if variant is not None else variants[0])] if chosen else []
    if not chosen:
        raise SystemExit(f"no runs of bench={bench} model={model} under the results folder")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for policy in dict.fromkeys(r.policy for r in chosen):
        points = sorted((float(r.budget), r.average) for r in chosen if r.policy == policy and r.budget.isdigit())
        if policy == "full":
            ax.axhline(points[0][1], color="black", linestyle="--", label="full cache")
            continue
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=policy)
    budgets = sorted({float(r.budget) for r in chosen if r.budget.isdigit()})
    ax.set_xscale("log", base=2)
    ax.set_xticks(budgets, [f"{b:g}" for b in budgets])
    ax.set_xlabel("KV budget (tokens per layer)")
    ax.set_ylabel(f"{bench} average")
    ax.set_title(model)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, out, f"{bench}-{model}-budgets")


def sensitivity_figure(runs: list[RunResult], bench: str, model: str, knob: str, out: Path) -> list[Path]:
    """ReST-KV's average against ``policy.<knob>``, next to the paper's values."""
    points = sorted(
        (float(r.config["policy"][knob]), r.average) for r in select(runs, bench=bench, model=model, policy="restkv")
    )
    if len({x for x, _ in points}) < 2:
        raise SystemExit(
            f"need ReST-KV runs at two or more values of policy.{knob} (run experiment=sensitivity_{knob})"
        )
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ax.plot([p[0] for p in points], [p[1] for p in points], marker="^", label="this harness")
    if knob in PAPER_SENSITIVITY and bench == "longbench":
        xs, ys = PAPER_SENSITIVITY[knob]
        ax.plot(xs, ys, linestyle=":", marker=".", color="gray", label="paper (Llama-3.1-8B, budget 128)")
    ax.set_xlabel(knob)
    ax.set_ylabel(f"{bench} average")
    ax.set_title(f"ReST-KV sensitivity to {knob} ({model})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, out, f"{bench}-{model}-sensitivity-{knob}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figure", choices=["budgets", "sensitivity"])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--bench", default="longbench")
    parser.add_argument("--model", default="llama-3.1-8b-instruct")
    parser.add_argument("--knob", default="alpha", help="policy knob for the sensitivity figure")
    parser.add_argument("--variant", default=None, help="the -<hash> suffix of the runs to plot, when several")
    parser.add_argument("--out", type=Path, default=None, help="default: <results>/figures")
    args = parser.parse_args()
    runs = load_runs(args.results)
    out = args.out or args.results / "figures"
    if args.figure == "budgets":
        paths = budget_figure(runs, args.bench, args.model, out, args.variant)
    else:
        paths = sensitivity_figure(runs, args.bench, args.model, args.knob, out)
    for path in paths:
        print(path)


if __name__ == "__main__":
    main()
