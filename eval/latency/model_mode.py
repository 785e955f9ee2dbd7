"""The measurement plan of a model-mode preset: which configurations, in which order, where memory is measured.

Every timed configuration of one context length runs once per round, in the same order, for
``warmup`` untimed then ``repeats`` timed rounds (A B C A B C ...): slow drifts of a shared
machine hit every configuration alike, and the report takes medians over rounds. `alternate` is
that loop; the scoring mode (`restkv.eval.latency.scoring_mode`) runs its configurations through it too.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from typing import Any

import torch
import transformers
from tqdm import tqdm
from transformers import PreTrainedModel

from restkv.eval.latency.bounds import measure_bandwidth
from restkv.eval.latency.jobs import (
    Job,
    build_model,
    decode_jobs,
    isolated_peak,
    job_inputs,
    job_label,
    prefill_jobs,
    run_job,
)
from restkv.eval.latency.memory import Isolated, measured
from restkv.eval.latency.modeling import parameter_bytes_read
from restkv.eval.latency.settings import Settings

Plan = dict[int, tuple[list[Job], list[Job]]]  # context -> (prefill jobs, decode jobs)


def progress(settings: Settings, total: int) -> tqdm:
    """The run's progress bar (silent unless ``settings.progress``)."""
    desc = f"latency/{settings.name}"
    return tqdm(total=total, desc=desc, unit="run", disable=not settings.progress, dynamic_ncols=True)


def alternate(
    jobs: list[Job], settings: Settings, measure: Callable[[int, Job], dict[str, Any]], tick: Callable[[], object]
) -> list[list[dict[str, Any]]]:
    """Run every job once per round, in order, ``warmup`` + ``repeats`` rounds; the timed rounds' results per job.

    ``measure(round_, job)`` runs one job once; ``tick()`` follows every run (the progress bar).
    """
    timed: list[list[dict[str, Any]]] = [[] for _ in jobs]
    for round_ in range(settings.warmup + settings.repeats):
        for index, job in enumerate(jobs):
            result = measure(round_, job)
            if round_ >= settings.warmup:
                timed[index].append(result)
            tick()
    return timed


def time_jobs(
    model: PreTrainedModel, settings: Settings, jobs: list[Job], tick: Callable[[], object], peak: bool = False
) -> list[list[dict]]:
    """Alternate ``jobs`` over rounds; the timed rounds' measurements per job.

    ``peak`` (CUDA): the first timed round also records each run's allocator peak (``"memory"``).
    """
    if not jobs:
        return []
    inputs = job_inputs(model, settings, jobs[0])  # every job of one context and kind shares its inputs

    def measure(round_: int, job: Job) -> dict[str, Any]:
        if not (peak and round_ == settings.warmup):
            return run_job(model, settings, job, inputs)
        result, peak_memory = measured(model.device, lambda: run_job(model, settings, job, inputs))
        return {**result, "memory": peak_memory}

    return alternate(jobs, settings, measure, tick)


def machine(device: torch.device) -> dict[str, Any]:
    """Where the run happens: device, library versions, threads, CPU model."""
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
    """The machine's load averages (1, 5, 15 min), to show how shared it was."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def make_plan(settings: Settings) -> Plan:
    return {
        c: (prefill_jobs(settings, c) if settings.prefill else [], decode_jobs(settings, c) if settings.decode else [])
        for c in settings.contexts
    }


def memory_indices(settings: Settings, jobs: list[Job]) -> list[int]:
    """The jobs whose peak memory is measured (``memory``, restricted to ``memory_contexts``)."""
    wanted = settings.memory_contexts
    return [i for i, job in enumerate(jobs) if settings.memory and (wanted is None or job["context"] in wanted)]


def isolated_memories(settings: Settings, jobs: list[Job], indices: list[int], bar: tqdm) -> dict[int, dict]:
    """Peak memory of each job ``indices`` names, one fresh process each (CPU)."""
    isolate = Isolated(preload=["restkv.eval.latency.jobs"])
    memories = {}
    for index in indices:
        bar.set_postfix_str(f"memory {job_label(jobs[index])}")
        memories[index] = isolate(isolated_peak, settings.to_dict(), jobs[index])
        bar.update()
    return memories


def model_facts(model: PreTrainedModel, settings: Settings) -> dict[str, Any]:
    """The built model's size, the bytes a decode step reads of it, and the machine's bandwidth."""
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "parameter_bytes_read": parameter_bytes_read(model),
        "bandwidth": measure_bandwidth(model.device, settings.bandwidth_mib, settings.bandwidth_repeats),
    }


def profiles(model: PreTrainedModel, settings: Settings, plan: Plan, jobs: list[Job], bar: tqdm) -> dict[int, list]:
    """One profiled run per decode job (``decode_profile``): its costliest operators."""
    found: dict[int, list] = {}
    if not settings.decode_profile:
        return found
    for _, dec in plan.values():
        for job in dec:
            bar.set_postfix_str(f"profile {job_label(job)}")
            inputs = job_inputs(model, settings, job)
            found[jobs.index(job)] = run_job(model, settings, job, inputs, profiled=True)["ops"]
    return found


def run(settings: Settings) -> dict[str, Any]:
    """Measure everything the preset asks for; raw measurements plus context (see `report.summarize`)."""
    device = settings.resolved_device()
    plan = make_plan(settings)
    jobs = [job for pre, dec in plan.values() for job in pre + dec]
    isolated = settings.memory and device.type != "cuda"
    wanted = memory_indices(settings, jobs)
    bar = progress(settings, len(jobs) * (settings.warmup + settings.repeats) + (len(wanted) if isolated else 0))
    result: dict[str, Any] = {"machine": machine(device), "load_average_start": load()}
    # before this process builds its own model: one fresh process per configuration
    memories = isolated_memories(settings, jobs, wanted, bar) if isolated else {}
    model = build_model(settings)
    result["machine"]["threads"] = torch.get_num_threads()
    result.update(model_facts(model, settings))
    timed: list[list[dict]] = []
    for pre, dec in plan.values():
        for group in (pre, dec):
            bar.set_postfix_str(", ".join(sorted({job_label(j, short=True) for j in group})))
            timed += time_jobs(model, settings, group, bar.update, peak=settings.memory and not isolated)
    found = profiles(model, settings, plan, jobs, bar)
    bar.close()
    result["bandwidth_end"] = measure_bandwidth(device, settings.bandwidth_mib, settings.bandwidth_repeats)
    result["load_average_end"] = load()
    result["runs"] = [
        {
            "job": job,
            "timed": runs,
            "memory": memories.get(index, runs[0].pop("memory", None) if index in wanted else None),
            "profile": found.get(index),
        }
        for index, (job, runs) in enumerate(zip(jobs, timed, strict=True))
    ]
    return result
