"""Validation of configuration values, with messages that name the owner, the knob and what is allowed.

Policies, the integration and the benchmarks all check their knobs the same way, so a wrong value
on the command line (``policy.gqa=sum``, ``bench.chat_template=raw``) is refused with one kind of
message wherever it is set. This module depends on nothing else in the project.
"""

from __future__ import annotations

import math

__all__ = ["check_choice", "check_number"]


def check_choice(owner: str, name: str, value: object, allowed: tuple[str, ...]) -> None:
    """Raise a ValueError naming ``value`` and the allowed choices when it is not one of them."""
    if value not in allowed:
        raise ValueError(f"{owner}.{name}={value!r} is not allowed; choose one of: {', '.join(allowed)}")


def check_number(
    owner: str,
    name: str,
    value: object,
    *,
    low: float,
    high: float = math.inf,
    low_open: bool = True,
    integer: bool = False,
    high_open: bool = False,
) -> None:
    """Raise a ValueError unless ``value`` is a finite number in the given range."""
    kind = "an integer" if integer else "a number"
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    ok = ok and not isinstance(value, bool) and math.isfinite(value)  # type: ignore[arg-type]
    if ok:
        above = value > low if low_open else value >= low  # type: ignore[operator]
        ok = above and (value < high if high_open else value <= high)  # type: ignore[operator]
    if not ok:
        bracket, closing = "(" if low_open else "[", ")" if high_open else "]"
        interval = f"{bracket}{low}, {high}{closing}"
        raise ValueError(f"{owner}.{name}={value!r} is not allowed; it must be {kind} in {interval}")
