"""Which attention layers attend within a sliding window, and so are never evicted.

Gemma 2 and 3 alternate sliding-window layers with full ones (``config.layer_types``), Mistral and Phi-3
may apply ``config.sliding_window`` to every layer, Qwen2/Qwen3 set it per layer. A sliding layer's
cache already holds only its window (transformers' ``DynamicSlidingWindowLayer``), and its mask is built
over cache slots that eviction would reorder, so eviction leaves those layers whole and compresses the
full-attention ones, as kvpress does for Gemma 3. A window at least as long as the model's context never
binds: such layers are full-attention layers.
"""

from __future__ import annotations

from typing import Any


def module_windows(layers: list[Any], config: Any) -> dict[int, int]:
    """The sliding window of every attention layer that has one, by layer index (empty for Llama).

    Gemma and Qwen modules carry ``sliding_window`` (None on full layers, and on Qwen where
    ``use_sliding_window`` is off though the config names a window); Mistral and Phi-3 apply
    ``config.sliding_window`` to every layer.
    """
    shared = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
    windows = {}
    for module in layers:
        window = getattr(module, "sliding_window", shared)
        if window is not None:
            windows[module.layer_idx] = int(window)
    return windows


def windowed_layers(layers: list[Any], config: Any) -> frozenset[int]:
    """Layers whose window is shorter than the model's context: they are kept whole."""
    context = getattr(config, "max_position_embeddings", None)
    return frozenset(
        layer for layer, window in module_windows(layers, config).items() if context is None or window < context
    )
