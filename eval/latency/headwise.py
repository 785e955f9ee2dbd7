"""The head-wise layouts in the latency benchmark: synthetic varlen/masked caches, attention-only timing, ratios.

Decode cache kinds ``varlen`` and ``masked`` hold, per layer, the same total number of kept tokens
as the uniform compressed cache of the same budget (``preallocated``), shared unevenly by the
key/value heads (`headwise_lengths`: a fixed ramp from about a quarter to one and three quarters of
the budget), so that a step over each is timed at equal work:

- ``varlen`` stores exactly those tokens (`restkv.storage.layouts.VarlenLayer`) plus the decode reserve;
- ``masked`` keeps the whole context and masks all but the same tokens per head
  (`restkv.storage.layouts.MaskedLayer`, kvpress's approach).

Head ``h`` keeps the first ``n_h`` positions in both, so both compute the same attention. The full
cache has no head-wise variant (nothing is evicted): those jobs are not run.

With ``decode_fill: prefill`` the compressor stores ``decode_policy``'s real selection with
``layout='varlen'`` or ``'masked'``; a head-wise policy (``adakv``) gives uneven heads. Its
``preallocated`` entry then uses ``layout='auto'``, which stores a head-wise selection varlen too
(the entry's ``cache_layer_kinds`` says so): a dense uniform reference needs a uniform policy.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicLayer

from restkv.cache import CompressedLayer
from restkv.devices import synchronize
from restkv.storage.layouts import MaskedLayer, VarlenLayer
from restkv.storage.varlen import reference_attention

HEADWISE = ("varlen", "masked")
ATTENTION_NOTE = (
    "attention_ms (decode_attention_only): layer 0's attention alone for one random decode query, the median of "
    "decode_attention_calls calls in each round (rounds alternate the configurations), median over rounds: "
    "torch SDPA (enable_gqa) over a dense layer's keys/values, SDPA with MaskedLayer.attention_mask for a masked "
    "one, restkv.storage.varlen.reference_attention (one small attention per key/value head) for a varlen one"
)
SPREAD = 0.75
"""Head ``h`` of ``H`` keeps about ``tokens * (1 - SPREAD + 2 * SPREAD * h / (H - 1))``: 0.25x to 1.75x the budget."""


def headwise_lengths(heads: int, tokens: int, limit: int, spread: float = SPREAD) -> list[int]:
    """Uneven per-head counts summing to ``heads * tokens`` (each at most ``limit``): a linear ramp.

    ``spread`` in [0, 1) sets how uneven: 0 gives every head ``tokens`` (the uniform cache's counts,
    which the equivalence tests use), the default a ramp from a quarter to 1.75 times ``tokens``.
    """
    if not 0 <= spread < 1:
        raise ValueError(f"spread={spread}: must be in [0, 1)")
    if heads == 1:
        return [min(tokens, limit)]
    weights = [1 - spread + 2 * spread * h / (heads - 1) for h in range(heads)]
    lengths = [min(limit, max(1, int(tokens * w))) for w in weights]
    short = heads * tokens - sum(lengths)
    for h in sorted(range(heads), key=lambda h: -weights[h]) * (abs(short) + 1):  # hand out the rounding
        if short == 0:
            break
        step = 1 if short > 0 else -1
        if 1 <= lengths[h] + step <= limit:
            lengths[h] += step
            short -= step
    return lengths


def synthetic_headwise_layer(
    keys: torch.Tensor, values: torch.Tensor, tokens: int, kind: str, reserve: int, spread: float = SPREAD
) -> DynamicLayer:
    """A ``varlen`` or ``masked`` layer over ``keys``/``values`` ``[1, h_kv, L, d]`` keeping ``h_kv * tokens``.

    Head ``h`` keeps its first ``n_h`` positions (`headwise_lengths`) in both layouts.
    """
    heads, length = keys.shape[1], keys.shape[2]
    lengths = headwise_lengths(heads, tokens, length, spread)
    if kind == "varlen":
        flat_keys = torch.cat([keys[0, h, :n] for h, n in enumerate(lengths)])
        flat_values = torch.cat([values[0, h, :n] for h, n in enumerate(lengths)])
        return VarlenLayer(flat_keys, flat_values, lengths, reserve=reserve)
    if kind == "masked":
        visible = torch.zeros((1, heads, length), dtype=torch.bool, device=keys.device)
        for h, n in enumerate(lengths):
            visible[0, h, :n] = True
        return MaskedLayer(keys.clone(), values.clone(), visible, reserve=reserve)
    raise ValueError(f"head-wise cache kind {kind!r} is not one of {', '.join(HEADWISE)}")


def _attention(layer: DynamicLayer, query: torch.Tensor, scaling: float) -> Any:
    """The layer's attention for one decode query, as the integration computes it for this layout."""
    if isinstance(layer, VarlenLayer):
        return lambda: reference_attention(query, layer, scaling)
    if isinstance(layer, MaskedLayer):
        mask = layer.attention_mask(1, query.shape[1], torch.bool)
        return lambda: F.scaled_dot_product_attention(
            query, layer.keys, layer.values, attn_mask=mask, scale=scaling, enable_gqa=True
        )
    if isinstance(layer, (CompressedLayer, DynamicLayer)):
        return lambda: F.scaled_dot_product_attention(query, layer.keys, layer.values, scale=scaling, enable_gqa=True)
    raise TypeError(f"no attention-only timing for {type(layer).__name__}")


def attention_ms(layer: DynamicLayer, num_heads: int, calls: int, seed: int = 0) -> float:
    """Median milliseconds of layer-``layer``'s attention for one random decode query (``calls`` calls)."""
    dim = layer.keys.shape[-1]
    generator = torch.Generator(device=layer.keys.device).manual_seed(seed)
    query = torch.randn((1, num_heads, 1, dim), generator=generator, dtype=layer.keys.dtype, device=layer.keys.device)
    run = _attention(layer, query, dim**-0.5)
    run()
    times = []
    for _ in range(calls):
        synchronize(query.device)
        start = time.perf_counter()
        run()
        synchronize(query.device)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def layout_ratios(entries: list[dict[str, Any]], raw: dict[tuple, list[float]]) -> list[dict[str, Any]]:
    """Each head-wise layout against the uniform compressed cache (same context, budget, total kept tokens)."""
    rows = []
    by_key = {(e["context"], e["budget"], e["cache"]): e for e in entries}
    for e in entries:
        uniform = by_key.get((e["context"], e["budget"], "preallocated"))
        if e["cache"] not in HEADWISE or uniform is None:
            continue
        own, other = raw[(e["context"], e["budget"], e["cache"])], raw[(e["context"], e["budget"], "preallocated")]
        full = by_key.get((e["context"], None, "preallocated"))
        allocated = e["cache_bytes_allocated"]
        row = {
            "context": e["context"],
            "budget": e["budget"],
            "layout": e["cache"],
            "step_vs_uniform": round(e["ms_per_token_median"] / uniform["ms_per_token_median"], 4),
            "step_vs_uniform_paired": round(statistics.median(a / b for a, b in zip(own, other, strict=True)), 4),
            "allocated_vs_uniform": round(allocated / uniform["cache_bytes_allocated"], 4),
            "allocated_vs_logical": round(allocated / e["cache_bytes_start"], 4),
            # what else is allocated besides the kept tokens and the free decode slots (masked: the evicted ones)
            "allocated_vs_logical_plus_reserve": round(
                allocated / (e["cache_bytes_start"] + e["cache_bytes_reserve"]), 4
            ),
            "allocated_vs_full": None if full is None else round(allocated / full["cache_bytes_allocated"], 4),
        }
        if e.get("attention_ms") and uniform.get("attention_ms"):
            row["attention_vs_uniform"] = round(e["attention_ms"] / uniform["attention_ms"], 4)
        rows.append(row)
    return rows


def layout_line(r: dict[str, Any]) -> str:
    """One sentence for a `layout_ratios` row."""

    def x(key: str) -> str:
        return "-" if r.get(key) is None else f"{r[key]:.3f}x"

    return (
        f"  {r['context']:>6} tokens, budget {r['budget']}, {r['layout']} layout vs the uniform cache (same kept "
        f"tokens): step {x('step_vs_uniform')} (paired {x('step_vs_uniform_paired')}), attention alone "
        f"{x('attention_vs_uniform')}; allocated bytes {x('allocated_vs_uniform')} the uniform cache's, "
        f"{x('allocated_vs_logical')} its own logical size ({x('allocated_vs_logical_plus_reserve')} the kept "
        f"tokens plus the free decode slots), {x('allocated_vs_full')} the full cache's"
    )
