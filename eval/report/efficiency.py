"""Latency and memory against context, from the latency benchmark's records (``python -m restkv.eval.latency``).

Each record (``<out_dir>/<preset>.json``) is drawn as the benchmark draws it, in PNG and PDF, plus one
figure that puts the record's ratios to the full cache next to the paper's (Figure 6, Mistral-7B on a
GPU): absolute times of a CPU or of random-weight shapes are not comparable to the paper's, ratios are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from restkv.eval.report import paper
from restkv.eval.report.figures import PAPER_STYLE, legend, pyplot, save, title

RECORD_KEYS = ("settings", "machine", "model")


def latency_records(root: Path, notes: list[str] | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """Every latency record under ``root`` (JSON files with the benchmark's keys), by path.

    A JSON file that cannot be parsed (a benchmark stopped while writing it, a full disk) is named in
    ``notes`` rather than skipped unseen: it may be the record the reader was looking for.
    """
    found = []
    for path in sorted(Path(root).rglob("*.json")):
        if path.name in ("metrics.json", "identity.json") or ".sweeps" in path.parts:
            continue
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            if notes is not None:
                notes.append(
                    f"left out {path}: not readable JSON ({str(error).splitlines()[0]}); if it is a latency record, "
                    "run its benchmark again to rewrite it"
                )
            continue
        if (
            isinstance(record, dict)
            and all(k in record for k in RECORD_KEYS)
            and (record.get("prefill") or record.get("decode"))
        ):
            found.append((path, record))
    return found


def _ratios(
    entries: list[dict[str, Any]], name: str, value: str, within: str | None = None
) -> dict[str, tuple[list[float], list[float]]]:
    """Per series (``name`` field, full cache left out): context -> value / the full cache's at that context.

    With ``within`` (the decode records' ``cache`` kind), each series is divided by the full cache of its
    own kind and kept apart from the other kinds, so two cache layouts are never drawn as one line.
    """

    def kind(e: dict[str, Any]) -> str:
        return str(e.get(within, "")) if within else ""

    full = {(e["context"], kind(e)): e[value] for e in entries if e.get(name) == "full" and e.get(value)}
    kinds = {kind(e) for e in entries}
    series: dict[str, tuple[list[float], list[float]]] = {}
    for e in sorted(entries, key=lambda e: e["context"]):
        if e.get(name) in (None, "full") or not e.get(value) or (e["context"], kind(e)) not in full:
            continue
        label = str(e[name]) + (f" · {kind(e)} cache" if len(kinds) > 1 else "")
        xs, ys = series.setdefault(label, ([], []))
        xs.append(float(e["context"]))
        ys.append(e[value] / full[(e["context"], kind(e))])
    return series


def _panel(ax: Any, ours: dict[str, tuple[list[float], list[float]]], reported: paper.Reported, what: str) -> None:
    full = reported.y["full"]
    colors = {}
    for series, (xs, ys) in ours.items():
        (line,) = ax.plot(xs, ys, marker="o", label=f"{series} (this run)")
        colors[series] = line.get_color()
    for policy, values in reported.y.items():
        if policy == "full":
            continue
        style = {"color": colors[policy]} if policy in colors else {}
        ax.plot(
            reported.x,
            [v / f for v, f in zip(values, full, strict=True)],
            label=f"{policy} (paper)",
            **style,
            **PAPER_STYLE,
        )
    ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8, label="full cache")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel(f"{what} / full cache's")
    title(ax, what, 50)
    ax.grid(alpha=0.3)
    legend(ax, 6)


def efficiency(report: Any) -> list[Path]:
    """Each latency record's own figures (PNG and PDF), and its ratios to the full cache next to the paper's."""
    from restkv.eval.latency.plots import plot

    written: list[Path] = []
    for path, record in latency_records(report.root):
        stem = path.stem
        report.out.mkdir(parents=True, exist_ok=True)
        written += [f for png in plot(record, report.out / f"latency-{stem}") for f in (png, png.with_suffix(".pdf"))]
        decode = _ratios(record.get("decode") or [], "label", "ms_per_token_median", within="cache")
        memory = _ratios(record.get("prefill") or [], "policy", "peak_memory_bytes")
        if not decode and not memory:
            continue
        fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.2))
        _panel(axes[0], decode, paper.EFFICIENCY["decode_latency_seconds"], "decoding latency")
        _panel(axes[1], memory, paper.EFFICIENCY["peak_memory_gb"], "peak memory")
        fig.suptitle(
            f"{stem}: {record['model'].get('shape')} on {record['machine'].get('device')} · "
            f"dotted: {paper.EFFICIENCY_FIGURE}",
            fontsize=8,
        )
        written += save(fig, report.out, f"efficiency-{stem}-vs-paper")
    return written
