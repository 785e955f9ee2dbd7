"""Validation of configuration values, with messages that name the owner, the knob and what is allowed.

Policies, the integration and the benchmarks all check their knobs the same way, so a wrong value
on the command line (``policy.gqa=sum``, ``bench.chat_template=raw``) is refused with one kind of
message wherever it is set; a layer's cache is checked for NaN and inf before eviction scores it.
This module depends on nothing else in the project.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the argument checks here run before torch is imported; the cache check imports it
    import torch

__all__ = ["check_choice", "check_finite_cache", "check_number", "check_type"]


def check_type(
    owner: str, name: str, value: object, expected: type | tuple[type, ...], what: str, hint: str = ""
) -> None:
    """Raise a TypeError naming the argument, the value's type and what is expected unless ``value`` is an
    instance of ``expected`` (booleans never pass for numbers); ``hint`` says how to build the right thing."""
    types = expected if isinstance(expected, tuple) else (expected,)
    if isinstance(value, types) and not (isinstance(value, bool) and bool not in types and int in types):
        return
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise TypeError(
        f"{owner}: {name} must be {what}, got {type(value).__name__} {shown}" + (f"; {hint}" if hint else "")
    )


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


def check_finite_cache(layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Raise a ValueError if ``keys`` or ``values`` hold NaN or inf: every eviction score would be NaN.

    The common case costs one read of each tensor and no copy: a sum accumulated in (at least)
    float32 is finite unless an entry is NaN or inf. Only a non-finite sum (an entry is, or huge
    finite entries overflowed the sum) counts the entries one by one, to name them or to let the
    layer through. One device synchronisation per layer.
    """
    import torch

    tensors = {"key": keys, "value": values}
    sums = torch.stack([t.sum(dtype=torch.promote_types(t.dtype, torch.float32)) for t in tensors.values()])
    if bool(torch.isfinite(sums).all()):
        return
    counts = {name: int(t.numel() - torch.isfinite(t).sum()) for name, t in tensors.items()}
    bad = [name for name, count in counts.items() if count]
    if not bad:
        return
    listed = " and ".join(f"{counts[name]} of {tensors[name].numel()} {name} entries" for name in bad)
    raise ValueError(
        f"non-finite {' and '.join(f'{name}s' for name in bad)} in layer {layer} ({listed} are NaN or inf): every "
        "eviction score would be NaN and the kept positions arbitrary. The model's activations overflowed or are NaN; "
        "in float16 this is usually an overflow: run the model in bfloat16 or float32 (e.g. model.dtype=bfloat16)"
    )
