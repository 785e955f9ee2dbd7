"""Drawing primitives shared by the report's artifacts: curves with interval bands, tables, heatmap rows."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pandas as pd

FORMATS = ("png", "pdf")
PAPER_STYLE = {"linestyle": ":", "marker": ".", "alpha": 0.8}
"""How the paper's reported values are drawn next to ours: dotted, same colour as our policy."""


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab10").colors + plt.get_cmap("tab20").colors[1::2]  # 20 policies, distinct first
    plt.rcParams["axes.prop_cycle"] = matplotlib.cycler(color=colors)
    return plt


def save(fig: Any, out: Path, name: str) -> list[Path]:
    """Write ``fig`` as ``<out>/<name>.png`` and ``.pdf`` and close it."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.{fmt}" for fmt in FORMATS]
    for path in paths:
        fig.savefig(path, dpi=150, bbox_inches="tight")
    pyplot().close(fig)
    return paths


def title(ax: Any, text: str, width: int = 70) -> None:
    """A title wrapped to the axes (long run names once ran off the figure)."""
    ax.set_title("\n".join(textwrap.fill(line, width) for line in text.splitlines()), fontsize=9)


def legend(ax: Any, size: int = 7, **options: Any) -> None:
    """The axes' legend, when something on them has a label; outside the plot when it is long."""
    handles = ax.get_legend_handles_labels()[0]
    if len(handles) > 6:
        options = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), **options}
    if handles:
        ax.legend(fontsize=size, **options)


def curve(ax: Any, points: pd.DataFrame, x: str, label: str, color: Any = None, **style: Any) -> Any:
    """``points``' score against ``x`` with its interval as a band; returns the line (for its colour)."""
    points = points.sort_values(x)
    xs = points[x].astype(float).to_numpy()
    (line,) = ax.plot(xs, points["score"], marker="o", label=label, color=color, **style)
    if points["score_low"].notna().any():
        ax.fill_between(xs, points["score_low"], points["score_high"], color=line.get_color(), alpha=0.08, lw=0)
    return line


def interval_text(row: Any) -> str:
    """``score [low, high]`` of a table row (just the score where it has no interval)."""
    if pd.isna(row["score_low"]):
        return f"{row['score']:.1f}"
    return f"{row['score']:.1f} [{row['score_low']:.1f}, {row['score_high']:.1f}]"


def table_figure(grid: pd.DataFrame, heading: str, out: Path, name: str, note: str = "") -> list[Path]:
    """``grid`` (strings; index as row labels) rendered as a figure table, plus its markdown and CSV."""
    from restkv.eval.report.table import to_markdown

    plt = pyplot()
    rows, cols = grid.shape
    fig, ax = plt.subplots(figsize=(min(28.0, 2.2 + 1.6 * (cols + 1)), 0.6 + 0.18 * (rows + 1)))
    ax.axis("off")
    cells = grid.to_numpy()
    table = ax.table(cellText=cells, rowLabels=list(grid.index), colLabels=list(grid.columns), loc="upper center")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    table.scale(1.0, 1.25)
    title(ax, heading + (f"\n{note}" if note else ""), width=max(60, 14 * (cols + 1)))
    out.mkdir(parents=True, exist_ok=True)
    markdown = to_markdown(grid.reset_index().rename(columns={"index": ""}))
    (out / f"{name}.md").write_text(f"{heading}\n\n{markdown}\n" + (f"\n{note}\n" if note else ""))
    grid.to_csv(out / f"{name}.csv")
    return [*save(fig, out, name), out / f"{name}.md", out / f"{name}.csv"]


def heatmap_row(grids: dict[str, pd.DataFrame], heading: str, out: Path, name: str) -> list[Path]:
    """One heatmap per entry of ``grids`` (depth x length, 0-100), side by side on one colour scale.

    The keys title the panels (the policy and its average with its interval).
    """
    from restkv.eval.benchmarks.niah.heatmap import colormap

    plt = pyplot()
    cmap = colormap()
    fig, axes = plt.subplots(1, len(grids), figsize=(3.6 * len(grids) + 1.2, 3.8), squeeze=False, sharey=True)
    image = None
    for ax, (label, grid) in zip(axes[0], grids.items(), strict=True):
        image = ax.imshow(grid.to_numpy(dtype=float), cmap=cmap, vmin=0, vmax=100, aspect="auto")
        ax.set_xticks(range(grid.shape[1]), [f"{c:g}" for c in grid.columns], rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(grid.shape[0]), [f"{d:g}" for d in grid.index], fontsize=7)
        ax.set_xlabel("context length (tokens)", fontsize=8)
        title(ax, label, width=40)
    axes[0][0].set_ylabel("needle depth (%)", fontsize=8)
    fig.colorbar(image, ax=list(axes[0]), label="score", shrink=0.9)
    fig.suptitle(textwrap.fill(heading, 40 * len(grids)), fontsize=9)
    return save(fig, out, name)
