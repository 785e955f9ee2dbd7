"""The policy comparison's report (``scripts/compare_policies.py``): which policies it compares, its interval
tables, its accuracy figure and the answer lengths of its runs.

The comparison itself is a sweep of ordinary runs (every cell lands in its usual run folder and resumes); this
module turns their summaries and folders into what is printed and drawn. Its policy list is derived, never
written: every policy and preset that has a config at the top of ``configs/policy/`` (the ablation rows are
settings of one policy), the full cache first, ``kvpress`` only where kvpress is installed.
"""

from __future__ import annotations

from pathlib import Path

from restkv.eval.harness.folder_state import read_folder
from restkv.eval.report.uncertainty import Interval, bootstrap_interval, paired_difference
from restkv.eval.run import CONFIGS

REFERENCE = "restkv"
"""The policy the paired tables subtract every other one from."""
FULL = "full"


def comparable_policies() -> list[str]:
    """Every top-level ``configs/policy/<name>.yaml`` (policies and presets), the full cache first; ``kvpress``
    only when kvpress is installed (it is an optional dependency)."""
    from restkv.interop import KVPressMissing, require_kvpress

    names = sorted(p.stem for p in (Path(CONFIGS) / "policy").glob("*.yaml"))
    try:
        require_kvpress()
    except KVPressMissing:
        names = [n for n in names if n != "kvpress"]
    return [FULL, *(n for n in names if n != FULL)] if FULL in names else names


def interval_grid(rows: list[str], budgets: list[str], cells: dict[tuple[str, str], Interval]) -> str:
    """Rows x budgets of ``mean [low, high]`` (points), the sample count once per row."""
    width = max(len("policy"), *(len(r) for r in rows))
    text = {key: f"{c.mean:5.1f} [{c.low:5.1f}, {c.high:5.1f}]" for key, c in cells.items()}
    column = max(len(t) for t in text.values()) if text else 8
    lines = [f"{'policy':<{width}}  " + "  ".join(f"{b:>{column}}" for b in budgets) + "      n"]
    lines.append("-" * len(lines[0]))
    for row in rows:
        counts = {cells[(row, b)].samples for b in budgets if (row, b) in cells}
        line = "  ".join(f"{text.get((row, b), '-'):>{column}}" for b in budgets)
        lines.append(f"{row:<{width}}  {line}  {'/'.join(map(str, sorted(counts))):>5}")
    return "\n".join(lines)


def intervals_text(policies: list[str], budgets: list[str], scores: dict[tuple[str, str], dict[str, float]]) -> str:
    """Accuracy with 95 % bootstrap intervals, and `REFERENCE` minus each other policy, paired on the same
    prompts (the second table only when the reference and another policy ran)."""
    cells = {key: bootstrap_interval(list(values.values())) for key, values in scores.items()}
    parts = ["\naccuracy (%) with 95 % bootstrap intervals over samples", interval_grid(policies, budgets, cells)]
    others = [p for p in policies if p != REFERENCE]
    if REFERENCE in policies and others:
        paired = {
            (other, budget): paired_difference(scores[(REFERENCE, budget)], scores[(other, budget)])
            for other in others
            for budget in budgets
            if (REFERENCE, budget) in scores and (other, budget) in scores
        }
        parts += [
            f"\n{REFERENCE} minus each policy (points), paired bootstrap over the same prompts (95 %)",
            interval_grid(others, budgets, paired),
        ]
    return "\n".join(parts)


def plot_accuracy(
    accuracy: dict[tuple[str, str], float], budgets: list[str], policies: list[str], path: Path, title: str
) -> Path:
    """Accuracy against the budget, one line per policy (the full cache dashed), saved as the PNG ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    x = [int(b) for b in budgets]
    for policy in policies:
        ys = [accuracy.get((policy, b)) for b in budgets]
        style = {"linestyle": "--", "color": "black"} if policy == FULL else {"marker": "o"}
        ax.plot(x, ys, label=policy, **style)
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [str(v) for v in x])
    ax.set_xlabel("KV budget (tokens per layer, window included)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def answer_length(folder: Path) -> float:
    """Mean generated tokens per answer of a run folder, read by the one reader of run folders: the runner's
    ``metrics.json`` entry, else (folders written before it recorded one) counted from the predictions."""
    return read_folder(Path(folder)).answer_length
