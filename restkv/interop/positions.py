"""Which prompt positions a compressor kept, per layer and key/value head, for comparing compressors.

Our compressor records its kept positions (`KVCompressor.record`); kvpress's presses only leave
a smaller cache. `kept_positions` recovers them by matching each kept key against the full cache's
keys (rotary keys of distinct positions differ, and eviction copies keys bit for bit), so a press
can be measured running its own code, unmodified. `press_positions` and `policy_positions` run one
prompt through each; `seeded_layers` seeds torch's generator before every attention layer, as
``policy=kvpress`` does for presses that draw random numbers, so both see the same draws.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache

from restkv.integrate import attention_layers, compress
from restkv.policy import Policy

Positions = list[torch.Tensor]
"""Per layer, the kept positions ``[h_kv, kept]`` (ascending) of batch item 0."""


def kept_positions(compressed: Any, full: Any) -> Positions:
    """Positions of ``compressed``'s keys in ``full``'s (two caches of the same prompt), per layer."""
    found = []
    for layer, (kept, every) in enumerate(zip(compressed.layers, full.layers, strict=True)):
        keys, reference = kept.keys[0], every.keys[0]  # [h_kv, n, d], [h_kv, L, d]
        matches = (keys[:, :, None, :] == reference[:, None, :, :]).all(dim=-1)  # [h_kv, n, L]
        if not bool((matches.sum(dim=-1) == 1).all()):
            raise ValueError(f"layer {layer}: some kept keys match no prompt position, or several")
        found.append(matches.float().argmax(dim=-1).sort(dim=-1).values.cpu())
    return found


@contextlib.contextmanager
def seeded_layers(model: nn.Module) -> Iterator[None]:
    """Seed torch's generator with the layer index before each attention layer's forward."""

    def seed(module: nn.Module, args: tuple) -> None:
        torch.manual_seed(module.layer_idx)

    hooks = [module.register_forward_pre_hook(seed) for module in attention_layers(model)]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


@torch.no_grad()
def full_cache(model: nn.Module, input_ids: torch.Tensor) -> DynamicCache:
    cache = DynamicCache()
    model.model(input_ids=input_ids, past_key_values=cache)
    return cache


@torch.no_grad()
def press_positions(model: nn.Module, press: Any, input_ids: torch.Tensor, full: Any | None = None) -> Positions:
    """What kvpress's ``press`` keeps of the prompt, running its own hooks (``with press(model)``)."""
    full = full_cache(model, input_ids) if full is None else full
    cache = DynamicCache()
    with press(model), seeded_layers(model):
        model.model(input_ids=input_ids, past_key_values=cache)
    return kept_positions(cache, full)


@torch.no_grad()
def policy_positions(model: nn.Module, policy: Policy, budget: int | float, input_ids: torch.Tensor) -> Positions:
    """What ``policy`` keeps of the prompt under our integration (`restkv.compress`)."""
    if policy.stages.allocation.headwise:
        raise ValueError(
            f"policy_positions compares rectangular selections; {type(policy).__name__}."
            f"{policy.stages.allocation.setting} keeps a different count per head (read compress(...).record.indices "
            "instead)"
        )
    with compress(model, policy, budget) as compressor:
        model.model(input_ids=input_ids, past_key_values=DynamicCache())
    length = input_ids.shape[1]
    return [
        torch.arange(length).expand(model.config.num_key_value_heads, length) if kept is None else kept[0].cpu()
        for kept in compressor.record.indices
    ]
