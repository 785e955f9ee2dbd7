"""Policy names -> classes, so that runners and users can ask for a policy by name."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any, TypeVar

_POLICIES: dict[str, type] = {}
_BUILTIN_MODULES = ("restkv.restkv", "baselines")

P = TypeVar("P", bound=type)


def register_policy(name: str) -> Callable[[P], P]:
    """Class decorator: make a policy available as ``get_policy(name)``."""

    def decorate(cls: P) -> P:
        existing = _POLICIES.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(f"policy name {name!r} is already taken by {existing.__module__}.{existing.__name__}")
        _POLICIES[name] = cls
        return cls

    return decorate


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)


def policy_names() -> list[str]:
    """Names of every registered policy, sorted."""
    _load_builtins()
    return sorted(_POLICIES)


def get_policy(name: str, **knobs: Any) -> Any:
    """Build the policy registered as ``name`` with ``knobs`` (its dataclass fields)."""
    _load_builtins()
    if name not in _POLICIES:
        raise ValueError(f"unknown policy {name!r}; registered policies: {', '.join(sorted(_POLICIES))}")
    cls = _POLICIES[name]
    allowed = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(knobs) - allowed)
    if unknown:
        raise ValueError(f"policy {name!r} has no knob {', '.join(unknown)}; its knobs: {', '.join(sorted(allowed))}")
    return cls(**knobs)
