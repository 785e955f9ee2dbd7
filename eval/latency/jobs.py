"""One configuration of a model-mode run (a "job"): what it needs, how it runs once, its label.

A job is a plain dict (``kind`` ``prefill`` or ``decode``, ``context``, ``budget``, and ``policy``
or ``cache``) so that it pickles into the fresh process that measures its peak memory
(`isolated_peak`). `restkv.eval.latency.model_mode` decides which jobs run and in which order.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
from transformers import PreTrainedModel

from restkv.eval.harness.config_tree import configured_policy
from restkv.eval.latency.headwise import HEADWISE
from restkv.eval.latency.memory import measured
from restkv.eval.latency.modeling import random_model, synthetic_base
from restkv.eval.latency.settings import Settings, model_config
from restkv.eval.latency.timing import FULL, compressor_for, decode_case, prefill, prompt_ids

Job = dict[str, Any]


def apply_threads(settings: Settings) -> None:
    """Set torch's CPU threads when the preset names a count (before any work in this process)."""
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)


def build_model(settings: Settings) -> PreTrainedModel:
    apply_threads(settings)
    config = model_config(settings)
    return random_model(config, settings.torch_dtype, settings.resolved_device(), settings.seed)


def prefill_jobs(settings: Settings, context: int) -> list[Job]:
    jobs = []
    for name in settings.policies:
        budgets = [None] if name == FULL else [b for b in settings.budgets if b < context]
        jobs += [{"kind": "prefill", "context": context, "policy": name, "budget": b} for b in budgets]
    return jobs


def decode_jobs(settings: Settings, context: int) -> list[Job]:
    """Every cache kind at every budget below ``context``, and the full cache (not for the head-wise kinds)."""
    budgets = [None, *(b for b in settings.decode_budgets if b < context)]
    return [
        {"kind": "decode", "context": context, "budget": b, "cache": kind}
        for b in budgets
        for kind in settings.decode_caches
        if not (b is None and kind in HEADWISE)
    ]


def job_inputs(model: PreTrainedModel, settings: Settings, job: Job) -> dict[str, Any]:
    """What a job needs before its measured work: prompt ids or the synthetic keys/values."""
    if job["kind"] == "decode" and settings.decode_fill == "synthetic":
        return {"base": synthetic_base(model.config, job["context"], model.dtype, model.device, settings.seed)}
    return {"ids": prompt_ids(model, job["context"], settings.seed)}


def _run_prefill(model: PreTrainedModel, settings: Settings, job: Job, ids: torch.Tensor) -> dict[str, Any]:
    policy = configured_policy(job["policy"], settings.policy_knobs)
    reserve = settings.decode_warmup_tokens + settings.decode_tokens if settings.prefill_cache == "preallocated" else 0
    with compressor_for(model, policy, job["budget"], reserve) as compressor:
        run, _ = prefill(model, ids, compressor)
    scoring = {"scoring": run.scoring} if run.scoring else {}
    return {"seconds": run.seconds, "eviction_seconds": run.eviction_seconds, "cache": run.cache, **scoring}


def run_job(
    model: PreTrainedModel, settings: Settings, job: Job, inputs: dict[str, Any], profiled: bool = False
) -> dict[str, Any]:
    """Run one configuration once; return its measurement (``profiled``: a decode's costliest operators)."""
    if job["kind"] == "prefill":
        return _run_prefill(model, settings, job, inputs["ids"])
    name = FULL if job["budget"] is None else settings.decode_policy
    times, before, attention = decode_case(
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
        attention_calls=settings.decode_attention_calls if settings.decode_attention_only else 0,
    )
    if profiled:
        return {"ops": times}
    return {
        "step_seconds": times,
        "seconds_per_token": statistics.fmean(times),
        "cache": before,
        "attention_ms": attention,
    }


def isolated_peak(settings_dict: dict[str, Any], job: Job) -> dict[str, Any]:
    """In a fresh process (`memory.Isolated`): build the model, run ``job`` once, return its peak memory.

    (On CUDA the runner instead probes the first timed round of each configuration in process.)
    """
    settings = Settings(**settings_dict)
    model = build_model(settings)
    inputs = job_inputs(model, settings, job)
    _, peak = measured(model.device, lambda: run_job(model, settings, job, inputs))
    return peak


def job_label(job: Job, short: bool = False) -> str:
    budget = "full" if job["budget"] is None else f"budget {job['budget']}"
    if job["kind"] == "prefill":
        name = job["policy"] if job["budget"] is None else f"{job['policy']}@{job['budget']}"
        return f"prefill {job['context']}" if short else f"prefill {job['context']} {name}"
    if job["kind"] == "scoring":
        return f"scoring {job['context']}" if short else f"scoring {job['context']} {job['variant']}@{job['budget']}"
    return f"decode {job['context']}" if short else f"decode {job['context']} {budget} {job['cache']}"
