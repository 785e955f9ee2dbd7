"""The capacity benchmark's record, table and plot (`restkv.eval.latency.capacity` measures).

The table has one row per (context, policy, budget): the largest batch that fit, total decode tokens per second
at that batch, time to first token, peak memory, the bandwidth bound's tokens per second at that batch and the
ratio to it, and the batch and throughput relative to the full cache at that context. The plot draws, per
context, throughput and batch against the budget's kept share of the context, one line per policy, the full
cache as a dashed line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from restkv.eval.latency.settings import Settings

BOUND_METHOD = (
    "bound tokens/s = batch / (bytes read per step / bandwidth); bytes read per step = parameter bytes (tied once; "
    "the input embedding is a row lookup) + every row's filled key/value bytes (kept tokens, plus half the timed "
    "steps' own); ratio_to_bound = measured tokens/s / bound tokens/s"
)


def summarize(settings: Settings, raw: dict[str, Any], command: str) -> dict[str, Any]:
    """The JSON record of a capacity run: settings, machine, method notes, entries with full-cache ratios."""
    entries = raw["entries"]
    full = {e["context"]: e for e in entries if e["tokens"] is None}
    for e in entries:
        base = full.get(e["context"])
        if base and base["batch"] and e is not base:
            e["batch_vs_full"] = round(e["batch"] / base["batch"], 3)
            if base.get("tokens_per_second"):
                e["throughput_vs_full"] = round(e["tokens_per_second"] / base["tokens_per_second"], 3)
    return {
        "preset": settings.name,
        "mode": "capacity",
        "command": command,
        "settings": settings.to_dict(),
        "model": {"shape": settings.shape, "layers": settings.layers, "dtype": settings.dtype, "weights": "random"},
        "device": raw["device"],
        "device_name": raw["device_name"],
        "bandwidth": raw["bandwidth"],
        "parameter_bytes_read_per_step": raw["parameter_bytes_read"],
        "memory_method": raw["memory"],
        "memory_cap_bytes": raw["memory_cap_bytes"],
        "bound_method": BOUND_METHOD,
        "entries": entries,
    }


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def table(record: dict[str, Any]) -> str:
    """The record as a Markdown table, with its method lines."""
    cap = record["memory_cap_bytes"]
    lines = [
        f"# Capacity: {record['model']['shape']} ({record['model']['dtype']}, random weights) on "
        f"{record['device_name']}",
        "",
        f"- memory: {record['memory_method']}" + (f" (cap {_mib(cap)} MiB)" if cap else ""),
        f"- bandwidth: {record['bandwidth']['copy_gbps']} GB/s copy, {record['bandwidth']['read_gbps']} GB/s read; "
        f"bound uses {record['settings']['bound_bandwidth']}",
        f"- {record['bound_method']}",
        f"- command: `{record['command']}`",
        "",
        "| context | policy | budget | kept/head | batch | tokens/s | vs full | batch vs full | TTFT s | peak MiB "
        "| bound tokens/s | ratio to bound |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in record["entries"]:
        capped = "+" if e.get("batch_capped") else ""
        lines.append(
            f"| {e['context']} | {e['policy']} | {e['budget']} | {e['kept_tokens_mean']:.0f} | {e['batch']}{capped} "
            f"| {e.get('tokens_per_second', 0):.1f} | {_ratio(e.get('throughput_vs_full'))} "
            f"| {_ratio(e.get('batch_vs_full'))} | {e['ttft_seconds']:.3f} | {_mib(e.get('peak_memory_bytes'))} "
            f"| {e.get('bound_tokens_per_second', 0):.1f} | {e.get('ratio_to_bound', 0):.3f} |"
        )
    if any(e.get("batch_capped") for e in record["entries"]):
        lines += ["", f"+: the search stopped at capacity_max_batch={record['settings']['capacity_max_batch']}"]
    return "\n".join(lines) + "\n"


def plot(record: dict[str, Any], stem: Path) -> list[Path]:
    """``<stem>.png``: per context, throughput and batch against the kept share, the full cache dashed."""
    contexts = sorted({e["context"] for e in record["entries"]})
    figure, axes = plt.subplots(2, len(contexts), figsize=(5 * len(contexts), 7), squeeze=False)
    for column, context in enumerate(contexts):
        entries = [e for e in record["entries"] if e["context"] == context]
        full = next((e for e in entries if e["tokens"] is None), None)
        for row, (key, label) in enumerate([("tokens_per_second", "decode tokens/s (all rows)"), ("batch", "batch")]):
            ax = axes[row][column]
            for policy in dict.fromkeys(e["policy"] for e in entries if e["tokens"] is not None):
                points = sorted(
                    (e["kept_tokens_mean"] / context, e.get(key) or 0)
                    for e in entries
                    if e["policy"] == policy and e["tokens"] is not None
                )
                ax.plot(*zip(*points, strict=True), marker="o", label=policy)
            if full is not None:
                ax.axhline(full.get(key) or 0, color="black", linestyle="--", label="full cache")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("kept share of the context")
            ax.set_ylabel(label)
            ax.set_title(f"context {context}")
            ax.grid(alpha=0.3)
        axes[0][column].legend(fontsize=8)
    figure.suptitle(f"Capacity: {record['model']['shape']} on {record['device_name']}")
    figure.tight_layout()
    path = stem.with_suffix(".png")
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return [path]
