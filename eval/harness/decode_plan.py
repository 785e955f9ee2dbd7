"""How a run decodes, decided once: the path (eager, static, graph), the prompts per step and decode-time eviction.

`plan_decode` takes the run's settings, device, evaluation strategy, quantization and policy, checks every rule
of `RULES` once, in order, and returns a `DecodePlan`: the one place where decoding's settings meet. A rule either
says when a combination cannot act and what to use instead, or hands the check to the component that owns it (the
decode path's own check, `restkv.eval.evaluation.decoding.check_decode`; the policy's limits under decode-time
eviction, `restkv.decoding.eviction.check_decode_eviction`). `ONE_AT_A_TIME` says why a run's prompts cannot
share decode steps: ``decode_batch=auto`` then decodes one prompt a step, a number above 1 is refused with the
reason. docs/adding-a-decode-path.md says where a new path's rules go.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from restkv.decoding.eviction import DecodeEviction, check_decode_eviction
from restkv.eval.evaluation.decoding import check_decode
from restkv.eval.harness.settings import Settings, default
from restkv.policy import Policy
from restkv.storage.quantize import Quantization

PREALLOCATED_PATHS = ("static", "graph")
"""Decode paths that preallocate a static cache (`restkv.decoding.static_layers`): it cannot shrink."""
BATCHING_DEVICES = ("cuda",)
"""Device types where ``decode_batch=auto`` decodes many prompts per step (elsewhere one, unless asked)."""


@dataclass(frozen=True)
class DecodePlan:
    """How the run decodes: what `restkv.eval.evaluation.Session` and the runner's loop are given."""

    path: str = "auto"
    """The ``decode`` setting the run decodes with (``eager`` under decode-time eviction: the cache shrinks)."""
    rows: int | str = 1
    """Prompts per decode step: an integer, or ``auto`` (as many as free GPU memory holds)."""
    eviction: DecodeEviction | None = None
    """Eviction during decoding (``compression.phase=decode|both``); None for the paper's prefill-only eviction."""


@dataclass(frozen=True)
class Facts:
    """What the rules read: the run's settings and the parts built from its config."""

    run: Settings
    device: torch.device
    evaluation: Any
    quantization: Quantization
    policy: Policy

    @property
    def evicts_while_decoding(self) -> bool:
        return self.run.compression.phase != "prefill"

    def eviction(self) -> DecodeEviction:
        c = self.run.compression
        return DecodeEviction(c.decode_budget, c.decode_interval, c.phase, c.decode_schedule)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Rule:
    """One cross-rule: ``refuses(facts)`` names why the combination cannot act (None when it can)."""

    name: str
    refuses: Callable[[Facts], str | None]
    error: type[Exception] = ValueError


def _only(condition: bool, message: str) -> str | None:
    return message if condition else None


def _owned(check: Callable[[], object]) -> None:
    check()  # the owner raises with its own message


def _decode_schedule_without_eviction(f: Facts) -> str | None:
    schedule = f.run.compression.decode_schedule
    return _only(
        not f.evicts_while_decoding and schedule != default("compression.decode_schedule"),
        f"compression.decode_schedule={schedule!r} is set but compression.phase='prefill' evicts at the end of the "
        "prompt only: add compression.phase=decode (or both)",
    )


def _decode_budget_without_eviction(f: Facts) -> str | None:
    budget = f.run.compression.decode_budget
    return _only(
        not f.evicts_while_decoding and budget is not None,
        f"compression.decode_budget={budget} is set but compression.phase='prefill' evicts at the end of the prompt "
        "only: add compression.phase=decode (or both)",
    )


def _eviction_without_budget(f: Facts) -> str | None:
    return _only(
        f.evicts_while_decoding and f.run.compression.decode_budget is None,
        f"compression.phase={f.run.compression.phase!r} evicts during decoding and needs compression.decode_budget "
        "(tokens each layer keeps, window included)",
    )


def _eviction_of_what_cannot_be_cut(f: Facts) -> None:
    if f.evicts_while_decoding:
        quantization = f.quantization if f.quantization.enabled else None
        _owned(lambda: check_decode_eviction(f.policy, f.eviction(), f.run.layout, quantization))


def _eviction_with_a_preallocated_cache(f: Facts) -> str | None:
    decode, phase = f.run.decode, f.run.compression.phase
    return _only(
        f.evicts_while_decoding and decode in PREALLOCATED_PATHS,
        f"decode={decode} preallocates a cache that decode-time eviction cannot shrink: use decode=eager (or auto, "
        f"which decodes eagerly under compression.phase={phase})",
    )


def _rows_where_the_run_cannot_batch(f: Facts) -> str | None:
    rows, reason = f.run.decode_batch, one_at_a_time(f)
    return _only(
        rows != "auto" and rows > 1 and reason is not None,  # type: ignore[operator]
        f"decode_batch={rows} cannot batch this run: {reason}; use decode_batch=1 (or auto)",
    )


RULES: tuple[Rule, ...] = (
    Rule("the decode path runs on this device", lambda f: _owned(lambda: check_decode(f.run.decode, f.device))),
    Rule("a decode schedule acts only with decode-time eviction", _decode_schedule_without_eviction),
    Rule("a decode budget acts only with decode-time eviction", _decode_budget_without_eviction),
    Rule("decode-time eviction needs a decode budget", _eviction_without_budget),
    Rule("decode-time eviction cuts only what the policy and storage allow", _eviction_of_what_cannot_be_cut),
    Rule("decode-time eviction cannot shrink a preallocated cache", _eviction_with_a_preallocated_cache),
    Rule("many prompts per step only where the run can batch", _rows_where_the_run_cannot_batch),
)
"""Every rule between decoding's settings and the run's other parts, each checked once, in this order."""

ONE_AT_A_TIME: tuple[tuple[str, Callable[[Facts], str | None]], ...] = (
    (
        "decode-time eviction",
        lambda f: _only(f.evicts_while_decoding, "decode-time eviction decodes one prompt at a time"),
    ),
    (
        "the evaluation",
        lambda f: _only(
            not hasattr(f.evaluation, "evaluate_many"),
            f"evaluation={type(f.evaluation).__name__.lower()} evaluates one prompt at a time",
        ),
    ),
    (
        "quantized storage",
        lambda f: _only(
            f.quantization.enabled, f"quantized caches ({f.quantization.backend}) have no static form to decode in rows"
        ),
    ),
    (
        "the eager loop",
        lambda f: _only(
            f.run.decode == "eager", "decode=eager decodes with the model's own loop, one prompt at a time"
        ),
    ),
)
"""Why a run's prompts cannot share decode steps, first reason first (an evaluation batches by ``evaluate_many``)."""


def one_at_a_time(facts: Facts) -> str | None:
    """Why the run decodes one prompt per step, or None when its prompts can share steps."""
    return next((reason for _, why in ONE_AT_A_TIME if (reason := why(facts)) is not None), None)


def plan_decode(
    run: Settings, device: torch.device, evaluation: Any, quantization: Quantization, policy: Policy
) -> DecodePlan:
    """How the run decodes; a combination that cannot act is refused (each rule of `RULES` once, in order)."""
    facts = Facts(run, device, evaluation, quantization, policy)
    for rule in RULES:
        message = rule.refuses(facts)
        if message is not None:
            raise rule.error(message)
    eviction = facts.eviction() if facts.evicts_while_decoding else None
    reason = one_at_a_time(facts)
    if run.decode_batch == "auto":
        rows: int | str = 1 if device.type not in BATCHING_DEVICES or reason else "auto"
    else:
        rows = run.decode_batch
    return DecodePlan("eager" if eviction else run.decode, rows, eviction)
