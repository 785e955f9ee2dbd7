"""A latency record (`restkv.eval.latency.records`) as plain-text tables and sentences, for the terminal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from restkv.eval.latency.headwise import layout_line
from restkv.eval.latency.records import SCORING_REFERENCES


def _shown(value: float | None, scale: float = 1.0, spec: str = ".3f", suffix: str = "") -> str:
    """``value * scale`` formatted by ``spec`` with ``suffix``, or ``-`` when it was not measured."""
    return "-" if value is None else f"{value * scale:{spec}}{suffix}"


def _gib(value: int | None) -> str:
    return _shown(value, 2**-30)


def _mib(value: int | None) -> str:
    return _shown(value, 2**-20, ".1f")


def _prefill_row(e: dict[str, Any]) -> str:
    return (
        f"{e['context']:>7}  {e['policy']:<12} {e['budget'] or '-':>6}  {e['seconds_median']:8.3f}"
        f"  {e['eviction_seconds_median']:10.4f}  {e['kept_tokens_mean']:>5}"
        f"  {_gib(e['cache_bytes_before_eviction'])} -> {_gib(e['cache_bytes_after_eviction'])}"
        f"  {_gib(e['peak_memory_delta_bytes']):>14}"
    )


def _decode_row(e: dict[str, Any]) -> str:
    return (
        f"{e['context']:>7}  {e['cache']:<12} {e['label']:<10} {e['ms_per_token_median']:8.2f}"
        f"  {_shown(e.get('attention_ms'), spec='.3f'):>7}  {_mib(e['cache_bytes_allocated']):>9}"
        f"  {e['bytes_read_per_step'] / 1e9:13.3f}  {e['bound_ms']:8.2f}  {e['achieved_over_bound']:14.2f}"
        f"  {_gib(e['peak_memory_delta_bytes']):>14}"
    )


def _scoring_row(e: dict[str, Any]) -> str:
    return (
        f"{e['context']:>7}  {e['budget']:>6}  {e['variant']:<13} {e['seconds_median']:9.4f}"
        f"  {_mib(e['peak_memory_bytes']):>9}  {_mib(e['peak_memory_delta_bytes']):>15}"
    )


TABLES: tuple[tuple[str, str, Callable[[dict[str, Any]], str]], ...] = (
    (
        "prefill",
        "prefill        context  policy        budget   seconds  eviction s  kept  cache before -> after GiB"
        "  peak delta GiB",
        _prefill_row,
    ),
    (
        "decode",
        "decode         context  cache         kept     ms/token  attn ms  alloc MiB  bytes/step GB  bound ms"
        "  achieved/bound  peak delta GiB",
        _decode_row,
    ),
    ("scoring", "scoring        context  budget  variant          seconds  peak MiB  over inputs MiB", _scoring_row),
)


def _header_lines(record: dict[str, Any]) -> list[str]:
    """The bandwidth a model-mode run measured, or the layer a scoring run timed."""
    if "bandwidth" in record:
        bw = record["bandwidth"]
        return [
            f"bandwidth: copy {bw['copy_gbps']:.1f} GB/s, read {bw['read_gbps']:.1f} GB/s "
            f"(end of run: copy {bw['end_of_run']['copy_gbps']:.1f}, read {bw['end_of_run']['read_gbps']:.1f}); "
            f"bound uses {bw['used_for_bound']}"
        ]
    layer, windows = record["model"]["layer"], sorted({v["window"] for v in record["variants"].values()})
    return [
        f"layer ({record['model']['shape']}): {layer['heads']} query heads, {layer['kv_heads']} key/value heads, "
        f"head_dim {layer['head_dim']}, hidden {layer['hidden']}; window {', '.join(map(str, windows))}; "
        f"{record['model']['dtype']} on {record['machine']['device']}, {record['machine']['threads']} threads",
        *(f"  {name}: {v['what']}" for name, v in record["variants"].items()),
    ]


def tables(record: dict[str, Any]) -> str:
    """Plain-text tables of a record, for the terminal."""
    lines = _header_lines(record)
    for key, header, row in TABLES:
        entries = record.get(key) or []
        lines += [f"\n{header}", *(f"{'':14} {row(e)}" for e in entries)] if entries else []
    lines += ratio_lines(record["ratios"])
    lines += [f"\nnote: {n}" for n in record["notes"]]
    return "\n".join(lines)


def _x(row: dict[str, Any], key: str) -> str:
    return _shown(row.get(key), suffix="x")


def _prefill_ratio(r: dict[str, Any]) -> str:
    return (
        f"  {r['context']:>6} tokens, {r['policy']}@{r['budget']}: prefill {_x(r, 'prefill_vs_snapkv')} SnapKV's "
        f"(paired {_x(r, 'prefill_vs_snapkv_paired')}, pooled forward {_x(r, 'prefill_vs_snapkv_pooled_forward')}),"
        f" {_x(r, 'prefill_vs_full')} the full cache's; peak memory {_x(r, 'peak_memory_vs_snapkv')} SnapKV's "
        f"(over the model: {_x(r, 'peak_memory_delta_vs_snapkv')}), {_x(r, 'peak_memory_vs_full')} the full cache's"
    )


def _decode_ratio(r: dict[str, Any]) -> str:
    if "layout" in r:
        return layout_line(r)
    if "slowdown" in r:
        kept = "full cache" if r["budget"] is None else f"budget {r['budget']}"
        return f"  {r['context']:>6} tokens, {kept}: dynamic cache {_x(r, 'slowdown')} the preallocated one's time"
    marginal = r["marginal_cache_read_gbps"]
    return (
        f"  {r['context']:>6} tokens, budget {r['budget']}, {r['cache']} cache: speedup {_x(r, 'speedup')} "
        f"over the full cache (paired {_x(r, 'speedup_paired')}), {_x(r, 'speedup_vs_best_full')} over the fastest "
        f"full cache ({r['best_full_cache']}); bound's speedup {_x(r, 'bound_speedup')}; "
        f"ratio {r['speedup_over_bound_speedup']:.3f}; full step {_x(r, 'full_achieved_over_bound')} its bound, "
        f"compressed {_x(r, 'compressed_achieved_over_bound')}; extra cache bytes read at "
        f"{'-' if marginal is None else f'{marginal:.1f} GB/s'}"
    )


def _scoring_ratio(r: dict[str, Any]) -> str:
    """Against each reference: medians, paired rounds, minimums (the least disturbed round of each), memory."""
    parts = [
        f"time {_x(r, f'time_vs_{name}')} {label} (paired {_x(r, f'time_vs_{name}_paired')}, "
        f"minimums {_x(r, f'time_vs_{name}_min')}), peak memory "
        f"{_x(r, f'peak_memory_vs_{name}')} (over the inputs: {_x(r, f'peak_memory_delta_vs_{name}')})"
        for name, label in SCORING_REFERENCES.items()
        if f"time_vs_{name}" in r
    ]
    return f"  {r['context']:>6} tokens, budget {r['budget']}, {r['variant']}: " + "; ".join(parts)


RATIO_LINES: dict[str, Callable[[dict[str, Any]], str]] = {
    "prefill": _prefill_ratio,
    "decode": _decode_ratio,
    "scoring": _scoring_ratio,
}


def ratio_lines(ratios: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The ratios as sentences (medians over rounds; "paired": median of per-round ratios)."""
    lines = []
    for kind, line in RATIO_LINES.items():
        rows = ratios.get(kind) or []
        lines += [f"\n{kind} ratios:", *map(line, rows)] if rows else []
    return lines
