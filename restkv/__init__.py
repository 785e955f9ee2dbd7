"""restkv: KV cache eviction policies (ReST-KV and baselines) for Hugging Face models.

from restkv import ReSTKV, compress
with compress(model, ReSTKV(), budget=128):
    output = model.generate(**inputs, max_new_tokens=32)

Every registered policy class is importable here too (``from restkv import SnapKV``). The names are imported when
first used, so that ``import restkv.eval...`` (the harness's
argument checks) does not pay for torch and transformers before it needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from restkv.integrate import KVCompressor, compress
    from restkv.policy import LayerInputs, Policy
    from restkv.registry import get_policy, policy_names, preset_names, register_policy, register_preset
    from restkv.restkv import ReSTKV
    from restkv.scoring_policy import ScoringPolicy
    from restkv.select import Budget
    from restkv.storage.quantize import Quantization

_EXPORTS = {
    "Budget": "restkv.select",
    "KVCompressor": "restkv.integrate",
    "LayerInputs": "restkv.policy",
    "Policy": "restkv.policy",
    "Quantization": "restkv.storage.quantize",
    "ReSTKV": "restkv.restkv",
    "ScoringPolicy": "restkv.scoring_policy",
    "compress": "restkv.integrate",
    "get_policy": "restkv.registry",
    "policy_names": "restkv.registry",
    "preset_names": "restkv.registry",
    "register_policy": "restkv.registry",
    "register_preset": "restkv.registry",
}

__all__ = [
    "Budget",
    "KVCompressor",
    "LayerInputs",
    "Policy",
    "Quantization",
    "ReSTKV",
    "ScoringPolicy",
    "compress",
    "get_policy",
    "policy_names",
    "preset_names",
    "register_policy",
    "register_preset",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif name[:1].isupper() and name in _policy_classes():
        value = _policy_classes()[name]
    else:
        raise AttributeError(f"module 'restkv' has no attribute {name!r}")
    globals()[name] = value
    return value


def _policy_classes() -> dict[str, type]:
    """Every registered policy class by its class name (``SnapKV``, ``PyramidKV``...): importable from ``restkv``
    where users look for them, wherever their file lives (``restkv.baselines`` for the baselines)."""
    from restkv.registry import policy_names, resolve_policy

    return {cls.__name__: cls for cls in (resolve_policy(name)[0] for name in policy_names())}


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_policy_classes()})
