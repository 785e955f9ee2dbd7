"""restkv: KV cache eviction policies (ReST-KV and baselines) for Hugging Face models.

from restkv import ReSTKV, compress
with compress(model, ReSTKV(), budget=128):
    output = model.generate(**inputs, max_new_tokens=32)
"""

from restkv.integrate import KVCompressor, compress
from restkv.policy import LayerInputs, Policy
from restkv.quantize import Quantization
from restkv.registry import get_policy, policy_names, preset_names, register_policy, register_preset
from restkv.restkv import ReSTKV
from restkv.scoring_policy import ScoringPolicy
from restkv.select import Budget

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
