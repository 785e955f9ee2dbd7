"""``mode: chunked``: peak memory and time to first token against the context length, one-shot vs chunked prefill.

Each configuration (context, policy, budget, ``prefill_chunks`` entry or one-shot) prefills a random prompt under
`restkv.chunked_prefill` (as ``eval/evaluation/decoding.py`` runs it) and takes the first token's argmax to the
host: the time to first token. On a CPU each configuration runs in a fresh process (`memory.Isolated`): its first
run under the peak-memory probe (process peak RSS over the RSS once the model and prompt are built), then
``repeats`` timed runs (the median is reported). On CUDA every configuration runs in process, the allocator's peak
reset before each, and a configuration that runs out of memory is recorded as such (``oom``), the others going
on: the curve shows where one-shot prefill stops fitting and chunked prefill goes on. ``kv_peak_tokens`` is the
most tokens one layer's cache held at once (measured by the compressor between chunks; the context for one-shot).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from restkv.chunked_prefill import chunked_prefill, enable_chunked_prefill
from restkv.devices import model_devices, synchronize
from restkv.eval.harness.config_tree import configured_policy
from restkv.eval.latency.jobs import build_model
from restkv.eval.latency.memory import Isolated, PeakMemory
from restkv.eval.latency.modeling import cache_token_bytes
from restkv.eval.latency.settings import Settings, model_config
from restkv.eval.latency.timing import FULL, compressor_for, forward, prompt_ids

Job = dict[str, Any]


def chunked_jobs(settings: Settings) -> list[Job]:
    """Per context: the full cache one-shot, then every evicting policy at every budget below the context,
    one-shot and at every chunk size below the context."""
    jobs: list[Job] = []
    for context in settings.contexts:
        for name in settings.policies:
            if name == FULL:
                jobs.append({"context": context, "policy": FULL, "budget": None, "chunk": None})
                continue
            chunks = [None, *(c for c in settings.prefill_chunks if c < context)]
            for budget in (b for b in settings.budgets if b < context):
                jobs += [{"context": context, "policy": name, "budget": budget, "chunk": c} for c in chunks]
    return jobs


@torch.no_grad()
def first_token(model: PreTrainedModel, settings: Settings, job: Job, ids: torch.Tensor) -> dict[str, Any]:
    """One prefill (chunked or not) and its first token on the host: seconds and the cache's peak tokens."""
    policy = configured_policy(job["policy"], settings.policy_knobs)
    devices = model_devices(model)
    with compressor_for(model, policy, job["budget"], reserve=1) as compressor:
        enable_chunked_prefill(compressor, job["chunk"])
        cache = DynamicCache(config=model.config)
        synchronize(*devices)
        start = time.perf_counter()
        logits = chunked_prefill(compressor, ids[0], lambda part, at: forward(model, part[None], cache, at))
        int(logits.argmax())  # the first token, on the host
        seconds = time.perf_counter() - start
    peaks = compressor.chunked.peak_tokens if compressor.chunked is not None else {}
    return {"seconds": seconds, "kv_peak_tokens": max(peaks.values()) if peaks else job["context"]}


def measure_job(model: PreTrainedModel, settings: Settings, job: Job) -> dict[str, Any]:
    """The first run under the peak-memory probe, then ``repeats`` timed runs (after ``warmup`` more)."""
    ids = prompt_ids(model, job["context"], settings.seed)
    probe = PeakMemory(model.device)
    probe.start()
    first = first_token(model, settings, job, ids)
    memory = probe.stop()
    for _ in range(settings.warmup):
        first_token(model, settings, job, ids)
    times = [first_token(model, settings, job, ids)["seconds"] for _ in range(settings.repeats)]
    return {
        **job,
        "ttft_seconds": statistics.median(times),
        "times": times,
        "kv_peak_tokens": first["kv_peak_tokens"],
        "peak_bytes": memory["delta_bytes"],
        "memory_method": memory["method"],
        "oom": False,
    }


def isolated_job(settings_dict: dict[str, Any], job: Job) -> dict[str, Any]:
    """`measure_job` in a fresh process (CPU): build the model, measure, return the entry."""
    settings = Settings(**settings_dict)
    return measure_job(build_model(settings), settings, job)


def run(settings: Settings) -> list[dict[str, Any]]:
    """Every configuration's entry, in `chunked_jobs` order."""
    jobs = chunked_jobs(settings)
    if settings.resolved_device().type != "cuda":
        isolated = Isolated(["torch", "transformers", "restkv"])
        return [_logged(isolated(isolated_job, settings.to_dict(), job)) for job in jobs]
    model, entries = build_model(settings), []
    for job in jobs:
        try:
            entries.append(_logged(measure_job(model, settings, job)))
        except torch.cuda.OutOfMemoryError:
            entries.append(_logged({**job, "oom": True}))
        torch.cuda.empty_cache()
    return entries


def _logged(entry: dict[str, Any]) -> dict[str, Any]:
    if entry["oom"]:
        print(f"  {label(entry)}: out of memory", flush=True)
        return entry
    mib, tokens = entry["peak_bytes"] / 2**20, entry["kv_peak_tokens"]
    print(f"  {label(entry)}: {entry['ttft_seconds']:.3f} s, {mib:.1f} MiB peak, {tokens} tokens per layer at most")
    return entry


def label(entry: dict[str, Any]) -> str:
    policy = entry["policy"] if entry["budget"] is None else f"{entry['policy']}@{entry['budget']}"
    return f"{entry['context']} {policy} {'one-shot' if entry['chunk'] is None else 'chunk ' + str(entry['chunk'])}"


def summarize(settings: Settings, entries: list[dict[str, Any]], command: str = "") -> dict[str, Any]:
    config = model_config(settings)
    device = settings.resolved_device()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "kind": "chunked-prefill",
        "command": command,
        "settings": settings.to_dict(),
        "device_name": name,
        "model": {"shape": settings.shape, "layers": config.num_hidden_layers, "dtype": settings.dtype},
        "kv_bytes_per_token": cache_token_bytes(config, settings.torch_dtype),
        "entries": entries,
    }


def table(record: dict[str, Any]) -> str:
    """Markdown: per context and configuration, the time to first token, the peak memory and the peak KV tokens."""
    per_token = record["kv_bytes_per_token"]
    lines = [
        f"# Chunked prefill: {record['model']['shape']} ({record['model']['layers']} layers, "
        f"{record['model']['dtype']}) on {record['device_name']}",
        "",
        f"Command: `{record['command']}`",
        "",
        "Peak memory: over the memory held once the model and the prompt are built "
        f"({record['entries'][0].get('memory_method', 'n/a') if record['entries'] else ''}). KV peak: the most "
        f"tokens one layer held at once x {per_token} bytes per token over all layers.",
        "",
        "| context | policy | budget | prefill | time to first token (s) | peak memory (MiB) | KV peak tokens per "
        "layer | KV peak (MiB) |",
        "|---:|---|---:|---|---:|---:|---:|---:|",
    ]
    for e in record["entries"]:
        mode = "one-shot" if e["chunk"] is None else f"chunk {e['chunk']}"
        if e["oom"]:
            lines.append(f"| {e['context']} | {e['policy']} | {e['budget'] or '-'} | {mode} | out of memory | | | |")
            continue
        lines.append(
            f"| {e['context']} | {e['policy']} | {e['budget'] or '-'} | {mode} | {e['ttft_seconds']:.3f} | "
            f"{e['peak_bytes'] / 2**20:.1f} | {e['kv_peak_tokens']} | {e['kv_peak_tokens'] * per_token / 2**20:.1f} |"
        )
    return "\n".join(lines) + "\n"


def plot(record: dict[str, Any], stem: Path) -> list[Path]:
    """``<stem>.png``: peak memory and time to first token against the context, a line per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    series: dict[str, list[tuple[int, float, float]]] = {}
    for e in record["entries"]:
        if not e["oom"]:
            key = label(e).split(" ", 1)[1]
            series.setdefault(key, []).append((e["context"], e["peak_bytes"] / 2**20, e["ttft_seconds"]))
    for key, points in series.items():
        points.sort()
        style = "--" if "one-shot" in key else "-"
        axes[0].plot([p[0] for p in points], [p[1] for p in points], style, marker="o", label=key)
        axes[1].plot([p[0] for p in points], [p[2] for p in points], style, marker="o", label=key)
    for ax, ylabel in zip(axes, ("peak memory over the model (MiB)", "time to first token (s)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.suptitle(f"One-shot vs chunked prefill: {record['model']['shape']} on {record['device_name']}")
    figure.tight_layout()
    path = stem.with_suffix(".png")
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return [path]


def run_chunked(settings: Settings, command: str = "") -> dict[str, Any]:
    """``mode: chunked``: measure, write ``<out_dir>/<name>.json``, its table ``.md`` and plot ``.png``."""
    record = summarize(settings, run(settings), command)
    path = settings.json_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    if settings.plots:
        record["plots"] = [p.name for p in plot(record, path.with_suffix(""))]
    path.write_text(json.dumps(record, indent=1) + "\n")
    text = table(record)
    path.with_suffix(".md").write_text(text)
    print(text)
    print(f"results: {path}")
    return record
