"""Figures in the paper's style: latency vs context length, peak memory vs context length."""

from __future__ import annotations

import textwrap
from collections import defaultdict
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


def _axis(ax: Any, series: dict[str, tuple[list, list]], title: str, ylabel: str, scale: float = 1.0) -> None:
    for name, (xs, ys) in series.items():
        ax.plot(xs, [v * scale for v in ys], marker="o", label=name)
    ax.set_title(title)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel(ylabel)
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot(record: dict[str, Any], stem: Path) -> list[Path]:
    """Write ``<stem>-latency.png`` and ``<stem>-memory.png``; return the paths written."""
    written = []
    subtitle = (
        f"{record['model']['shape']} ({record['model']['dtype']}, random weights) on {record['machine']['device']}"
    )
    panels = [p for p in ("prefill", "decode") if record[p]]
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
        for ax, panel in zip(axes[0], panels, strict=True):
            if panel == "prefill":
                _axis(
                    ax,
                    _series(record["prefill"], _prefill_name, "context", "seconds_median"),
                    "prefill (eviction included)",
                    "seconds",
                )
            else:
                _axis(
                    ax,
                    _series(record["decode"], _decode_name, "context", "ms_per_token_median"),
                    "decoding",
                    "ms per token",
                )
                bounds = _series(record["decode"], lambda e: f"bound, {e['label']}", "context", "bound_ms")
                for (name, (xs, ys)), shade in zip(bounds.items(), ("black", "gray", "silver"), strict=False):
                    ax.plot(xs, ys, linestyle="--", color=shade, alpha=0.8, label=f"{name} (bandwidth)")
                ax.legend(fontsize=7)
        fig.suptitle(subtitle, fontsize=9)
        fig.tight_layout()
        path = stem.with_name(stem.name + "-latency.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    memory = [(p, record[p]) for p in ("prefill", "decode") if any(e["peak_memory_bytes"] for e in record[p])]
    if memory:
        fig, axes = plt.subplots(1, len(memory), figsize=(6 * len(memory), 4.2), squeeze=False)
        for ax, (panel, entries) in zip(axes[0], memory, strict=True):
            name = _prefill_name if panel == "prefill" else _decode_name
            _axis(
                ax,
                _series(entries, name, "context", "peak_memory_delta_bytes"),
                f"peak memory of the {panel} over the loaded model",
                "GiB",
                scale=1 / 2**30,
            )
        fig.suptitle(textwrap.fill(f"{subtitle}; {record['memory_method']}", 100), fontsize=7)
        fig.tight_layout()
        path = stem.with_name(stem.name + "-memory.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


if __name__ == "__main__":  # redraw from saved records: python -m eval.latency.plots results/efficiency/<preset>.json
    import json
    import sys

    for name in sys.argv[1:]:
        print(*plot(json.loads(Path(name).read_text()), Path(name).with_suffix("")), sep="\n")
