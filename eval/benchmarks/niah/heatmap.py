"""The needle grid's heatmap, the one drawing of a NIAH-shaped run (``bench=niah`` and ``bench=niah_micro``).

`grid_report` is the benchmarks' ``report``: it turns a run's records into (length, depth, score) cells and writes
``heatmap.png`` into the run folder; `heatmap` draws any such cells; `COLOURS` is the red-yellow-green scale the
report's side-by-side heatmaps (`restkv.eval.report.figures.heatmap_row`) use as well.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

COLOURS = ("#F0496E", "#EBB839", "#0CD79F")
"""Low to high score; cells without a score are grey (`MISSING`)."""
MISSING = "#d9d9d9"


def colormap() -> Any:
    """The needle grid's colour map (matplotlib), `COLOURS` with grey for missing cells."""
    from matplotlib.colors import LinearSegmentedColormap

    return LinearSegmentedColormap.from_list("niah", list(COLOURS)).with_extremes(bad=MISSING)


def grid_report(records: list[dict[str, Any]], folder: Path, heading: str) -> dict[str, Any]:
    """Draw ``folder/heatmap.png`` from a run's records (their ``meta`` has the length and depth), titled
    ``heading: model · policy · budget``; returns the ``metrics.json`` entry naming it (nothing without records)."""
    cells = [
        {
            "context_length": r["meta"]["context_length"],
            "depth_percent": r["meta"]["depth_percent"],
            "score": r["score"],
        }
        for r in records
    ]
    if not cells:
        return {}
    run = f"{folder.parents[1].name} · {folder.parent.name} · {folder.name}"  # model · policy · budget
    heatmap(cells, folder / "heatmap.png", title=f"{heading}: {run}")
    return {"heatmap": "heatmap.png"}


def heatmap_title(title: str, results: list[dict[str, Any]]) -> str:
    """The heatmap's title with the average score in points, the unit of the run's table and ``metrics.json``."""
    average = 100 * sum(float(r["score"]) for r in results) / len(results)
    return f"{title} — average {average:.2f}"


def heatmap(results: list[dict[str, Any]], path: Path, title: str = "Needle in a Haystack") -> None:
    """Draw the usual NIAH heatmap of ``results`` and save it as a PNG at ``path``.

    Each result needs ``context_length``, ``depth_percent`` and ``score`` (0-1); repeated cells
    are averaged. x: context length, y: depth percent (0 % at the top), colour: score on a
    red-yellow-green scale; the title carries the average over all results.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not results:
        raise ValueError("no results to plot")
    lengths = sorted({int(r["context_length"]) for r in results})
    depths = sorted({float(r["depth_percent"]) for r in results})
    sums = [[0.0] * len(lengths) for _ in depths]
    counts = [[0] * len(lengths) for _ in depths]
    for r in results:
        row, col = depths.index(float(r["depth_percent"])), lengths.index(int(r["context_length"]))
        sums[row][col] += float(r["score"])
        counts[row][col] += 1
    grid = [
        [s / c if c else math.nan for s, c in zip(srow, crow, strict=True)]
        for srow, crow in zip(sums, counts, strict=True)
    ]
    cmap = colormap()
    width = min(20.0, max(6.0, 0.35 * len(lengths) + 3))
    height = min(10.0, max(4.0, 0.45 * len(depths) + 2))
    fig, ax = plt.subplots(figsize=(width, height))
    image = ax.imshow(grid, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(lengths)))
    every = max(1, math.ceil(len(lengths) / 20))
    ax.set_xticklabels([str(v) if i % every == 0 else "" for i, v in enumerate(lengths)], rotation=45, ha="right")
    ax.set_yticks(range(len(depths)))
    ax.set_yticklabels([f"{d:g}" for d in depths])
    ax.set_xticks([x - 0.5 for x in range(1, len(lengths))], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, len(depths))], minor=True)
    ax.grid(which="minor", color="grey", linestyle="--", linewidth=0.5)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel("Context length (tokens)")
    ax.set_ylabel("Depth percent")
    # wrapped to the figure's width: a long run name once ran off both sides
    wrapped = textwrap.fill(heatmap_title(title, results), width=int(9 * width))
    ax.set_title(wrapped, fontsize=10)
    fig.colorbar(image, ax=ax, label="Score")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
