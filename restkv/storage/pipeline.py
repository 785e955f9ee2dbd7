"""What a layer's cache becomes after eviction: the kept tokens, merged, pruned and quantized as asked.

The integration calls `stored_layer` once per evicted layer. The steps run in a fixed order, each
optional: the policy's value merging (``merge``, on the whole prompt, before anything is dropped),
storage of the kept positions in the chosen layout (`restkv.storage.layouts.store`), ThinK's key-channel
pruning of the kept keys (``think_ratio``), then quantized storage (`restkv.storage.quantize`).
`check_storage` refuses, before any prefill, the combinations that cannot be stored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from restkv.cache import CompressedLayer
from restkv.policy import LayerInputs, Policy
from restkv.stages.allocation import HeadSelection
from restkv.storage.layouts import store
from restkv.storage.quantize import Quantization


def check_storage(policy: Policy, layout: str, quantization: Quantization | None, config: Any = None) -> None:
    """Raise for a policy, layout and quantization that cannot be stored together (``config``: the model's,
    when known: the runner checks what it can before loading any model)."""
    stages = policy.stages
    stages.key_pruning.check_layout(layout)
    grouped = config is not None and config.num_attention_heads != getattr(
        config, "num_key_value_heads", config.num_attention_heads
    )
    if stages.merge.active and policy.gqa == "expand" and grouped:
        raise NotImplementedError(
            f"{stages.merge.setting} with gqa='expand' on a model with grouped key/value heads is not built: merged "
            "values would differ per query head; use gqa='mean' (or 'max')"
        )
    if quantization is None or not quantization.enabled:
        return
    if layout != "auto" or stages.allocation.headwise:
        what = f"layout={layout!r}" if layout != "auto" else stages.allocation.setting
        raise NotImplementedError(
            f"quantization ({quantization.backend}) stores dense layers, read by the model's own attention, and "
            f"{what} is not dense: use layout='auto' and allocation='uniform' with quantization"
        )
    if policy.gqa == "expand" and grouped:
        raise NotImplementedError(
            "quantization stores key/value heads; gqa='expand' on a grouped-query model stores query heads, which "
            "decoded tokens would not match: use gqa='mean' (or 'max') with quantization"
        )


def stored_layer(
    policy: Policy,
    inputs: LayerInputs,
    queries: torch.Tensor,
    selection: torch.Tensor | HeadSelection | None,
    layer_cache: DynamicLayer,
    layout: str,
    reserve: int,
    guard: Callable[[], None],
    quantization: Quantization | None,
) -> tuple[DynamicLayer, int]:
    """The layer to put in the cache, and the bytes of key entries ThinK zero-filled in it (0 when quantized:
    the zeros are then quantized with the rest, and the layer's size is what it holds)."""
    values = policy.merged_values(inputs, selection)
    stored = store(layer_cache, inputs.keys, values, selection, layout, reserve, guard)
    pruned = 0
    if selection is not None and policy.stages.key_pruning.active:
        if not isinstance(stored, CompressedLayer):
            kind = type(stored).__name__
            raise NotImplementedError(f"think_ratio prunes dense layers only; layer {inputs.layer} is a {kind}")
        pruned = policy.prune_kept_keys(stored.keys, queries) * stored.keys.element_size()
    if quantization is None:
        return stored, pruned
    return quantization.layer(stored.keys, stored.values, inputs.layer), 0
