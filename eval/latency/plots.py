"""Figures in the paper's style: latency vs context length, peak memory vs context length."""

from __future__ import annotations

import textwrap
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _series(entries: list[dict], key: Any, x: str, y: str) -> dict[str, tuple[list, list]]:
    series: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))
    for e in sorted(entries, key=lambda e: e[x]):
        if e.get(y) is None:
            continue
        xs, ys = series[key(e)]
        xs.append(e[x])
        ys.append(e[y])
    return dict(series)


def _prefill_name(e: dict) -> str:
    return e["policy"] if e["budget"] is None else f"{e['policy']} (budget {e['budget']})"


def _decode_name(e: dict) -> str:
    return f"{e['label']}, {e['cache']} cache"


def _scoring_name(e: dict) -> str:
    return f"{e['variant']} (budget {e['budget']})"


# record key -> (series name, time field, latency title, y label, what the peak memory is over)
PANELS: dict[str, tuple[Callable[[dict], str], str, str, str, str]] = {
    "prefill": (_prefill_name, "seconds_median", "prefill (eviction included)", "seconds", "the loaded model"),
    "decode": (_decode_name, "ms_per_token_median", "decoding", "ms per token", "the loaded model"),
    "scoring": (_scoring_name, "seconds_median", "one layer's eviction decision", "seconds", "its inputs"),
}


def _axis(ax: Any, series: dict[str, tuple[list, list]], title: str, ylabel: str, scale: float = 1.0) -> None:
    for name, (xs, ys) in series.items():
        ax.plot(xs, [v * scale for v in ys], marker="o", label=name)
    ax.set_title(title)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel(ylabel)
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _bounds(ax: Any, entries: list[dict]) -> None:
    """The decode panel's memory-bandwidth bounds, dashed."""
    bounds = _series(entries, lambda e: f"bound, {e['label']}", "context", "bound_ms")
    for (name, (xs, ys)), shade in zip(bounds.items(), ("black", "gray", "silver"), strict=False):
        ax.plot(xs, ys, linestyle="--", color=shade, alpha=0.8, label=f"{name} (bandwidth)")
    ax.legend(fontsize=7)


def _figure(panels: list[str], draw: Callable[[Any, str], None], title: str, path: Path) -> Path:
    """One figure with a panel per record key, ``draw(ax, key)`` filling each; saved to ``path``."""
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        draw(ax, panel)
    fig.suptitle(title, fontsize=9 if len(title) < 100 else 7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    fig.savefig(path.with_suffix(".pdf"))  # the PDF next to it, for papers
    plt.close(fig)
    return path


def _latency(ax: Any, record: dict[str, Any], panel: str) -> None:
    name, key, title, ylabel, _ = PANELS[panel]
    _axis(ax, _series(record[panel], name, "context", key), title, ylabel)
    if panel == "decode":
        _bounds(ax, record[panel])


def _memory(ax: Any, record: dict[str, Any], panel: str) -> None:
    name, _, _, _, over = PANELS[panel]
    series = _series(record[panel], name, "context", "peak_memory_delta_bytes")
    _axis(ax, series, f"peak memory of the {panel} over {over}", "GiB", scale=1 / 2**30)


def plot(record: dict[str, Any], stem: Path) -> list[Path]:
    """Write ``<stem>-latency.png`` and ``<stem>-memory.png``; return the paths written."""
    written = []
    subtitle = (
        f"{record['model']['shape']} ({record['model']['dtype']}, random weights) on {record['machine']['device']}"
    )
    panels = [p for p in PANELS if record.get(p)]
    if panels:
        path = stem.with_name(stem.name + "-latency.png")
        written.append(_figure(panels, lambda ax, p: _latency(ax, record, p), subtitle, path))
    memory = [p for p in panels if any(e["peak_memory_bytes"] for e in record[p])]
    if memory:
        path = stem.with_name(stem.name + "-memory.png")
        title = textwrap.fill(f"{subtitle}; {record['memory_method']}", 100)
        written.append(_figure(memory, lambda ax, p: _memory(ax, record, p), title, path))
    return written


if (
    __name__ == "__main__"
):  # redraw from saved records: python -m restkv.eval.latency.plots results/efficiency/<preset>.json
    import json
    import sys

    for name in sys.argv[1:]:
        print(*plot(json.loads(Path(name).read_text()), Path(name).with_suffix("")), sep="\n")
