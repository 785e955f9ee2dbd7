"""The types of `restkv.compress`'s arguments, checked before anything else reads them.

``compress(model, "restkv", 64)`` or a dict as ``decode_eviction=`` would otherwise fail deep inside with an
``AttributeError`` on a string or a dict; here each wrong argument gets one TypeError naming it, the value's type,
what is expected and how to build it.
"""

from __future__ import annotations

from typing import Any

from restkv.checks import check_type

OPTIONS = (
    "decode_reserve",
    "decode_kernel",
    "timed",
    "layout",
    "varlen_kernel",
    "quantization",
    "decode_eviction",
    "trace_decode",
)
"""`restkv.compress`'s arguments after ``model, policy, budget``, each checked below."""


def check_compress_arguments(model: Any, policy: Any, budget: Any, **options: Any) -> None:
    """Raise a TypeError for the first argument of `restkv.compress` whose type is wrong (see the module).

    ``options`` are the other arguments of `restkv.integrate.KVCompressor`, all by name: an unknown one is a
    TypeError too, so the checks and the signature cannot drift apart."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"check_compress_arguments does not know {', '.join(unknown)}: add its check here")
    from torch import nn

    from restkv.decoding.eviction import DecodeEviction
    from restkv.policy import Policy
    from restkv.select import Budget

    owner = "compress"
    check_type(owner, "model", model, nn.Module, "a torch model (a transformers PreTrainedModel)")
    by_name = f"build it by name with restkv.get_policy({policy!r})" if isinstance(policy, str) else ""
    check_type(owner, "policy", policy, Policy, "a policy object such as restkv.ReSTKV()", by_name)
    what = "an int (tokens kept per layer), a float in (0, 1) (fraction kept) or a restkv.Budget"
    check_type(owner, "budget", budget, (int, float, Budget), what)
    check_type(owner, "decode_reserve", options["decode_reserve"], int, "an int (tokens)")
    for name in ("decode_kernel", "layout", "varlen_kernel"):
        check_type(owner, name, options[name], str, "a string naming a choice")
    for name in ("timed", "trace_decode"):
        check_type(owner, name, options[name], bool, "True or False")
    # quantization: refused by name in `restkv.storage.quantize.enabled_quantization` (with an example of what to pass)
    decode_eviction = options["decode_eviction"]
    if decode_eviction is not None:
        how = _build_hint("restkv.decoding.eviction.DecodeEviction", decode_eviction)
        what = "a restkv.decoding.eviction.DecodeEviction(budget, interval, phase) or None"
        check_type(owner, "decode_eviction", decode_eviction, DecodeEviction, what, how)


def _build_hint(cls: str, value: Any) -> str:
    """How to turn a dict of settings into the object expected ('' for anything else)."""
    return f"pass {cls}(**{{...}}) built from these settings" if isinstance(value, dict) else ""
