"""Working with other KV-cache libraries: kvpress (NVIDIA), both ways.

- `restkv.interop.kvpress_press.ReSTKVPress`: ReST-KV (or any of our policies that score tokens)
  as a kvpress press, for kvpress's pipeline and evaluation (``from restkv.interop import ReSTKVPress``);
- ``restkv.interop.kvpress_policy.KVPressPolicy`` (``policy=kvpress``): kvpress's scoring presses as our policies;
- `restkv.interop.layer_calls`: each attention layer's prefill call (module, inputs, attention
  weights), which kvpress's scores need and our `LayerInputs` does not carry.

kvpress is an optional dependency (``pip install -e ".[kvpress]"``); nothing here imports it until
it is needed, so the rest of the project works without it.

Budgets and compression ratios: our budget is the number of tokens a layer keeps, window included;
kvpress keeps ``int(L * (1 - compression_ratio))`` of ``L`` prompt tokens (at least 1), its own window
included. `compression_ratio` gives the ratio under which kvpress keeps exactly ``kept`` tokens.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

KVPRESS_VERSION = "0.5.5"
EXTRA = 'pip install -e ".[kvpress]"'


class KVPressMissing(ImportError, ValueError):
    """kvpress is not installed (a ValueError too, so that ``eval/run.py`` reports it as one line)."""


def require_kvpress() -> Any:
    """The ``kvpress`` module, or a `KVPressMissing` naming the extra that installs it."""
    try:
        return importlib.import_module("kvpress")
    except ImportError as error:
        raise KVPressMissing(
            f"kvpress is not installed ({error}); install the extra: {EXTRA} (kvpress=={KVPRESS_VERSION}, "
            "which needs transformers < 5.3)"
        ) from error


def kvpress_kept(length: int, compression_ratio: float) -> int:
    """Tokens kvpress keeps of ``length`` under ``compression_ratio`` (its convention, restated)."""
    if compression_ratio >= 1.0:
        return 0
    return max(1, int(length * (1 - compression_ratio)))


def compression_ratio(kept: int, length: int) -> float:
    """The compression ratio under which kvpress keeps exactly ``kept`` of ``length`` tokens.

    It is ``1 - kept / length``, moved by the last bit where floating-point rounding would make
    kvpress's ``int(length * (1 - ratio))`` one token short (``1 - 0.2`` of 600 tokens keeps 119).
    """
    if not 1 <= kept <= length:
        raise ValueError(f"cannot keep {kept} of {length} tokens; it must lie in [1, {length}]")
    ratio = 1.0 - kept / length
    while kvpress_kept(length, ratio) < kept:
        ratio = math.nextafter(ratio, -math.inf)
    while kvpress_kept(length, ratio) > kept:
        ratio = math.nextafter(ratio, math.inf)
    return max(ratio, 0.0)


def __getattr__(name: str) -> Any:
    if name == "ReSTKVPress":  # lazily: the module subclasses kvpress's ScorerPress
        require_kvpress()
        return importlib.import_module("restkv.interop.kvpress_press").ReSTKVPress
    if name == "KVPressPolicy":  # lazily: it imports torch; kvpress only when a press is built
        return importlib.import_module("restkv.interop.kvpress_policy").KVPressPolicy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EXTRA",
    "KVPRESS_VERSION",
    "KVPressMissing",
    "KVPressPolicy",
    "ReSTKVPress",
    "compression_ratio",
    "require_kvpress",
]
