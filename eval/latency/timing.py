"""One timed prefill, one timed decode, timed calls: the measurements every configuration repeats.

Both run the model exactly as ``eval/evaluation/decoding.py`` does (explicit positions, logits for the
last token only, `torch.no_grad`), under `restkv.KVCompressor`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from restkv.baselines.full_cache import FullCache
from restkv.decoding.static_layers import to_static
from restkv.devices import model_devices, synchronize
from restkv.eval.latency.headwise import HEADWISE, attention_ms
from restkv.eval.latency.modeling import cache_bytes, synthetic_cache
from restkv.integrate import KVCompressor
from restkv.policy import Policy

FULL = "full"
STATIC = "static"
"""The decode cache kind whose step is captured as a CUDA graph on GPUs (`decode_static`)."""


@dataclass
class PrefillRun:
    seconds: float
    eviction_seconds: float
    cache: dict[str, int]
    scoring: dict[str, Any] | None = None
    """A scoring pass's forwards, tokens and seconds (`restkv.record.PrefillRecord.scoring_summary`), if one ran."""


def timed_calls(run: Callable[[], object], device: torch.device, calls: int) -> list[float]:
    """Seconds of each of ``calls`` calls of ``run()``, the device synchronised around each one."""
    times = []
    for _ in range(calls):
        synchronize(device)
        start = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def prompt_ids(model: PreTrainedModel, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (1, length), generator=generator).to(model.device)


def forward(model: PreTrainedModel, ids: torch.Tensor, cache: DynamicCache, start: int) -> torch.Tensor:
    positions = torch.arange(start, start + ids.shape[1], device=ids.device)[None]
    out = model(input_ids=ids, cache=cache, position_ids=positions, use_cache=True, logits_to_keep=1)
    return out.logits[0, -1]


def compressor_for(
    model: PreTrainedModel,
    policy: Policy,
    budget: int | None,
    reserve: int,
    decode_kernel: str = "model",
    layout: str = "auto",
) -> KVCompressor:
    """A compressor that times each layer's eviction alone, device work included (``timed``)."""
    budget = budget if budget is not None else 1 << 30
    return KVCompressor(
        model, policy, budget, decode_reserve=reserve, decode_kernel=decode_kernel, timed=True, layout=layout
    )


@torch.no_grad()
def prefill(model: PreTrainedModel, ids: torch.Tensor, compressor: KVCompressor) -> tuple[PrefillRun, DynamicCache]:
    """Time one prefill (eviction at its end included); ``compressor`` must be entered."""
    cache = DynamicCache(config=model.config)
    devices = model_devices(model)
    synchronize(*devices)
    start = time.perf_counter()
    forward(model, ids, cache, 0)
    synchronize(*devices)
    seconds = time.perf_counter() - start
    scoring = compressor.record.scoring_summary() or None
    return PrefillRun(seconds, compressor.record.eviction_seconds, cache_bytes(cache), scoring), cache


DECODE_WINDOW = 8
"""Decode steps timed together: the device is synchronised at a window's ends only, so the host's wait
for each token is not on every step (a sync per step would add the launch latency of the next step)."""


@torch.no_grad()
def decode(model: PreTrainedModel, cache: DynamicCache, position: int, warmup: int, steps: int) -> list[float]:
    """Seconds per step of ``steps`` greedy decode steps after ``warmup`` untimed ones.

    The token stays on the device; steps are timed in windows of `DECODE_WINDOW` (every device of
    the model synchronised at each window's ends), each step of a window given the window's mean.
    """
    token = torch.ones((1, 1), dtype=torch.long, device=model.device)
    step_index = 0

    def step() -> None:
        nonlocal token, step_index
        token = forward(model, token, cache, position + step_index).argmax().view(1, 1)
        step_index += 1

    for _ in range(warmup):
        step()
    return _timed_windows(step, model_devices(model), steps)


@torch.no_grad()
def decode_static(model: PreTrainedModel, cache: DynamicCache, position: int, warmup: int, steps: int) -> list[float]:
    """As `decode`, over a static-shape cache (`restkv.decoding.static_layers.to_static`); on CUDA a CUDA graph.

    One step (forward, argmax, next token and position written in place) is recorded after the
    warm-up steps and replayed: one launch per step instead of one per kernel. On a CPU the same
    step runs eagerly. The cache needs ``max(warmup, 1) + steps`` free slots.
    """
    ids = torch.ones((1, 1), dtype=torch.long, device=model.device)
    positions = torch.tensor([[position]], dtype=torch.long, device=model.device)

    def step() -> None:
        out = model(input_ids=ids, cache=cache, position_ids=positions, use_cache=True, logits_to_keep=1)
        ids.copy_(out.logits[0, -1].argmax().view(1, 1))
        positions.add_(1)

    run = step
    if model.device.type == "cuda":
        side = torch.cuda.Stream(model.device)
        side.wait_stream(torch.cuda.current_stream(model.device))
        with torch.cuda.stream(side):  # kernels and their workspaces are set up before capture
            for _ in range(max(warmup, 1)):
                step()
        torch.cuda.current_stream(model.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        run = graph.replay
    else:
        for _ in range(warmup):
            step()
    times = _timed_windows(run, model_devices(model), steps)
    for layer in cache.layers:
        layer.sync_host_length()  # capture ran the host side once, replays never: count from the device
    return times


def _timed_windows(step: Callable[[], object], devices: tuple[torch.device, ...], steps: int) -> list[float]:
    """Seconds per step of ``steps`` calls of ``step()``, timed in windows of `DECODE_WINDOW`."""
    times: list[float] = []
    done = 0
    while done < steps:
        window = min(DECODE_WINDOW, steps - done)
        synchronize(*devices)
        start = time.perf_counter()
        for _ in range(window):
            step()
        synchronize(*devices)
        times.extend([(time.perf_counter() - start) / window] * window)
        done += window
    return times


def profile_ops(run: Any, steps: int, top: int = 6) -> list[dict[str, Any]]:
    """Self time per step of the ``top`` costliest operators while ``run()`` decodes ``steps`` tokens."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        run()
    events = prof.key_averages()
    device_time = torch.cuda.is_available() and any(getattr(e, "self_device_time_total", 0) > 0 for e in events)
    key = "self_device_time_total" if device_time else "self_cpu_time_total"
    total = sum(getattr(e, key) for e in events) or 1.0
    ranked = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:top]
    return [
        {
            "op": e.key,
            "ms_per_step": round(getattr(e, key) / 1e3 / steps, 4),
            "share": round(getattr(e, key) / total, 4),
        }
        for e in ranked
    ]


@torch.no_grad()
def decode_case(
    model: PreTrainedModel,
    *,
    context: int,
    budget: int | None,
    kind: str,
    warmup: int,
    steps: int,
    fill: str,
    policy: Policy | None = None,
    ids: torch.Tensor | None = None,
    base: tuple[torch.Tensor, torch.Tensor] | None = None,
    profiled: bool = False,
    decode_kernel: str = "model",
    attention_calls: int = 0,
) -> tuple[Any, dict[str, int], float | None]:
    """Fill a cache for a ``context``-token prompt (synthetic, or a real prefill with ``policy``), then decode.

    ``budget`` None is the full cache. Returns the timed steps' seconds (``profiled``: the costliest
    operators of those steps instead), the cache's bytes before the first step, and with
    ``attention_calls`` the median milliseconds of layer 0's attention alone for one decode query
    (`restkv.eval.latency.headwise.attention_ms`), else None. Decoding always runs under a compressor (one
    that evicts nothing for synthetic caches), so ``decode_kernel`` applies to the full and the
    compressed cache alike, and head-wise layers are read by its attention function. ``static``
    moves the filled cache into static-shape layers and replays a captured step on CUDA
    (`decode_static`).
    """
    reserve = warmup + steps if kind in ("preallocated", *HEADWISE) else 0
    heads = model.config.num_attention_heads
    decoder = decode_static if kind == STATIC else decode

    def attention(cache: DynamicCache) -> float | None:
        return attention_ms(cache.layers[0], heads, attention_calls) if attention_calls else None

    def run(cache: DynamicCache) -> Any:
        if not profiled:
            return decoder(model, cache, context, warmup, steps)
        if kind == STATIC:  # the capture is part of the profile; its share is small next to ``steps`` replays
            return profile_ops(lambda: decode_static(model, cache, context, warmup, steps), steps)
        decode(model, cache, context, warmup, 0)
        return profile_ops(lambda: decode(model, cache, context + warmup, 0, steps), steps)

    def filled(cache: DynamicCache) -> DynamicCache:
        return to_static(cache, max(warmup, 1) + steps) if kind == STATIC else cache

    if fill == "synthetic":
        assert base is not None
        tokens = context if budget is None else budget
        cache = filled(synthetic_cache(model.config, base, tokens, "dynamic" if kind == STATIC else kind, reserve))
        before = cache_bytes(cache)
        with compressor_for(model, FullCache(), None, 0, decode_kernel):
            return run(cache), before, attention(cache)
    assert policy is not None and ids is not None
    layout = kind if kind in HEADWISE else "auto"
    with compressor_for(model, policy, budget, reserve, decode_kernel, layout) as compressor:
        _, cache = prefill(model, ids, compressor)
        cache = filled(cache)
        before = cache_bytes(cache)
        return run(cache), before, attention(cache)


def scoring_fields(timed: list[dict[str, Any]]) -> dict[str, Any]:
    """A scoring pass's extra forwards (KVzip's reconstruction): how many, their tokens and seconds; inside
    ``eviction_seconds``. Empty for policies without one."""
    passes = [t["scoring"] for t in timed if t.get("scoring")]
    if not passes:
        return {}
    seconds = [p["scoring_pass_seconds"] for p in passes]
    return {
        "scoring_pass_forwards": passes[0]["scoring_pass_forwards"],
        "scoring_pass_tokens": passes[0]["scoring_pass_tokens"],
        "scoring_pass_seconds_median": round(statistics.median(seconds), 6),
        "scoring_pass_seconds": seconds,
    }
