"""Policy names -> classes (and named presets), so that runners and users can ask for a policy by name.

The core does not know its plugins: a package registers its policies by declaring the module that
defines them as an entry point of the group ``restkv.policies`` (ours: ``restkv.baselines``, see
``pyproject.toml``), or simply by being imported. Entry points are loaded on the first look-up.

A *preset* is a registered policy with some knobs set, named after where it comes from (the
authors' RULER setting, the paper's ablation rows): ``get_policy("restkv_ruler")`` is
``ReSTKV(kernel=21)``. Every name, policy or preset, has a config file of the same name in
``configs/policy/``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, TypeVar

ENTRY_POINT_GROUP = "restkv.policies"

_POLICIES: dict[str, type] = {}
_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {}
_CORE_MODULES = ("restkv.restkv", "restkv.presets", "restkv.interop.kvpress_policy")
_loaded = False

P = TypeVar("P", bound=type)


def register_policy(name: str) -> Callable[[P], P]:
    """Class decorator: make a policy available as ``get_policy(name)``."""

    def decorate(cls: P) -> P:
        existing = _POLICIES.get(name)
        if existing is not None and _same_definition(existing, cls):
            return cls  # one file run as a script and imported as a module: one policy (the first stays registered)
        if existing is not None and existing is not cls:
            raise ValueError(f"policy name {name!r} is already taken by {existing.__module__}.{existing.__name__}")
        if name in _PRESETS:
            raise ValueError(f"policy name {name!r} is already a preset")
        _POLICIES[name] = cls
        return cls

    return decorate


def _source(cls: type) -> str | None:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return None


def _same_definition(first: type, second: type) -> bool:
    """Whether two classes are one definition loaded twice: a policy file run as a script (``__main__``) and the
    same file, or a copy of it (the policy guide's example put in ``baselines/``), imported when the registry loads
    ``restkv.baselines``. Same name and same source text: the first registered stays."""
    if first is second:
        return True
    if first.__qualname__ != second.__qualname__:
        return False
    source = _source(first)
    return source is not None and source == _source(second)


def register_preset(name: str, policy: str, **knobs: Any) -> None:
    """Make ``get_policy(name)`` the registered ``policy`` with ``knobs`` set (checked when first built)."""
    if name in _POLICIES or _PRESETS.get(name, (policy, knobs)) != (policy, knobs):
        raise ValueError(f"policy name {name!r} is already taken")
    _PRESETS[name] = (policy, dict(knobs))


def _load_plugins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in _CORE_MODULES:
        importlib.import_module(module)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        entry.load()


def policy_names() -> list[str]:
    """Names of every registered policy class, sorted (presets: `preset_names`)."""
    _load_plugins()
    return sorted(_POLICIES)


def preset_names() -> list[str]:
    """Names of every registered preset, sorted."""
    _load_plugins()
    return sorted(_PRESETS)


def resolve_policy(name: str) -> tuple[type, dict[str, Any]]:
    """The class behind ``name`` and the knobs its preset sets (empty for a plain policy)."""
    _load_plugins()
    if name in _PRESETS:
        base, knobs = _PRESETS[name]
        if base not in _POLICIES:
            raise ValueError(f"preset {name!r} is of policy {base!r}, which is not registered")
        return _POLICIES[base], dict(knobs)
    if name not in _POLICIES:
        raise ValueError(
            f"unknown policy {name!r}; registered policies: {', '.join(policy_names())}; presets: "
            f"{', '.join(preset_names())} (a package's policies "
            f"register through the {ENTRY_POINT_GROUP!r} entry point when it is installed, or on import)"
        )
    return _POLICIES[name], {}


def policy_defaults(name: str) -> dict[str, Any]:
    """Every knob of ``name`` with its value when not overridden: the dataclass defaults, then the preset's."""
    cls, preset = resolve_policy(name)
    defaults = {
        f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
        for f in dataclasses.fields(cls)
    }
    return {**defaults, **preset}


def get_policy(name: str, **knobs: Any) -> Any:
    """Build the policy (or preset) registered as ``name`` with ``knobs`` (its dataclass fields)."""
    cls, preset = resolve_policy(name)
    allowed = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(knobs) - allowed)
    if unknown:
        raise ValueError(f"policy {name!r} has no knob {', '.join(unknown)}; its knobs: {', '.join(sorted(allowed))}")
    return cls(**{**preset, **knobs})
