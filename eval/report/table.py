"""Every run folder under a root as one tidy pandas table, with bootstrap intervals on every score.

Two levels: :func:`sample_frame` has one row per scored sample (what paired comparisons and
intervals resample), :func:`run_table` one row per run x task x length bucket, plus the
benchmark's headline rows (``task == "average"``: the unweighted mean of the task means, as every
benchmark here reports it) per length bucket and over all lengths (``length == "all"``). Scores
are in points (0-100); ``score_low``/``score_high`` are the 95 % percentile-bootstrap interval over
samples (resampled within each task for averages, so each task keeps its weight).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from restkv.eval.report.collect import RunResult, load_runs
from restkv.eval.report.settings import acted_settings
from restkv.eval.report.uncertainty import LEVEL, RESAMPLES

RUN_COLUMNS = [
    "model",
    "bench",
    "policy",
    "budget",
    "phase",
    "decode_budget",
    "decode_interval",
    "evaluation",
    "allocation",
    "quantization",
    "storage",
    "knobs",
    "protocol",
    "variant",
    "sibling",
    "source",
    "folder",
]
"""What identifies a run in the table, each as it acted (`restkv.eval.report.settings`: ``budget`` is '-' for a
decode-only run, whose prefill budget never acted; ``phase``, ``decode_budget``, ``decode_interval``: eviction
while answering; ``evaluation``: generate, fidelity or multi_turn; ``protocol``: the one used, query_agnostic for
multi-turn runs; ``knobs``: the policy knobs that differ from the policy's defaults; ``storage``: the layout and
quantization settings that differ from the defaults; ``sibling``: ``N`` of a ``~N`` folder; ``source``: the
nested ``out_dir`` a run came from)."""
MEASURES = ["prefill_seconds", "decode_seconds", "cache_bytes", "peak_memory_bytes"]
"""Per-sample measurements averaged into each row (NaN where a run did not record them)."""
CELL_COLUMNS = ["task", "length", "depth"]
ALL = "all"
AVERAGE = "average"


def _knobs_off_default(policy: str, knobs: dict[str, Any]) -> str:
    """``name=value`` of every knob that differs from the policy's defaults, comma-separated ('' for none)."""
    from restkv.registry import policy_defaults

    try:
        defaults = policy_defaults(policy)
    except ValueError:
        defaults = {}
    changed = {k: v for k, v in knobs.items() if k != "_target_" and (k not in defaults or defaults[k] != v)}
    return ",".join(f"{k}={v}" for k, v in sorted(changed.items()))


def _storage(config: dict[str, Any]) -> str:
    """The layout and every quantization setting that differ from the defaults, ``name=value`` comma-separated."""
    from restkv.storage.quantize import Quantization

    parts = [f"layout={config['layout']}"] if config.get("layout", "auto") != "auto" else []
    quantization = dict(config.get("quantization") or {})
    if quantization.get("backend", "none") != "none":
        defaults = {f: getattr(Quantization(), f) for f in Quantization.__dataclass_fields__}
        parts += [
            f"{key}={value}"
            for key, value in sorted(quantization.items())
            if key not in ("backend", "nbits") and defaults.get(key) != value
        ]
    return ",".join(parts)


def run_columns(run: RunResult) -> dict[str, Any]:
    """The run-identifying columns of ``run``, from its folder name and resolved ``config.yaml``."""
    config = run.config
    policy_config = dict(config.get("policy") or {})
    quantization = dict(config.get("quantization") or {})
    backend = str(quantization.get("backend", "none"))
    acted = acted_settings(config, run.metrics, run.budget)
    return {
        "model": run.model,
        "bench": run.bench,
        "policy": run.policy,
        "budget": acted.budget,
        "phase": acted.phase,
        "decode_budget": acted.decode_budget,
        "decode_interval": acted.decode_interval,
        "evaluation": acted.evaluation,
        "allocation": str(policy_config.get("allocation") or "uniform"),
        "quantization": backend if backend == "none" else f"{backend}-{quantization.get('nbits')}bit",
        "storage": _storage(config),
        "knobs": _knobs_off_default(run.policy, policy_config) if policy_config else "",
        "protocol": acted.protocol,
        "variant": run.variant,
        "sibling": run.sibling,
        "source": run.source,
        "folder": str(run.folder),
    }


def _length_of(record: dict[str, Any], bench: str) -> str:
    """The record's length bucket: its nominal context length, LongBench-E's bucket, or ``all``."""
    meta = record.get("meta") or {}
    if "context_length" in meta:
        return str(meta["context_length"])
    if bench == "longbench_e" and "length" in meta:
        from restkv.eval.benchmarks.longbench.metrics import length_bucket

        return length_bucket(int(meta["length"]))
    return ALL


def _sample_rows(run: RunResult, columns: dict[str, Any]) -> Iterable[dict[str, Any]]:
    """One row per record the runner's reader trusts (`RunResult.records`)."""
    for sample_id, record in run.records.items():
        meta = record.get("meta") or {}
        yield {
            **columns,
            "id": sample_id,
            "task": str(record["task"]),
            "length": _length_of(record, run.bench),
            "depth": float(meta["depth_percent"]) if "depth_percent" in meta else np.nan,
            "score": float(record["score"]),
            "prefill_seconds": record.get("prefill_seconds", np.nan),
            "decode_seconds": record.get("decode_seconds", np.nan),
            "cache_bytes": record.get("cache_allocated_bytes", np.nan),
            "peak_memory_bytes": record.get("peak_memory_bytes", np.nan),
        }


def sample_frame(runs: list[RunResult]) -> pd.DataFrame:
    """One row per scored sample of ``runs`` (the last record per id), run columns included.

    Runs without ``predictions.jsonl`` are left out here (see :func:`run_table`, which keeps their
    task scores without intervals).
    """
    rows = [row for run in runs if run.records for row in _sample_rows(run, run_columns(run))]
    frame = pd.DataFrame(rows, columns=[*RUN_COLUMNS, "id", *CELL_COLUMNS, "score", *MEASURES])
    return frame.astype({"score": float, **dict.fromkeys(MEASURES, float)})


def _stratified_means(scores: np.ndarray, strata: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """Bootstrap replicates of the mean over strata of each stratum's mean (each resampled within itself)."""
    rng = np.random.default_rng(seed)
    replicates = np.zeros(resamples)
    names = pd.unique(strata)
    for name in names:
        values = scores[strata == name]
        replicates += values[rng.integers(0, values.size, size=(resamples, values.size))].mean(axis=1)
    return replicates / len(names)


def interval(scores: np.ndarray, strata: np.ndarray, resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """The 95 % bootstrap interval (in points) of the mean over strata of the per-stratum mean scores."""
    replicates = _stratified_means(np.asarray(scores, dtype=float), np.asarray(strata), resamples, seed)
    tail = (1 - LEVEL) / 2
    low, high = np.quantile(replicates, [tail, 1 - tail])
    return 100 * float(low), 100 * float(high)


def _summarize(group: pd.DataFrame, resamples: int) -> dict[str, Any]:
    per_task = group.groupby("task", sort=False)["score"].mean()
    low, high = interval(group["score"].to_numpy(), group["task"].to_numpy(), resamples)
    return {
        "score": 100 * float(per_task.mean()),
        "score_low": low,
        "score_high": high,
        "samples": len(group),
        **{m: float(group[m].mean()) if group[m].notna().any() else np.nan for m in MEASURES},
    }


def aggregate(samples: pd.DataFrame, by: list[str], resamples: int = RESAMPLES) -> pd.DataFrame:
    """One row per run x ``by`` (cell columns): mean score over tasks with its interval, counts, measures."""
    keys = [*RUN_COLUMNS, *by]
    rows = []
    for values, group in samples.groupby(keys, sort=False, dropna=False):
        rows.append({**dict(zip(keys, values, strict=True)), **_summarize(group, resamples)})
    return pd.DataFrame(rows, columns=[*keys, "score", "score_low", "score_high", "samples", *MEASURES])


def _metrics_only(run: RunResult) -> list[dict[str, Any]]:
    """Rows of a run that kept no per-sample records: its task scores, no intervals."""
    columns = run_columns(run)
    tasks = run.metrics.get("tasks") or {}
    counts = run.metrics.get("samples") or {}
    rows = [
        {**columns, "task": t, "length": ALL, "score": float(s), "samples": counts.get(t)} for t, s in tasks.items()
    ]
    if run.metrics.get("average") is not None:
        rows.append({**columns, "task": AVERAGE, "length": ALL, "score": run.average, "samples": sum(counts.values())})
    return rows


def run_table(root: Path | str, resamples: int = RESAMPLES, runs: list[RunResult] | None = None) -> pd.DataFrame:
    """The tidy table of every run under ``root`` (or of ``runs``, already read): task x length rows, averages
    per length and overall. Rows are ordered by model, bench, policy (alphabetically), numeric budget, decode budget,
    then as computed. A run without per-sample records gives its task scores without intervals."""
    runs = load_runs(Path(root)) if runs is None else runs
    samples = sample_frame(runs)
    parts = [
        aggregate(samples, ["task", "length"], resamples),
        aggregate(samples.assign(length=ALL), ["task", "length"], resamples),
        aggregate(samples, ["length"], resamples).assign(task=AVERAGE),
        aggregate(samples.assign(length=ALL), ["length"], resamples).assign(task=AVERAGE),
    ]
    bare = [row for run in runs if not run.records for row in _metrics_only(run)]
    if bare:
        parts.append(pd.DataFrame(bare))
    table = pd.concat([p for p in parts if not p.empty], ignore_index=True) if any(len(p) for p in parts) else parts[0]
    table = table.drop_duplicates(subset=[*RUN_COLUMNS, "task", "length"], keep="first")
    columns = [*RUN_COLUMNS[:-1], "task", "length", "score", "score_low", "score_high", "samples", *MEASURES, "folder"]
    order = pd.to_numeric(table["budget"], errors="coerce").fillna(float("inf"))
    decode = pd.to_numeric(table["decode_budget"], errors="coerce").fillna(-1.0)
    table = table.assign(_budget=order, _decode=decode)
    table = table.sort_values(["model", "bench", "policy", "_budget", "_decode"], kind="stable")
    return table.reindex(columns=columns).reset_index(drop=True)


def to_markdown(table: pd.DataFrame, digits: int = 1) -> str:
    """A GitHub markdown table of ``table`` (floats at ``digits`` decimals, NaN shown as '-')."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return "-" if np.isnan(value) else f"{value:.{digits}f}"
        return str(value).replace("|", "\\|")

    header = "| " + " | ".join(map(str, table.columns)) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *body])
