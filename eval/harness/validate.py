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
import difflib
import importlib
import math
import os
import re
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from restkv.budget import Budget
from restkv.choices import DECODE_PATHS, DECODE_SCHEDULES, LAYOUTS, PHASES
from restkv.eval.harness.choices import ON_CHANGE, PROTOCOLS


def describe(kind: Any) -> str:
    """A type annotation in words, for error messages."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(arg) for arg in args)
    if origin in (list, tuple):
        return f"a list of {describe(args[0]).removeprefix('a ').removeprefix('an ')}s" if args else "a list"
    if origin is dict:
        return "a mapping"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}
    return names.get(kind, getattr(kind, "__name__", str(kind)))


def conforms(value: Any, kind: Any) -> bool:
    """Whether ``value`` (as Hydra gives it) is of type ``kind``; unknown annotations accept anything."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any or isinstance(kind, str | typing.TypeVar):
        return True
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, arg) for arg in args)
    if origin in (list, tuple):
        return isinstance(value, list | tuple) and all(conforms(item, args[0]) for item in value) if args else True
    if origin is dict:
        return isinstance(value, dict)
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is type(None):
        return value is None
    if isinstance(kind, type) and kind in (str, dict, list):
        return isinstance(value, kind)
    return True  # a nested object (e.g. a benchmark given to another): checked on its own node


def check_value(key: str, value: Any, kind: Any) -> None:
    if not conforms(value, kind):
        raise ValueError(f"{key}={value!r} is not allowed; it must be {describe(kind)}")


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


def check_out_dir(out_dir: Any) -> Path:
    """``out_dir`` as a path that can be created and written, checked without creating anything."""
    check_value("out_dir", out_dir, str)
    if not out_dir.strip():
        raise ValueError(
            f"out_dir={out_dir!r} is not allowed: name the folder results go to (out_dir=results is the default)"
        )
    path = Path(out_dir).expanduser()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"out_dir={out_dir!r} is not allowed: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"out_dir={out_dir!r} is not writable ({existing} does not allow writing); choose another")
    return path


def check_budget(budget: Any) -> None:
    if isinstance(budget, bool) or not isinstance(budget, int | float):
        raise ValueError(
            f"budget={budget!r} is not allowed; it must be a token count (integer) or a fraction in (0, 1)"
        )
    if isinstance(budget, float) and not (math.isfinite(budget) and (0 < budget < 1 or budget.is_integer())):
        raise ValueError(f"budget={budget!r} is not allowed; a fraction of the prompt must lie in (0, 1)")
    Budget(budget)  # budget=1.0 is ambiguous: refused with the way out


def _one_of(key: str, choices: tuple[str, ...]) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value not in choices:
            raise ValueError(
                f"{key}={value!r} is not allowed; choose one of: {', '.join(choices)}{suggest(value, choices)}"
            )

    return check


def check_limit(limit: Any) -> None:
    check_value("limit", limit, int | None)
    if limit is not None and limit < 1:
        raise ValueError(f"limit={limit!r} is not allowed; it must be an integer >= 1 (or null for every sample)")


def check_device_name(device: Any) -> None:
    """The form of ``device`` (whether this machine has it is checked when the run picks it)."""
    if not (isinstance(device, str) and re.fullmatch(r"[a-z]+(:\d+)?", device)):
        raise ValueError(f"device={device!r} is not a device; use auto, cpu, cuda or cuda:N")


def check_decode_batch(value: Any) -> None:
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"decode_batch={value!r} is not allowed; use auto or an integer >= 1 (1: one prompt a step)")


COMPRESSION_KEYS = ("phase", "decode_budget", "decode_interval", "decode_schedule", "prefill_chunk")


def check_compression(value: Any) -> None:
    """``compression``: when eviction happens (``phase``) and the decode-time budget and interval."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise ValueError(f"compression={value!r} is not allowed; set compression.phase, compression.decode_budget ...")
    for key in value:
        if key not in COMPRESSION_KEYS:
            allowed = ", ".join(COMPRESSION_KEYS)
            raise ValueError(f"compression.{key} is not a setting; allowed: {allowed}{suggest(key, COMPRESSION_KEYS)}")
    _one_of("compression.phase", PHASES)(value.get("phase", "prefill"))
    _one_of("compression.decode_schedule", DECODE_SCHEDULES)(value.get("decode_schedule", "interval"))
    for key, optional in (("decode_budget", True), ("decode_interval", False), ("prefill_chunk", True)):
        number = value.get(key, None if optional else 32)
        if number is None and optional:
            continue
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise ValueError(f"compression.{key}={number!r} is not allowed; it must be an integer >= 1")


RUN_KEY_CHECKS: dict[str, Callable[[Any], object]] = {
    "compression": check_compression,
    "budget": check_budget,
    "protocol": _one_of("protocol", PROTOCOLS),
    "layout": _one_of("layout", LAYOUTS),
    "decode": _one_of("decode", DECODE_PATHS),
    "decode_batch": check_decode_batch,
    "limit": check_limit,
    "allow_skips": lambda value: check_value("allow_skips", value, bool),
    "on_change": _one_of("on_change", ON_CHANGE),
    "device": check_device_name,
    "out_dir": check_out_dir,
}
"""Each top-level key of ``configs/config.yaml`` and its check, torch-free: the command line's values are checked
with them before any heavy import (`restkv.eval.harness.preflight`), the composed config's again before a run."""
RUN_KEY_DEFAULTS = {"layout": "auto", "decode": "auto", "decode_batch": "auto", "allow_skips": False,
                    "on_change": "refuse", "device": "auto"}  # fmt: skip


def check_run_keys(values: dict[str, Any]) -> None:
    """The top-level keys of ``configs/config.yaml`` (budget, protocol, layout, limit, out_dir, ...)."""
    for key, check in RUN_KEY_CHECKS.items():
        check(values.get(key, RUN_KEY_DEFAULTS.get(key)))


def suggest(value: Any, names: Iterable[str]) -> str:
    """``"; did you mean X?"`` for the name in ``names`` closest to ``value``, or "" when none is close."""
    close = difflib.get_close_matches(str(value), list(names), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def check_config(values: dict[str, Any]) -> None:
    """Everything the user can set, before any model, data or folder is touched (``values``: resolved config)."""
    check_run_keys(values)
    for group in ("policy", "bench", "evaluation"):
        node = values.get(group)
        if not isinstance(node, dict):
            raise ValueError(f"the config has no {group} (choose one: {group}=<name>)")
        check_node(node, group)
    check_combinations(values)


EVALUATION_PROTOCOLS = {"MultiTurn": "query_agnostic"}
"""Evaluation strategies that compress one way whatever ``protocol`` says: ``MultiTurn`` compresses the context
alone, then asks each question (eval/evaluation/multi_turn.py)."""


def check_combinations(values: dict[str, Any]) -> None:
    """Settings that are each valid but cannot act together: refused rather than recorded as if they had."""
    evaluation = str((values.get("evaluation") or {}).get("_target_", "")).rpartition(".")[2]
    phase = (values.get("compression") or {}).get("phase", "prefill")
    if evaluation == "Fidelity" and phase != "prefill":
        raise ValueError(
            f"evaluation=fidelity with compression.phase={phase} is not allowed: fidelity scores the prompt's "
            "compressed cache over a teacher-forced reference, where no decode-time cut is ever made; use "
            "evaluation=generate to measure decode-time eviction, or compression.phase=prefill"
        )
    fixed = EVALUATION_PROTOCOLS.get(evaluation)
    protocol = values.get("protocol", "query_aware")
    if fixed is not None and protocol != fixed:
        raise ValueError(
            f"evaluation=multi_turn with protocol={protocol} is not allowed: it compresses the context alone, then "
            f"asks each question (protocol={fixed}); add protocol={fixed}, so that the run records what it does"
        )
