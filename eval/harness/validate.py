"""Every value a user can set, checked before anything is loaded or written.

Hydra hands the runner plain values: ``limit=1.5``, ``policy.use_wo=maybe`` or ``bench.lengths=[512.5]``
arrive as a float, a string and a list of floats, and would otherwise be accepted (Python slicing,
truthy strings) or fail deep inside a run. Here each top-level key and each field of the classes
the config builds (policy, benchmark, evaluation strategy: their dataclass annotations) is checked
against its type, and the error names the key, the value and what is allowed. Range checks stay
with the classes that own them (their ``__post_init__``).
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from typing import Any

from restkv.eval.harness.kinds import check_value, conforms, describe, suggest
from restkv.eval.harness.settings import (
    CHECKS,
    Settings,
    check_budget,
    check_decode_batch,
    check_device_name,
    check_out_dir,
    value_of,
)
from restkv.interop.press_catalogue import QUESTION_WINDOW

__all__ = [
    "RUN_KEY_CHECKS",
    "check_budget",
    "check_combinations",
    "check_config",
    "check_decode_batch",
    "check_device_name",
    "check_node",
    "check_out_dir",
    "check_run_keys",
    "check_value",
    "conforms",
    "describe",
    "suggest",
    "target_class",
]


def target_class(node: dict[str, Any], key: str) -> type:
    """The class a config node's ``_target_`` names, or a clear error."""
    target = node.get("_target_")
    if not isinstance(target, str) or "." not in target:
        raise ValueError(f"{key}._target_={target!r} must name a class as module.Class")
    module, _, name = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{key}._target_={target!r} cannot be imported: {error}") from error


def check_node(node: dict[str, Any], key: str) -> None:
    """Check a ``_target_`` node's fields against the target dataclass: known names, right types; recursively."""
    cls = target_class(node, key)
    if not dataclasses.is_dataclass(cls):
        return
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):  # annotations that cannot be evaluated here: check the names only
        hints = {}
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    for name, value in node.items():
        if name.startswith("_"):
            continue
        if name not in fields:
            raise ValueError(
                f"{key}.{name} is not a setting of {cls.__name__}{suggest(name, fields)} (its settings: "
                f"{', '.join(sorted(fields))})"
            )
        if isinstance(value, dict) and "_target_" in value:
            check_node(value, f"{key}.{name}")
        else:
            check_value(f"{key}.{name}", value, hints.get(name, Any))


RUN_KEY_CHECKS = CHECKS
"""Each run-level setting's check by its dotted key (`restkv.eval.harness.settings`), torch-free: the command
line's values are checked with them before any heavy import (`restkv.eval.harness.preflight`), the composed
config's again before a run."""


def check_run_keys(values: dict[str, Any]) -> Settings:
    """The top-level keys of ``configs/config.yaml`` (budget, protocol, layout, limit, out_dir, ...), as settings."""
    return Settings.of(values)


def check_config(values: dict[str, Any]) -> Settings:
    """Everything the user can set, before any model, data or folder is touched (``values``: resolved config); the
    run-level settings, checked."""
    settings = check_run_keys(values)
    for group in ("policy", "bench", "evaluation"):
        node = values.get(group)
        if not isinstance(node, dict):
            raise ValueError(f"the config has no {group} (choose one: {group}=<name>)")
        check_node(node, group)
    check_combinations(values)
    return settings


EVALUATION_PROTOCOLS = {"MultiTurn": "query_agnostic"}
"""Evaluation strategies that compress one way whatever ``protocol`` says: ``MultiTurn`` compresses the context
alone, then asks each question (eval/evaluation/multi_turn.py)."""


def check_combinations(values: dict[str, Any]) -> None:
    """Settings that are each valid but cannot act together: refused rather than recorded as if they had."""
    evaluation = str((values.get("evaluation") or {}).get("_target_", "")).rpartition(".")[2]
    phase = value_of(values, "compression.phase")
    if evaluation == "Fidelity" and phase != "prefill":
        raise ValueError(
            f"evaluation=fidelity with compression.phase={phase} is not allowed: fidelity scores the prompt's "
            "compressed cache over a teacher-forced reference, where no decode-time cut is ever made; use "
            "evaluation=generate to measure decode-time eviction, or compression.phase=prefill"
        )
    fixed = EVALUATION_PROTOCOLS.get(evaluation)
    protocol = value_of(values, "protocol")
    press = (values.get("policy") or {}).get("press")
    if press in QUESTION_WINDOW and protocol != "query_aware":
        raise ValueError(
            f"policy.press={press} with protocol={protocol} is not allowed: its window is the question, which must "
            "be inside the prefill; use protocol=query_aware (evaluation=generate or fidelity)"
        )
    if fixed is not None and protocol != fixed:
        raise ValueError(
            f"evaluation=multi_turn with protocol={protocol} is not allowed: it compresses the context alone, then "
            f"asks each question (protocol={fixed}); add protocol={fixed}, so that the run records what it does"
        )
