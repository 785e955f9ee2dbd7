"""Random-weight models of a real shape, cache construction and byte counting.

Timing needs no trained weights: a model with a real model's shape and random weights runs the
same kernels on the same amounts of data.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, DynamicCache, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicLayer
from transformers.initialization import no_init_weights

from restkv.cache import CompressedLayer
from restkv.eval.latency.headwise import HEADWISE, SPREAD, synthetic_headwise_layer
from restkv.storage.layouts import layer_size


def random_model(config: PretrainedConfig, dtype: torch.dtype, device: torch.device, seed: int = 0) -> PreTrainedModel:
    """``config``'s architecture on ``device`` with N(0, 0.02) weights (norms at 1), in eval mode.

    Built without transformers' per-module initialisation (three times faster on a CPU) and
    filled in place, directly on the device.
    """
    with torch.device(device), no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=config._attn_implementation)
    model.tie_weights()  # skipped under no_init_weights; ties the LM head to the embedding where the config says so
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.fill_(1.0)
            else:
                parameter.normal_(0.0, 0.02, generator=generator)
    return model.eval()


def cache_token_bytes(config: PretrainedConfig, dtype: torch.dtype) -> int:
    """Bytes one token adds to a full cache: every layer's keys and values."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    itemsize = torch.empty((), dtype=dtype).element_size()
    return config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * itemsize


def parameter_bytes_read(model: nn.Module) -> int:
    """Bytes of weights one decode step reads: every parameter once (tied ones once).

    The input embedding is a row lookup, not a read of the table, unless the LM head shares it
    (then the head reads it whole and it is counted once).
    """
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # parameters() skips tied duplicates
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is None or head.weight.data_ptr() != embedding.data_ptr():
        total -= embedding.numel() * embedding.element_size() - embedding.shape[1] * embedding.element_size()
    return total


def cache_bytes(cache: DynamicCache) -> dict[str, Any]:
    """A whole cache's bytes, from `restkv.storage.layouts.layer_size` for every layer kind.

    ``logical`` (the kept tokens of every stored head), ``allocated`` (any decode reserve and mask
    included), ``reserve`` (the free decode slots' share of it), ``read`` (what a decode step's
    attention reads: everything stored, which for a masked cache is the whole context), ``per_token``
    (what one decoded token adds), the mean tokens per stored head and layer, ``logical_per_layer`` and
    ``allocated_per_layer`` (head-wise policies give layers different totals), and ``layer_kinds``
    (the layer classes present: shows which layout a prefill's ``auto`` actually stored).
    """
    sizes = [layer_size(layer) for layer in cache.layers]
    return {
        "logical": sum(s.logical_bytes for s in sizes),
        "allocated": sum(s.allocated_bytes for s in sizes),
        "read": sum(s.read_bytes for s in sizes),
        "per_token": sum(s.token_bytes for s in sizes),
        "reserve": sum(s.reserve_bytes for s in sizes),
        "tokens_mean": round(sum(s.head_tokens / s.heads for s in sizes) / max(len(sizes), 1), 2),
        "logical_per_layer": [s.logical_bytes for s in sizes],
        "allocated_per_layer": [s.allocated_bytes for s in sizes],
        "layer_kinds": sorted({type(layer).__name__ for layer in cache.layers}),
    }


def synthetic_base(config: PretrainedConfig, length: int, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """Random keys and values ``[1, kv_heads, length, head_dim]`` shared by every layer of a synthetic cache."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    generator = torch.Generator(device=device).manual_seed(seed)
    shape = (1, config.num_key_value_heads, length, head_dim)
    keys = torch.randn(shape, generator=generator, dtype=dtype, device=device)
    values = torch.randn(shape, generator=generator, dtype=dtype, device=device)
    return keys, values


def synthetic_cache(
    config: PretrainedConfig,
    base: tuple[torch.Tensor, torch.Tensor],
    tokens: int,
    kind: str,
    reserve: int,
    spread: float = SPREAD,
) -> DynamicCache:
    """A cache holding ``tokens`` tokens per layer, as a prefill (+ eviction) would leave it.

    Every layer holds its own copy of the first ``tokens`` positions of ``base``. ``dynamic``: a
    transformers `DynamicLayer` for the full cache and an unbuffered `CompressedLayer` after eviction,
    both growing by concatenation; ``preallocated``: a `CompressedLayer` with ``reserve`` free slots,
    what `restkv.KVCompressor` builds with ``decode_reserve``; ``varlen``/``masked``: the head-wise layouts
    with the same total kept tokens per layer (`restkv.eval.latency.headwise`), with ``reserve``; ``spread``
    sets how unevenly their heads share it (0: every head ``tokens``).
    """
    keys, values = base
    full = tokens >= keys.shape[2]
    cache = DynamicCache(config=config)
    for index in range(config.num_hidden_layers):
        k, v = keys[:, :, :tokens], values[:, :, :tokens]
        if kind in HEADWISE:
            layer = synthetic_headwise_layer(keys, values, tokens, kind, reserve, spread)
        elif kind == "preallocated":
            layer: DynamicLayer = CompressedLayer(k, v, reserve=reserve)
        elif full:
            layer = DynamicLayer()
            layer.lazy_initialization(k, v)
            layer.keys, layer.values = k.clone(), v.clone()
        else:
            layer = CompressedLayer(k.clone(), v.clone())
        cache.layers[index] = layer
    return cache
