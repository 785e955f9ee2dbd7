"""The paper's accuracy artifacts, each drawn from the tidy run table (:mod:`restkv.eval.report.table`).

Every function takes the :class:`Report` and returns the files it wrote (none when no runs fit).
Curves and heatmaps are drawn per (bench, model, variant), the variant being the hash of a run's other
overrides, so runs with different settings are never one curve; tables hold every run of a (bench,
model), a row's label naming its knobs and quantization, and its variant where labels would collide.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from restkv.eval.report import paper
from restkv.eval.report.collect import RunResult
from restkv.eval.report.figures import (
    PAPER_STYLE,
    curve,
    heatmap_row,
    interval_text,
    legend,
    pyplot,
    save,
    table_figure,
    title,
)
from restkv.eval.report.table import ALL, AVERAGE, interval
from restkv.eval.report.uncertainty import paired_difference

ABLATION_POLICIES = ("random", "snapkv", "restkv")
"""With ``ablation/*``: the rows of the indicator / temporal / spatial ablation (experiment=ablation_llama3)."""
REFERENCE = "restkv"
"""The policy every paired comparison is taken against."""


@dataclass
class Report:
    """What every artifact draws from: the tidy table, the per-sample frame, where figures go."""

    table: pd.DataFrame
    samples: pd.DataFrame
    out: Path
    root: Path
    notes: list[str] = field(default_factory=list)
    """Run folders left out, and why (in progress, stopped, untrustworthy results)."""
    runs: list[RunResult] = field(default_factory=list)
    """The finished runs the table was built from (the figures that draw from run summaries read them)."""

    def headline(self) -> pd.DataFrame:
        """One row per run: its average over tasks and lengths."""
        return self.table[(self.table.task == AVERAGE) & (self.table.length == ALL)]


def _numeric_budget(frame: pd.DataFrame) -> pd.DataFrame:
    budget = pd.to_numeric(frame["budget"], errors="coerce")
    return frame.assign(budget_value=budget)[budget.notna()]


def _stem(*parts: str) -> str:
    return "-".join(p.replace("/", "_") for p in parts if p)


def _label(row: pd.Series) -> str:
    """``policy (knobs, quantization, storage)``, then ``~N`` for a sibling folder and ``[source]`` for a nested
    out_dir: whatever tells two runs of one policy apart is in their labels."""
    extra = [row["knobs"]] if row["knobs"] else []
    extra += [row["quantization"]] if row["quantization"] != "none" else []
    extra += [row["storage"]] if row.get("storage") else []
    label = row["policy"] + (f" ({', '.join(extra)})" if extra else "")
    label += f" ~{row['sibling']}" if row.get("sibling") else ""
    return label + (f" [{row['source']}]" if row.get("source") else "")


def _knob_order(knobs: str) -> tuple[str, float, str]:
    """Sort key for a knobs string: by the first knob's name, then its value as a number when it is one."""
    name, _, value = knobs.split(",", 1)[0].partition("=")
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    return name, number, knobs


def _ordered(group: pd.DataFrame) -> pd.DataFrame:
    """Table rows in reading order: the full cache first, then by policy, budget, knobs (numerically),
    full precision before quantized."""
    keys = group.assign(
        not_full=group.policy != "full",
        budget_value=pd.to_numeric(group.budget, errors="coerce"),
        knob_order=group.knobs.map(_knob_order),
        quantized=group.quantization != "none",
    )
    columns = ["not_full", "policy", "budget_value", "knob_order", "quantized", "quantization"]
    return group.loc[keys.sort_values(columns, kind="stable").index]


def _row_labels(group: pd.DataFrame) -> list[str]:
    """``policy (knobs, quantization) @ budget`` per row (the full cache: no budget, one row however many
    budgets it ran at); the variant hash is added only where two runs' labels would otherwise be the same
    (they differ in a setting that is not a policy knob)."""
    base = [_label(r) if r["policy"] == "full" else f"{_label(r)} @ {r['budget']}" for _, r in group.iterrows()]
    variants: dict[str, set[str]] = {}
    for label, variant in zip(base, group.variant, strict=True):
        variants.setdefault(label, set()).add(variant)
    return [
        f"{label} [{variant or 'default'}]" if len(variants[label]) > 1 else label
        for label, variant in zip(base, group.variant, strict=True)
    ]


def _grid(group: pd.DataFrame, index: str, columns: str) -> pd.DataFrame:
    """``text`` cells pivoted to ``index`` x ``columns``, rows and columns in the order first met."""
    grid = group.pivot_table(index=index, columns=columns, values="text", aggfunc="first")
    names = list(dict.fromkeys(group[columns]))
    if all(str(name).isdigit() for name in names):  # budgets and lengths: in numeric order
        names.sort(key=int)
    return grid.reindex(index=list(dict.fromkeys(group[index])), columns=names)


def budgets(report: Report) -> list[Path]:
    """Average score against the budget, a line per policy with its interval band; the paper's, dotted."""
    written: list[Path] = []
    rows = _numeric_budget(report.headline())
    plt = pyplot()
    for (bench, model, variant), group in rows.groupby(["bench", "model", "variant"]):
        group = group[(group.knobs == "") & (group.quantization == "none") & (group.storage == "")]
        group = group.assign(series=[_label(r) for _, r in group.iterrows()])  # sibling and source runs apart
        spread = group.groupby("series").budget_value.transform("nunique")
        group = group[(group.policy == "full") | (spread >= 2)]  # a single-budget run is no curve
        if not (group.policy != "full").any():
            continue
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        reported = paper.LONGBENCH_AVERAGES.get(model) if bench == "longbench" else None
        for series, points in group.groupby("series", sort=False):
            policy = points.policy.iloc[0]
            if policy == "full" and series == "full":  # budget-free: one run stands for all budgets
                full = points.iloc[0]
                ax.axhline(full.score, color="black", linestyle="--", label=f"full cache (n={full.samples})")
                if pd.notna(full.score_low):
                    ax.axhspan(full.score_low, full.score_high, color="black", alpha=0.05, lw=0)
                continue
            line = curve(ax, points, "budget_value", f"{series} (n={points.samples.max()})")
            if reported and policy in reported.y:
                ax.plot(reported.x, reported.y[policy], color=line.get_color(), **PAPER_STYLE)
        if reported:
            ax.axhline(paper.LONGBENCH_FULL[model], color="gray", linestyle=":", label=f"dotted: {reported.source}")
        ax.set_xscale("log", base=2)
        ticks = sorted(set(group.budget_value) | (set(reported.x) if reported else set()))
        ax.set_xticks(ticks, [f"{b:g}" for b in ticks])
        ax.set_xlabel("KV budget (tokens per layer)")
        ax.set_ylabel(f"{bench} average (95% bootstrap band)")
        title(ax, f"{bench} · {model}" + (f" · variant {variant}" if variant else ""))
        ax.grid(alpha=0.3)
        legend(ax, 7)
        written += save(fig, report.out, _stem("budgets", bench, model, variant))
    return written


def tasks(report: Report) -> list[Path]:
    """Per-task table (policy @ budget x task, with intervals), the paper's LongBench / InfiniteBench layout."""
    written: list[Path] = []
    rows = report.table[report.table.length == ALL]
    for (bench, model), group in rows.groupby(["bench", "model"]):
        group = _ordered(group)
        group = group.assign(row=_row_labels(group), text=[interval_text(r) for _, r in group.iterrows()])
        order = [t for t in dict.fromkeys(group.task) if t != AVERAGE] + [AVERAGE]
        grid = _grid(group, "row", "task").reindex(columns=order)
        note = paper.NOT_IN_SOURCES if bench in ("longbench", "infinitebench") else ""
        heading = f"{bench} per task · {model}"
        written += table_figure(grid.fillna("-"), heading, report.out, _stem("tasks", bench, model), note)
    return written


def lengths(report: Report) -> list[Path]:
    """Average by context length (the RULER table of the authors' README), and as curves."""
    written: list[Path] = []
    rows = report.table[report.table.task == AVERAGE]
    for (bench, model), group in rows.groupby(["bench", "model"]):
        measured = sorted({int(x) for x in group.length if x != ALL and str(x).isdigit()})
        if len(measured) < 2:
            continue
        group = _ordered(group)
        group = group.assign(row=_row_labels(group)).drop_duplicates(["row", "length"])
        grid = _grid(group.assign(text=[interval_text(r) for _, r in group.iterrows()]), "row", "length")
        grid = grid.reindex(columns=[*map(str, measured), ALL]).rename(columns={ALL: "Avg."})
        note = ""
        if bench == "ruler" and model == "llama-3.1-8b-instruct":
            reported = paper.RULER_LLAMA31_1024
            for policy, values in reported.y.items():
                cells = dict(zip((str(int(x)) for x in reported.x), (f"{v:.2f}" for v in values), strict=True))
                grid.loc[f"paper: {policy} @ 1024"] = [cells.get(c, "-") for c in grid.columns[:-1]] + [
                    f"{paper.RULER_AVERAGES[policy]:.2f}"
                ]
            note = f"paper rows: {reported.source}"
        stem = _stem("lengths", bench, model)
        written += table_figure(grid.fillna("-"), f"{bench} by context length · {model}", report.out, stem, note)
        written += _length_curves(group[group.length != ALL], bench, model, report.out, stem)
    return written


def _length_curves(group: pd.DataFrame, bench: str, model: str, out: Path, stem: str) -> list[Path]:
    """One figure per budget: the policies at their defaults (the ablation rows have their own table)."""
    written: list[Path] = []
    ablated = group.policy.map(_is_ablation_variant)
    plain = group[(group.knobs == "") & (group.quantization == "none") & ~ablated]
    full = plain[plain.policy == "full"]
    for budget, rows in plain[plain.policy != "full"].groupby("budget", sort=False):
        written += _length_figure(
            pd.concat([full, rows]),
            f"{bench} by context length · {model} · budget {budget}",
            out,
            f"{stem}-curves-budget{budget}",
        )
    return written


def _length_figure(group: pd.DataFrame, heading: str, out: Path, stem: str) -> list[Path]:
    fig, ax = pyplot().subplots(figsize=(6.5, 4.2))
    for label, points in group.assign(length_value=group.length.astype(int)).groupby("row", sort=False):
        curve(ax, points, "length_value", label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("average over tasks (95% bootstrap band)")
    title(ax, heading)
    ax.grid(alpha=0.3)
    legend(ax, 6, ncol=2)
    return save(fig, out, stem)


def niah(report: Report) -> list[Path]:
    """Needle heatmaps, one per policy, side by side on one colour scale (per model, budget and variant)."""
    written: list[Path] = []
    samples = report.samples[report.samples.depth.notna()]
    for (bench, model, budget, variant), group in samples.groupby(["bench", "model", "budget", "variant"]):
        grids = {}
        for policy, cells in group.groupby("policy", sort=False):
            low, high = interval(cells.score.to_numpy(), cells.task.to_numpy())
            grid = cells.assign(length=cells.length.astype(int)).pivot_table(
                index="depth", columns="length", values="score", aggfunc="mean"
            )
            grids[f"{policy} {100 * cells.score.mean():.1f} [{low:.1f}, {high:.1f}] n={len(cells)}"] = 100 * grid
        needle = " (micro cued single needle, not the paper's sentence needle)" if bench == "niah_micro" else ""
        heading = f"{bench}{needle} · {model} · budget {budget}" + (f" · variant {variant}" if variant else "")
        written += heatmap_row(grids, heading, report.out, _stem("niah", bench, model, f"budget{budget}", variant))
    return written


def _scores(report: Report, folder: str) -> dict[str, float]:
    rows = report.samples[report.samples.folder == folder]
    return dict(zip(rows.id, rows.score, strict=True))


def _paired_row(report: Report, reference: pd.Series, other: pd.Series) -> str:
    if reference is None:
        return "-"
    try:
        diff = paired_difference(_scores(report, reference["folder"]), _scores(report, other["folder"]))
    except ValueError:
        return "-"
    return f"{diff.mean:+.1f} [{diff.low:+.1f}, {diff.high:+.1f}] n={diff.samples}"


def _is_ablation(policy: str) -> bool:
    return policy in ABLATION_POLICIES or policy.startswith("ablation/")


def _is_ablation_variant(policy: str) -> bool:
    return policy == "random" or policy.startswith("ablation/")


def ablation(report: Report) -> list[Path]:
    """The indicator / temporal / spatial ablation table: each row's average and its paired gap to ReST-KV."""
    written: list[Path] = []
    rows = report.headline()
    for (bench, model, budget, variant), group in rows.groupby(["bench", "model", "budget", "variant"]):
        group = group[group.policy.map(_is_ablation) & (group.knobs == "") & (group.quantization == "none")]
        if group.policy.str.startswith("ablation/").sum() < 1 or REFERENCE not in set(group.policy):
            continue
        reference = group[group.policy == REFERENCE].iloc[0]
        grid = pd.DataFrame(
            {
                "average [95% CI]": [interval_text(r) for _, r in group.iterrows()],
                f"minus {REFERENCE} (paired)": [_paired_row(report, reference, r) for _, r in group.iterrows()],
            },
            index=list(group.policy),
        )
        heading = f"ablation · {bench} · {model} · budget {budget}" + (f" · variant {variant}" if variant else "")
        note = paper.NOT_IN_SOURCES if bench == "longbench" else ""
        written += table_figure(
            grid, heading, report.out, _stem("ablation", bench, model, f"budget{budget}", variant), note
        )
    return written


def comparisons(report: Report) -> list[Path]:
    """ReST-KV minus every other policy, paired over the same prompts, per budget (mean [95% CI] n)."""
    written: list[Path] = []
    rows = report.headline()
    for (bench, model, variant), group in rows.groupby(["bench", "model", "variant"]):
        group = group[(group.knobs == "") & (group.quantization == "none")]
        references = {r["budget"]: r for _, r in group[group.policy == REFERENCE].iterrows()}
        others = group[(group.policy != REFERENCE) & group.budget.isin(references)]
        if others.empty:
            continue
        others = others.assign(text=[_paired_row(report, references[r["budget"]], r) for _, r in others.iterrows()])
        grid = _grid(others, "policy", "budget")
        heading = f"{REFERENCE} minus each policy, paired bootstrap over shared prompts · {bench} · {model}"
        stem = _stem("paired", bench, model, variant)
        written += table_figure(grid.fillna("-"), heading, report.out, stem, "points; budget columns")
    return written


def sensitivity(report: Report) -> list[Path]:
    """ReST-KV's average against alpha and scale (the other knobs at their defaults), error bars; the paper's."""
    from restkv.registry import policy_defaults

    written: list[Path] = []
    defaults = policy_defaults(REFERENCE)
    rows = report.headline()
    rows = rows[(rows.policy == REFERENCE) & (rows.quantization == "none")]
    for knob, reported in paper.SENSITIVITY.items():
        for (bench, model, budget), group in rows.groupby(["bench", "model", "budget"]):
            points = group[group.knobs.map(lambda k, knob=knob: k == "" or _only_knob(k, knob))]
            points = points.assign(value=[_knob_value(k, knob, defaults[knob]) for k in points.knobs])
            points = points.drop_duplicates("value")
            if points.value.nunique() < 2:
                continue
            fig, ax = pyplot().subplots(figsize=(6.5, 4.2))
            points = points.sort_values("value")
            spread = [points.score - points.score_low, points.score_high - points.score]
            label = f"this harness (n={points.samples.max()}, 95% CI)"
            ax.errorbar(points.value, points.score, yerr=spread, marker="^", capsize=3, label=label)
            twin = ax.twinx()
            (paper_line,) = twin.plot(reported.x, reported.y[REFERENCE], color="gray", **PAPER_STYLE)
            twin.set_ylabel("paper's average (right axis)", fontsize=7, color="gray")
            ax.set_xlabel(knob)
            ax.set_ylabel(f"{bench} average")
            title(ax, f"ReST-KV sensitivity to {knob} · {bench} · {model} · budget {budget}")
            ax.grid(alpha=0.3)
            ax.legend(
                [*ax.get_legend_handles_labels()[0], paper_line],
                [label, textwrap.fill(f"paper: {reported.source.removeprefix('paper ')}", 90)],
                fontsize=6,
                loc="upper center",
                bbox_to_anchor=(0.5, -0.14),
            )
            written += save(fig, report.out, _stem("sensitivity", knob, bench, model, f"budget{budget}"))
    return written


def _only_knob(knobs: str, knob: str) -> bool:
    return "," not in knobs and knobs.startswith(f"{knob}=")


def _knob_value(knobs: str, knob: str, default: float) -> float:
    return float(knobs.split("=", 1)[1]) if knobs.startswith(f"{knob}=") else float(default)


def _variants_grid(report: Report, keep: str, heading: str, stem: str) -> list[Path]:
    """Headline scores with intervals, rows a policy setting and columns budgets, for runs where ``keep`` varies."""
    written: list[Path] = []
    rows = report.headline()
    for (bench, model), group in rows.groupby(["bench", "model"]):
        if keep == "allocation" and (group.allocation == "uniform").all():
            continue
        group = _ordered(group[(group.knobs == "") & ~group.policy.map(_is_ablation_variant)])
        if keep == "quantization":
            group = group[group.policy.isin(set(group.policy[group.quantization != "none"]))]
            if group.empty:
                continue
        labels = [_label(r) + (f" [{r[keep]}]" if keep == "allocation" else "") for _, r in group.iterrows()]
        group = group.assign(row=labels)
        cache = group.cache_bytes.map(lambda b: "" if pd.isna(b) else f" · {b / 2**10:.0f} KiB")
        group = group.assign(text=[interval_text(r) for _, r in group.iterrows()] + cache)
        grid = _grid(group, "row", "budget").fillna("-")
        written += table_figure(
            grid,
            f"{heading} · {bench} · {model}",
            report.out,
            _stem(stem, bench, model),
            "score [95% CI] · mean cache allocated per sample",
        )
    return written


def headwise(report: Report) -> list[Path]:
    """Head-wise budget allocations (AdaKV, HeadKV, ...) next to the uniform ones."""
    return _variants_grid(report, "allocation", "head-wise allocations", "headwise")


def quantized(report: Report) -> list[Path]:
    """Quantized caches (KIVI, KVQuant) next to full-precision ones, with the bytes each keeps."""
    return _variants_grid(report, "quantization", "quantized caches", "quantized")
