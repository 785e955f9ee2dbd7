"""The measurement plan of a preset: which configurations, in which order, where memory is measured.

Every timed configuration of one context length runs once per round, in the same order, for
``warmup`` untimed then ``repeats`` timed rounds (A B C A B C ...): slow drifts of a shared
machine hit every configuration alike, and the report takes medians over rounds.
"""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Callable
from typing import Any

import torch
import transformers
from tqdm import tqdm
from transformers import PreTrainedModel

from eval.configs import configured_policy
from eval.latency import memory
from eval.latency.bounds import measure_bandwidth
from eval.latency.modeling import parameter_bytes_read, random_model, synthetic_base
from eval.latency.settings import Settings, model_config
from eval.latency.timing import FULL, compressor_for, decode_case, prefill, prompt_ids

Job = dict[str, Any]


def build_model(settings: Settings) -> PreTrainedModel:
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    config = model_config(settings)
    return random_model(config, settings.torch_dtype, settings.resolved_device(), settings.seed)


def prefill_jobs(settings: Settings, context: int) -> list[Job]:
    jobs = []
    for name in settings.policies:
        budgets = [None] if name == FULL else [b for b in settings.budgets if b < context]
        jobs += [{"kind": "prefill", "context": context, "policy": name, "budget": b} for b in budgets]
    return jobs


def decode_jobs(settings: Settings, context: int) -> list[Job]:
    budgets = [None, *(b for b in settings.decode_budgets if b < context)]
    return [
        {"kind": "decode", "context": context, "budget": b, "cache": kind}
        for b in budgets
        for kind in settings.decode_caches
    ]


def job_inputs(model: PreTrainedModel, settings: Settings, job: Job) -> dict[str, Any]:
    """What a job needs before its measured work: prompt ids or the synthetic keys/values."""
    if job["kind"] == "decode" and settings.decode_fill == "synthetic":
        return {"base": synthetic_base(model.config, job["context"], model.dtype, model.device, settings.seed)}
    return {"ids": prompt_ids(model, job["context"], settings.seed)}


def run_job(
    model: PreTrainedModel, settings: Settings, job: Job, inputs: dict[str, Any], profiled: bool = False
) -> dict[str, Any]:
    """Run one configuration once; return its measurement (``profiled``: a decode's costliest operators)."""
    if job["kind"] == "prefill":
        policy = configured_policy(job["policy"], settings.policy_knobs)
        reserve = (
            settings.decode_warmup_tokens + settings.decode_tokens if settings.prefill_cache == "preallocated" else 0
        )
        with compressor_for(model, policy, job["budget"], reserve) as compressor:
            run, _ = prefill(model, inputs["ids"], compressor)
        return {"seconds": run.seconds, "eviction_seconds": run.eviction_seconds, "cache": run.cache}
    name = FULL if job["budget"] is None else settings.decode_policy
    times, before = decode_case(
        model,
        context=job["context"],
        budget=job["budget"],
        kind=job["cache"],
        warmup=settings.decode_warmup_tokens,
        steps=settings.decode_tokens,
        fill=settings.decode_fill,
        policy=configured_policy(name, settings.policy_knobs) if settings.decode_fill == "prefill" else None,
        ids=inputs.get("ids"),
        base=inputs.get("base"),
        profiled=profiled,
        decode_kernel=settings.decode_kernel,
    )
    if profiled:
        return {"ops": times}
    return {"step_seconds": times, "seconds_per_token": statistics.fmean(times), "cache": before}


def time_jobs(
    model: PreTrainedModel, settings: Settings, jobs: list[Job], tick: Callable[[], None], peak: bool = False
) -> list[list[dict]]:
    """Alternate ``jobs`` over rounds; the timed rounds' measurements per job.

    ``peak`` (CUDA): the first timed round also records each run's allocator peak (``"memory"``).
    """
    if not jobs:
        return []
    inputs = job_inputs(model, settings, jobs[0])  # every job of one context and kind shares its inputs
    timed: list[list[dict]] = [[] for _ in jobs]
    for round_ in range(settings.warmup + settings.repeats):
        for index, job in enumerate(jobs):
            probe = memory.PeakMemory(model.device) if peak and round_ == settings.warmup else None
            if probe is not None:
                probe.start()
            result = run_job(model, settings, job, inputs)
            if probe is not None:
                result["memory"] = {**probe.stop(), "method": probe.method}
            if round_ >= settings.warmup:
                timed[index].append(result)
            tick()
    return timed


def machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "device": str(device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    try:
        for line in open("/proc/cpuinfo").read().splitlines():  # noqa: SIM115
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


def load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def run(settings: Settings) -> dict[str, Any]:
    """Measure everything the preset asks for; raw measurements plus context (see `report.summarize`)."""
    device = settings.resolved_device()
    plan = {
        c: (prefill_jobs(settings, c) if settings.prefill else [], decode_jobs(settings, c) if settings.decode else [])
        for c in settings.contexts
    }
    all_jobs = [job for pre, dec in plan.values() for job in pre + dec]
    rounds = settings.warmup + settings.repeats
    isolated = settings.memory and device.type != "cuda"
    memory_jobs = [
        index
        for index, job in enumerate(all_jobs)
        if settings.memory and (settings.memory_contexts is None or job["context"] in settings.memory_contexts)
    ]
    total = len(all_jobs) * rounds + (len(memory_jobs) if isolated else 0)
    bar = tqdm(
        total=total, desc=f"latency/{settings.name}", unit="run", disable=not settings.progress, dynamic_ncols=True
    )
    result: dict[str, Any] = {"machine": machine(device), "load_average_start": load()}

    memories: dict[int, dict[str, Any]] = {}
    if isolated:  # before this process builds its own model: one fresh process per configuration
        isolate = memory.Isolated()
        for index in memory_jobs:
            job = all_jobs[index]
            bar.set_postfix_str(f"memory {job_label(job)}")
            memories[index] = isolate(settings.to_dict(), job)
            bar.update()

    model = build_model(settings)
    result["machine"]["threads"] = torch.get_num_threads()
    result["parameters"] = sum(p.numel() for p in model.parameters())
    result["parameter_bytes_read"] = parameter_bytes_read(model)
    result["bandwidth"] = measure_bandwidth(device, settings.bandwidth_mib, settings.bandwidth_repeats)

    timed: list[list[dict]] = []
    for pre, dec in plan.values():
        for jobs in (pre, dec):
            bar.set_postfix_str(", ".join(sorted({job_label(j, short=True) for j in jobs})) if jobs else "")
            timed += time_jobs(model, settings, jobs, bar.update, peak=settings.memory and not isolated)
    profiles: dict[int, list[dict]] = {}
    if settings.decode_profile:
        for _, dec in plan.values():
            for job in dec:
                bar.set_postfix_str(f"profile {job_label(job)}")
                inputs = job_inputs(model, settings, job)
                profiles[all_jobs.index(job)] = run_job(model, settings, job, inputs, profiled=True)["ops"]
    bar.close()
    result["bandwidth_end"] = measure_bandwidth(device, settings.bandwidth_mib, settings.bandwidth_repeats)
    result["load_average_end"] = load()
    result["runs"] = [
        {
            "job": job,
            "timed": runs,
            "memory": memories.get(index, runs[0].pop("memory", None) if index in memory_jobs else None),
            "profile": profiles.get(index),
        }
        for index, (job, runs) in enumerate(zip(all_jobs, timed, strict=True))
    ]
    return result


def job_label(job: Job, short: bool = False) -> str:
    budget = "full" if job["budget"] is None else f"budget {job['budget']}"
    if job["kind"] == "prefill":
        name = job["policy"] if job["budget"] is None else f"{job['policy']}@{job['budget']}"
        return f"prefill {job['context']}" if short else f"prefill {job['context']} {name}"
    return f"decode {job['context']}" if short else f"decode {job['context']} {budget} {job['cache']}"
