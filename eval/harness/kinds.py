"""Types in words and values against types, as Hydra hands them over: the checker behind every setting's error.

Hydra gives plain values: ``limit=1.5``, ``policy.use_wo=maybe`` or ``bench.lengths=[512.5]`` arrive as a float, a
string and a list of floats. `conforms` says whether such a value is of an annotation's type (a ``bool`` is not an
integer here, an integer is a number) and `describe` names the type in an error message. Torch-free: the command
line is checked with it before any heavy import.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable
from typing import Any


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
    """Refuse ``value`` unless it is of type ``kind``, naming the key, the value and the type."""
    if not conforms(value, kind):
        raise ValueError(f"{key}={value!r} is not allowed; it must be {describe(kind)}")


def suggest(value: Any, names: Iterable[str]) -> str:
    """``"; did you mean X?"`` for the name in ``names`` closest to ``value``, or "" when none is close."""
    close = difflib.get_close_matches(str(value), list(names), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def check_one_of(key: str, value: Any, choices: tuple[str, ...]) -> None:
    """Refuse ``value`` unless it is one of ``choices``, with the closest one."""
    if value not in choices:
        raise ValueError(
            f"{key}={value!r} is not allowed; choose one of: {', '.join(choices)}{suggest(value, choices)}"
        )
