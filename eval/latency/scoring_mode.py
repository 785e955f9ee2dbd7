"""Scoring mode (``mode: scoring``): the cost of one layer's eviction decision, policy against policy.

    python -m restkv.eval.latency latency=cpu-scoring                          # Llama-3.1-8B layer, 8k and 16k
    python -m restkv.eval.latency latency=cpu-scoring latency.contexts=[8192] latency.scoring_authors=true

One attention layer of the preset's shape (query heads, key/value heads, head_dim, hidden size
from ``configs/shapes/<shape>.json``) with random inputs: the window's queries, the whole prompt's
keys and values, the output projection's weight. What is timed is a policy's ``select``, i.e. its
scores and the top-k, nothing of the model's forward. Each configuration (context, budget,
variant) runs once per round in a fresh process (`memory.Isolated`), so that the process's peak
memory belongs to it alone: the process builds the inputs, runs the decision once under the
peak-memory probe (which is also its warm-up), then times ``scoring_calls`` calls (their median
is the round's time). Rounds alternate the configurations of a context (`runner.alternate`).

Variants: ``<policy>`` for each of ``policies`` (ReST-KV's per-head Gram matrices ``W_o^hT W_o^h``
computed once beforehand, as the integration caches them per layer); ``<policy>+gram`` for those
that read the Gram matrices (``scoring_gram_every_call``: recomputed in every call, their one-off
cost); ``authors`` (``scoring_authors``): ReST-KV's score written as the authors write it, every
value projected through ``W_o`` (a ``[heads, L, hidden]`` tensor), reimplemented only to measure
its cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import PretrainedConfig

from restkv import Budget, LayerInputs, scoring
from restkv.eval.harness.config_tree import configured_policy
from restkv.eval.latency.jobs import Job, apply_threads
from restkv.eval.latency.memory import Isolated, measured
from restkv.eval.latency.model_mode import alternate, load, machine, progress
from restkv.eval.latency.settings import Settings, model_config
from restkv.eval.latency.timing import timed_calls
from restkv.policy import Policy

AUTHORS = "authors"
AUTHORS_POLICY = "restkv"
EVERY_CALL = "+gram"


@dataclass(frozen=True)
class LayerShape:
    """The sizes of one attention layer that the eviction decision depends on."""

    heads: int
    kv_heads: int
    head_dim: int
    hidden: int

    @classmethod
    def of(cls, config: PretrainedConfig) -> LayerShape:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.num_attention_heads, config.num_key_value_heads, head_dim, config.hidden_size)


def variants(settings: Settings) -> list[tuple[str, str]]:
    """``(variant, policy)`` pairs in the order each round runs them."""
    found = []
    for name in settings.policies:
        found.append((name, name))
        if settings.scoring_gram_every_call and configured_policy(name, settings.policy_knobs).needs_output_gram:
            found.append((name + EVERY_CALL, name))
    if settings.scoring_authors:
        found.append((AUTHORS, AUTHORS_POLICY))
    return found


def describe(settings: Settings) -> dict[str, dict[str, Any]]:
    """What each variant times, its policy and its window (for the record)."""
    described = {}
    for variant, name in variants(settings):
        policy = configured_policy(name, settings.policy_knobs)
        if variant == AUTHORS:
            what = f"{name}'s scores as the authors compute them (every value through W_o), top-k per query head"
        elif variant.endswith(EVERY_CALL):
            what = f"{name}.select, the per-head Gram matrices W_o^hT W_o^h recomputed in every call"
        elif policy.needs_output_gram:
            what = f"{name}.select, the Gram matrices computed once beforehand (cached per layer, as integrated)"
        else:
            what = f"{name}.select"
        described[variant] = {"policy": name, "window": policy.window, "what": what}
    return described


def scoring_jobs(settings: Settings, context: int) -> list[Job]:
    """Every budget below ``context`` times every variant, for one context length."""
    return [
        {"kind": "scoring", "context": context, "budget": budget, "variant": variant, "policy": policy}
        for budget in settings.budgets
        if budget < context
        for variant, policy in variants(settings)
    ]


def authors_scores(attention: torch.Tensor, values: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``a_j / (1 - a_j) * ||W_o^h o_h - W_o^h v_j||`` through an explicit ``[b, h, P, hidden]`` projection.

    ``attention`` ``[b, h, P]`` is the aggregated window attention over the past tokens, ``values``
    ``[b, kv, >= P, d]``, ``weight`` the output projection ``[hidden, h * d]``. The same score as
    `restkv.scoring.reconstruction_after` (``tau`` 1), which needs only ``d x d`` Gram matrices.
    """
    heads, past = attention.shape[1:]
    v = values[:, :, :past].float().repeat_interleave(heads // values.shape[1], dim=1)  # [b, h, P, d]
    per_head = weight.float().view(weight.shape[0], heads, v.shape[-1])  # [hidden, h, d]
    projected = torch.einsum("bhpd,chd->bhpc", v, per_head)  # [b, h, P, hidden]
    output = torch.einsum("bhp,bhpc->bhc", attention, projected)
    return scoring.odds(attention) * (output[:, :, None] - projected).norm(dim=-1)


def authors_select(policy: Any, inputs: LayerInputs, weight: torch.Tensor, budget: int) -> torch.Tensor:
    """The authors' eviction decision: `authors_scores` then the top ``budget - window`` per query head."""
    if (policy.indicator, policy.order, policy.use_wo) != ("reconstruction", "after", True):
        raise ValueError("latency.scoring_authors: the authors' formulation is ReST-KV's after-order W_o score")
    attention = scoring.window_attention(
        inputs.queries[..., -policy.window :, :], inputs.keys, inputs.scaling, inputs.softcap
    )
    past = inputs.length - policy.window
    row = scoring.aggregate(attention, policy.temporal, policy.alpha)[..., :past]
    return authors_scores(row, inputs.values, weight).topk(budget - policy.window, dim=-1).indices


def random_layer(
    shape: LayerShape, length: int, window: int, settings: Settings, device: torch.device
) -> tuple[torch.Tensor, LayerInputs]:
    """The output projection's weight and a policy's inputs for a ``length``-token prompt, random."""
    generator = torch.Generator(device=device).manual_seed(settings.seed)

    def randn(*size: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(size, generator=generator, device=device) * scale).to(settings.torch_dtype)

    weight = randn(shape.hidden, shape.heads * shape.head_dim, scale=shape.hidden**-0.5)
    inputs = LayerInputs(
        queries=randn(1, shape.heads, window, shape.head_dim),
        keys=randn(1, shape.kv_heads, length, shape.head_dim),
        values=randn(1, shape.kv_heads, length, shape.head_dim),
        layer=0,
        num_layers=1,
    )
    return weight, inputs


def decision(settings: Settings, job: Job, device: torch.device) -> Callable[[], object]:
    """Build ``job``'s inputs; the call that makes its eviction decision once."""
    policy: Policy = configured_policy(job["policy"], settings.policy_knobs)
    shape = LayerShape.of(model_config(settings))
    weight, inputs = random_layer(shape, job["context"], policy.window, settings, device)
    if job["variant"] == AUTHORS:
        return lambda: authors_select(policy, inputs, weight, job["budget"])
    if job["variant"].endswith(EVERY_CALL):
        inputs.output_gram = lambda: scoring.output_gram(weight, shape.heads)
    elif policy.needs_output_gram:
        cached = scoring.output_gram(weight, shape.heads)
        inputs.output_gram = lambda: cached
    budget = Budget(job["budget"])
    return lambda: policy.select(inputs, budget)


def measure_variant(settings_dict: dict[str, Any], job: Job) -> dict[str, Any]:
    """In a fresh process: one decision under the peak-memory probe, then ``scoring_calls`` timed ones."""
    settings = Settings(**settings_dict)
    apply_threads(settings)
    device = settings.resolved_device()
    run = decision(settings, job, device)
    with torch.no_grad():
        _, peak = measured(device, run)
        seconds = timed_calls(run, device, settings.scoring_calls)
    return {"seconds": seconds, "memory": peak, "threads": torch.get_num_threads()}


def run(settings: Settings) -> dict[str, Any]:
    """Every configuration of every context, rounds alternating; raw measurements (see `report.summarize_scoring`)."""
    apply_threads(settings)
    device = settings.resolved_device()
    plan = {context: scoring_jobs(settings, context) for context in settings.contexts}
    jobs = [job for group in plan.values() for job in group]
    bar = progress(settings, len(jobs) * (settings.warmup + settings.repeats))
    result: dict[str, Any] = {"machine": machine(device), "load_average_start": load()}
    result["layer"] = asdict(LayerShape.of(model_config(settings)))
    result["variants"] = describe(settings)
    isolate, payload = Isolated(preload=["restkv.eval.latency.scoring_mode"]), settings.to_dict()
    timed: list[list[dict[str, Any]]] = []
    for context, group in plan.items():
        bar.set_postfix_str(f"scoring {context}")
        timed += alternate(group, settings, lambda _, job: isolate(measure_variant, payload, job), bar.update)
    bar.close()
    result["load_average_end"] = load()
    result["runs"] = [{"job": job, "timed": runs} for job, runs in zip(jobs, timed, strict=True)]
    return result
