"""Medians, bounds and ratios of a latency run (model or scoring mode): the JSON record (its printed tables:
`restkv.eval.latency.tables`)."""

from __future__ import annotations

import statistics
from typing import Any

from restkv.eval.latency.bounds import bound_ms, decode_bytes
from restkv.eval.latency.headwise import ATTENTION_NOTE, layout_ratios
from restkv.eval.latency.scoring_mode import AUTHORS
from restkv.eval.latency.settings import Settings
from restkv.eval.latency.timing import FULL, scoring_fields

ALTERNATION_NOTE = "times are medians over timed rounds that alternate every configuration (A B C A B C ...)"
SCORING_NOTE = (
    "one attention layer with random inputs of the shape's sizes; timed: the policy's eviction decision (scores + "
    "top-k) alone; every configuration runs once per round in a fresh process: one untimed call under the "
    "peak-memory probe, then scoring_calls timed calls (the round's time is their median)"
)
SCORING_REFERENCES = {"snapkv": "SnapKV's", AUTHORS: "the authors' formulation's"}
"""The references a scoring variant is compared with, as the tables name them."""
SYNTHETIC_NOTE = (
    "decode caches were filled with synthetic random keys/values of the shape a prefill (and eviction to the "
    "budget) leaves, not by running a prefill; decode cost does not depend on the cached values"
)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _paired_ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of a/b, each round's pair measured back to back."""
    return _median([x / y for x, y in zip(a, b, strict=True) if y > 0])


def prefill_entry(run: dict[str, Any], token_bytes: int) -> dict[str, Any]:
    job, timed = run["job"], run["timed"]
    seconds = [t["seconds"] for t in timed]
    evictions = [t["eviction_seconds"] for t in timed]
    cache = timed[0]["cache"]
    entry = {
        "context": job["context"],
        "policy": job["policy"],
        "budget": job["budget"],
        "seconds_median": round(_median(seconds), 6),
        "seconds": [round(s, 6) for s in seconds],
        "eviction_seconds_median": round(_median(evictions), 6),
        "eviction_seconds": [round(s, 6) for s in evictions],
        "forward_seconds_median": round(_median([a - b for a, b in zip(seconds, evictions, strict=True)]), 6),
        "kept_tokens_mean": cache["tokens_mean"],
        "cache_bytes_before_eviction": job["context"] * token_bytes,
        "cache_bytes_after_eviction": cache["logical"],
        "cache_bytes_allocated": cache["allocated"],
        **_per_layer(cache),
    }
    entry.update(_memory_fields(run.get("memory")))
    entry.update(scoring_fields(timed))
    return entry


def _per_layer(cache: dict[str, Any]) -> dict[str, Any]:
    """Per-layer logical/allocated bytes and the layer classes, where the measurement recorded them."""
    if "logical_per_layer" not in cache:
        return {}
    return {
        "cache_bytes_per_layer": {"logical": cache["logical_per_layer"], "allocated": cache["allocated_per_layer"]},
        "cache_layer_kinds": cache["layer_kinds"],
    }


def _significant(value: float, digits: int = 6) -> float:
    """Round to significant digits, so that ratios recomputed from stored values stay exact at any scale."""
    return float(f"{value:.{digits}g}")


def decode_entry(run: dict[str, Any], settings: Settings, parameter_bytes: int, bandwidth: dict) -> dict[str, Any]:
    job, timed = run["job"], run["timed"]
    per_token = [t["seconds_per_token"] * 1e3 for t in timed]
    cache = timed[0]["cache"]
    read = decode_bytes(
        parameter_bytes,
        cache.get("read", cache["logical"]),
        cache["per_token"],
        settings.decode_warmup_tokens,
        settings.decode_tokens,
    )
    read_cache = read - parameter_bytes
    gbps = bandwidth[f"{settings.bound_bandwidth}_gbps"]
    bound = bound_ms(read, gbps)
    measured = _median(per_token)
    entry = {
        "context": job["context"],
        "budget": job["budget"],
        "label": "full" if job["budget"] is None else f"budget {job['budget']}",
        "cache": job["cache"],
        "fill": settings.decode_fill,
        "tokens": settings.decode_tokens,
        "ms_per_token_median": _significant(measured),
        "ms_per_token": [round(x, 4) for x in per_token],
        "cache_tokens_start": cache["tokens_mean"],
        "cache_bytes_start": cache["logical"],
        "cache_bytes_allocated": cache["allocated"],
        "cache_bytes_reserve": cache.get("reserve", 0),
        **_per_layer(cache),
        "parameter_bytes_read": parameter_bytes,
        "bytes_read_per_step": round(read),
        "bound_ms": _significant(bound),
        "bound_bandwidth_gbps": gbps,
        "achieved_over_bound": _significant(measured / bound),
    }
    attention = [t["attention_ms"] for t in timed if t.get("attention_ms") is not None]
    if attention:
        entry["attention_ms"] = _significant(_median(attention))
    entry.update(_memory_fields(run.get("memory")))
    if run.get("profile"):
        entry["profile_top_ops"] = run["profile"]
        attention = sum(op["ms_per_step"] for op in run["profile"] if "attention" in op["op"])
        if attention:
            entry["attention_ms_per_step"] = round(attention, 4)
            entry["attention_cache_read_gbps"] = round(read_cache / (attention / 1e3) / 1e9, 3)
    return entry


def _memory_fields(measured: dict[str, Any] | None) -> dict[str, Any]:
    if measured is None:
        return {"peak_memory_bytes": None, "peak_memory_delta_bytes": None}
    return {"peak_memory_bytes": measured["peak_bytes"], "peak_memory_delta_bytes": measured["delta_bytes"]}


def _versus(prefix: str, name: str, e: dict, ref: dict, own: list[float], other: list[float]) -> dict[str, float]:
    """``e`` against ``ref``: time as a ratio of medians and paired, peak memory (process and over the baseline)."""
    row = {
        f"{prefix}_vs_{name}": round(e["seconds_median"] / ref["seconds_median"], 4),
        f"{prefix}_vs_{name}_paired": round(_paired_ratio(own, other), 4),
    }
    if e["peak_memory_delta_bytes"] and ref["peak_memory_delta_bytes"]:
        row[f"peak_memory_delta_vs_{name}"] = round(e["peak_memory_delta_bytes"] / ref["peak_memory_delta_bytes"], 4)
        row[f"peak_memory_vs_{name}"] = round(e["peak_memory_bytes"] / ref["peak_memory_bytes"], 4)
    return row


def prefill_ratios(entries: list[dict], raw: dict[tuple, list[float]]) -> list[dict[str, Any]]:
    """Every evicting policy against SnapKV and the full cache, per context and budget."""
    ratios = []
    by_key = {(e["context"], e["policy"], e["budget"]): e for e in entries}
    forward = {  # the model's forward is the same computation under every policy: pool it per context
        context: _median([e["forward_seconds_median"] for e in entries if e["context"] == context])
        for context in {e["context"] for e in entries}
    }
    for e in entries:
        if e["budget"] is None:
            continue
        row: dict[str, Any] = {"context": e["context"], "policy": e["policy"], "budget": e["budget"]}
        for ref_name, ref_key in (
            ("snapkv", (e["context"], "snapkv", e["budget"])),
            ("full", (e["context"], FULL, None)),
        ):
            ref = by_key.get(ref_key)
            if ref is None or ref is e:
                continue
            own, other = raw[(e["context"], e["policy"], e["budget"])], raw[ref_key]
            row.update(_versus("prefill", ref_name, e, ref, own, other))
            pooled = forward[e["context"]]
            row[f"prefill_vs_{ref_name}_pooled_forward"] = round(
                (pooled + e["eviction_seconds_median"]) / (pooled + ref["eviction_seconds_median"]), 4
            )
        if len(row) > 3:
            ratios.append(row)
    return ratios


def _marginal(full: dict, compressed: dict) -> float | None:
    extra_seconds = (full["ms_per_token_median"] - compressed["ms_per_token_median"]) / 1e3
    extra_bytes = full["bytes_read_per_step"] - compressed["bytes_read_per_step"]
    return round(extra_bytes / extra_seconds / 1e9, 3) if extra_seconds > 0 else None


def skipped_budgets(settings: Any) -> list[str]:
    """A note per (context, budget) left out because the budget keeps the whole context (nothing to evict)."""
    notes = []
    for context in settings.contexts:
        for kind, budgets in (("prefill", settings.budgets), ("decode", settings.decode_budgets)):
            left = [b for b in budgets if b >= context]
            if left:
                notes.append(
                    f"{kind} at {context} tokens: budget(s) {', '.join(map(str, left))} not measured, they keep the "
                    "whole context (a budget must be below the context to evict anything)"
                )
    return notes


def decode_ratios(entries: list[dict], raw: dict[tuple, list[float]]) -> list[dict[str, Any]]:
    """Compressed vs full decoding per context and cache kind: measured speedup against the bound's."""
    ratios = []
    full = {(e["context"], e["cache"]): e for e in entries if e["budget"] is None}
    fastest: dict[int, dict] = {}  # per context, the full cache's fastest kind: the honest baseline
    for (context, _), f in full.items():
        if context not in fastest or f["ms_per_token_median"] < fastest[context]["ms_per_token_median"]:
            fastest[context] = f
    for e in entries:
        ref = full.get((e["context"], e["cache"]))
        if e["budget"] is None or ref is None:
            continue
        best = fastest[e["context"]]
        speedup = ref["ms_per_token_median"] / e["ms_per_token_median"]
        bound_speedup = ref["bound_ms"] / e["bound_ms"]
        own, other = raw[(e["context"], e["budget"], e["cache"])], raw[(e["context"], None, e["cache"])]
        ratios.append(
            {
                "context": e["context"],
                "budget": e["budget"],
                "cache": e["cache"],
                "speedup": round(speedup, 4),
                "speedup_paired": round(1 / _paired_ratio(own, other), 4),
                "best_full_cache": best["cache"],
                "speedup_vs_best_full": round(best["ms_per_token_median"] / e["ms_per_token_median"], 4),
                "bound_speedup": round(bound_speedup, 4),
                "speedup_over_bound_speedup": round(speedup / bound_speedup, 4),
                "full_achieved_over_bound": ref["achieved_over_bound"],
                # the cache bytes the full step reads beyond the compressed one, over the time they add
                "marginal_cache_read_gbps": _marginal(ref, e),
                "compressed_achieved_over_bound": e["achieved_over_bound"],
            }
        )
    for e in entries:  # the cache implementation itself: dynamic (concatenation) vs preallocated
        if e["cache"] == "dynamic":
            other_kind = next(
                (
                    o
                    for o in entries
                    if o["context"] == e["context"] and o["budget"] == e["budget"] and o["cache"] == "preallocated"
                ),
                None,
            )
            if other_kind is not None:
                ratios.append(
                    {
                        "context": e["context"],
                        "budget": e["budget"],
                        "cache": "dynamic/preallocated",
                        "slowdown": round(e["ms_per_token_median"] / other_kind["ms_per_token_median"], 4),
                    }
                )
    return ratios + layout_ratios(entries, raw)


def _header(settings: Settings, raw: dict[str, Any], command: str, model: dict[str, Any]) -> dict[str, Any]:
    """What every record starts with: the preset, how it was run, where, and the model's shape (plus ``model``)."""
    shape = {"shape": settings.shape, "layers": settings.layers, "dtype": settings.dtype}
    return {
        "preset": settings.name,
        "command": command,
        "settings": settings.to_dict(),
        "machine": raw["machine"],
        "load_average": {"start": raw["load_average_start"], "end": raw["load_average_end"]},
        "model": {**shape, **model, "weights": "random"},
    }


def summarize(settings: Settings, raw: dict[str, Any], token_bytes: int, command: str) -> dict[str, Any]:
    """The JSON record of a run."""
    runs = raw["runs"]
    prefill = [prefill_entry(r, token_bytes) for r in runs if r["job"]["kind"] == "prefill"]
    bandwidth = raw["bandwidth"]
    decode = [
        decode_entry(r, settings, raw["parameter_bytes_read"], bandwidth) for r in runs if r["job"]["kind"] == "decode"
    ]
    pre_raw = {
        (r["job"]["context"], r["job"]["policy"], r["job"]["budget"]): [t["seconds"] for t in r["timed"]]
        for r in runs
        if r["job"]["kind"] == "prefill"
    }
    dec_raw = {
        (r["job"]["context"], r["job"]["budget"], r["job"]["cache"]): [t["seconds_per_token"] for t in r["timed"]]
        for r in runs
        if r["job"]["kind"] == "decode"
    }
    method = next((r["memory"]["method"] for r in runs if r.get("memory")), None)
    notes = [SYNTHETIC_NOTE] if decode and settings.decode_fill == "synthetic" else []
    notes += [ATTENTION_NOTE] if any("attention_ms" in e for e in decode) else []
    notes.append(f"random weights with the shape's config.json (no download); {ALTERNATION_NOTE}")
    notes += skipped_budgets(settings)
    model = {
        "parameters": raw["parameters"],
        "parameter_bytes_read_per_step": raw["parameter_bytes_read"],
        "cache_bytes_per_token": token_bytes,
    }
    return {
        **_header(settings, raw, command, model),
        "bandwidth": {
            **bandwidth,
            "end_of_run": {k: raw["bandwidth_end"][k] for k in ("copy_gbps", "read_gbps")},
            "used_for_bound": settings.bound_bandwidth,
        },
        "bound_method": "bound_ms = bytes_read_per_step / bandwidth; bytes_read_per_step = parameter bytes (tied "
        "once; the input embedding is a row lookup) + all layers' cached keys and values, averaged "
        "over the timed steps",
        "memory_method": method,
        "notes": notes,
        "prefill": prefill,
        "decode": decode,
        "ratios": {"prefill": prefill_ratios(prefill, pre_raw), "decode": decode_ratios(decode, dec_raw)},
    }


def scoring_entry(run: dict[str, Any]) -> dict[str, Any]:
    """One (context, budget, variant): per-round times (each its process's median call) and peak memory."""
    job, timed = run["job"], run["timed"]
    seconds = [_median(t["seconds"]) for t in timed]
    peaks = [t["memory"] for t in timed]
    return {
        "context": job["context"],
        "budget": job["budget"],
        "variant": job["variant"],
        "policy": job["policy"],
        "seconds_median": _significant(_median(seconds)),
        "seconds_min": _significant(min(seconds)),
        "seconds": [_significant(x) for x in seconds],
        "call_seconds": [[_significant(x) for x in t["seconds"]] for t in timed],
        "peak_memory_bytes": round(_median([m["peak_bytes"] for m in peaks])),
        "peak_memory_delta_bytes": round(_median([m["delta_bytes"] for m in peaks])),
        "peak_memory_delta_bytes_rounds": [m["delta_bytes"] for m in peaks],
    }


def scoring_ratios(entries: list[dict], raw: dict[tuple, list[float]]) -> list[dict[str, Any]]:
    """Every variant against SnapKV, and against the authors' formulation of the same policy, per context and budget."""
    by_key = {(e["context"], e["budget"], e["variant"]): e for e in entries}
    ratios = []
    for e in entries:
        row: dict[str, Any] = {"context": e["context"], "budget": e["budget"], "variant": e["variant"]}
        for name in SCORING_REFERENCES:
            ref = by_key.get((e["context"], e["budget"], name))
            if ref is None or ref is e or (name == AUTHORS and ref["policy"] != e["policy"]):
                continue
            own, other = raw[(e["context"], e["budget"], e["variant"])], raw[(e["context"], e["budget"], name)]
            row.update(_versus("time", name, e, ref, own, other))
            row[f"time_vs_{name}_min"] = round(e["seconds_min"] / ref["seconds_min"], 4)  # the least disturbed rounds
        if len(row) > 3:
            ratios.append(row)
    return ratios


def summarize_scoring(settings: Settings, raw: dict[str, Any], command: str) -> dict[str, Any]:
    """The JSON record of a scoring-mode run."""
    entries = [scoring_entry(r) for r in raw["runs"]]
    per_round = {(e["context"], e["budget"], e["variant"]): e["seconds"] for e in entries}
    method = next((t["memory"]["method"] for r in raw["runs"] for t in r["timed"]), None)
    return {
        **_header(settings, raw, command, {"layer": raw["layer"]}),
        "variants": raw["variants"],
        "memory_method": method,
        "notes": [SCORING_NOTE, ALTERNATION_NOTE],
        "scoring": entries,
        "ratios": {"scoring": scoring_ratios(entries, per_round)},
    }
