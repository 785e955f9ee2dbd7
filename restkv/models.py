"""Which models eviction supports, their attention layers, and what cannot be evicted correctly.

Every supported family runs through the one integration layer (`restkv.integrate`): attention modules are found
by what they have (an output projection and a layer index), not by class, and the queries are captured inside
the model's own attention call. What differs per family is data: which layers attend within a sliding window
(`restkv.windows`), and whether logits are soft-capped (read from the attention call).
"""

from __future__ import annotations

from torch import nn

from restkv.policy import Policy

SUPPORTED_TRANSFORMERS = ">=5.2,<6"
"""The transformers releases restkv supports (pyproject's pin; CI tests the oldest 5.2.x and the newest)."""
SUPPORTED_ATTENTION = ("eager", "sdpa", "flash_attention_2")
"""Backends eviction runs under (flash_attention_2 is covered by the `gpu`-marked tests; others are refused)."""
SUPPORTED_MODELS = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "GemmaForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Phi3ForCausalLM",
)


def attention_layers(model: nn.Module) -> list[nn.Module]:
    """The model's self-attention modules in layer order; raises for unsupported models."""
    name = type(model).__name__
    if name not in SUPPORTED_MODELS:
        raise ValueError(f"model class {name} is not supported; supported: {', '.join(SUPPORTED_MODELS)}")
    layers = [m for m in model.modules() if hasattr(m, "o_proj") and hasattr(m, "layer_idx")]
    if [m.layer_idx for m in layers] != list(range(len(layers))):
        raise ValueError(f"could not find the attention layers of {name} in order")
    return layers


def check_layers(model: nn.Module, layers: list[nn.Module], windowed: frozenset[int], policy: Policy) -> int:
    """The last layer eviction changes; raises for attention it cannot evict correctly (bidirectional, or every
    layer within a sliding window)."""
    name = type(model).__name__
    if any(getattr(module, "is_causal", True) is False for module in layers):
        raise ValueError(
            f"{name} attends bidirectionally (use_bidirectional_attention); eviction assumes causal attention"
        )
    softcap = getattr(model.config, "attn_logit_softcapping", None)
    if softcap is not None and name == "Gemma2ForCausalLM" and model.config._attn_implementation == "sdpa":
        raise ValueError(
            f"{name} soft-caps its attention logits (attn_logit_softcapping={softcap}), which PyTorch's sdpa kernel "
            "cannot do (transformers 5.2 drops it silently): load the model with attn_implementation='eager' "
            "(model.attn_implementation=eager) or flash_attention_2"
        )
    evictable = [module.layer_idx for module in layers if module.layer_idx not in windowed]
    if not evictable and policy.evicts:
        raise ValueError(
            f"every attention layer of {name} attends within a sliding window shorter than its context "
            f"(config.sliding_window={getattr(model.config, 'sliding_window', None)}); those layers already keep only "
            "their window and are never evicted, so this model has nothing to evict"
        )
    return evictable[-1] if evictable else -1


def check_attention(implementation: str, layout: str, supported: tuple[str, ...]) -> str:
    """``implementation`` when eviction runs under it with ``layout``; raises naming what to use otherwise."""
    if implementation not in supported:
        raise ValueError(
            f"attention implementation {implementation!r} is not supported; supported: {', '.join(supported)}"
        )
    if layout == "masked" and implementation not in ("eager", "sdpa"):
        raise ValueError(
            f"layout='masked' needs a masked attention kernel (eager or sdpa); the model runs {implementation!r}. "
            "Use layout='varlen' (or 'auto'), or model.attn_implementation=sdpa"
        )
    return implementation
