"""The memory-bandwidth bound of a decode step, and the machine bandwidth it is computed from.

A decode step must read every weight once and every cached key and value once, so it cannot take
less than ``bytes_read / bandwidth``. The bandwidth is measured once per run on a large buffer:
``copy`` is STREAM's copy rate (bytes read + bytes written per second of ``dst.copy_(src)``),
``read`` a reduction's rate (bytes read per second of ``src.sum()``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from restkv.eval.latency.timing import timed_calls

GB = 1e9


def _median_seconds(run: Callable[[], object], device: torch.device, repeats: int) -> float:
    run()  # warm-up: page faults, kernel selection
    return statistics.median(timed_calls(run, device, repeats))


def measure_bandwidth(device: torch.device, mib: int, repeats: int) -> dict[str, float | int | str]:
    """Copy and read bandwidth (GB/s, 1 GB = 1e9 bytes) of a ``mib`` MiB float32 buffer on ``device``."""
    nbytes = mib * 2**20
    source = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    copy = _median_seconds(lambda: target.copy_(source), device, repeats)
    read = _median_seconds(lambda: source.sum(), device, repeats)
    return {
        "buffer_bytes": nbytes,
        "repeats": repeats,
        "copy_gbps": round(2 * nbytes / copy / GB, 3),
        "read_gbps": round(nbytes / read / GB, 3),
        "method": (
            "median of timed passes over a float32 buffer after one warm-up: copy = 2 x bytes / time of "
            "dst.copy_(src) (STREAM convention, read + write), read = bytes / time of src.sum()"
        ),
    }


def decode_bytes(parameter_bytes: int, cache_bytes_start: int, per_token: int, warmup: int, steps: int) -> float:
    """Mean bytes a timed decode step reads.

    The cache holds ``cache_bytes_start`` bytes before the first (untimed) step; step ``i`` (from 0)
    appends its token and attends over ``start + (i + 1) * per_token`` bytes. Timed steps are
    ``warmup .. warmup + steps - 1``, so on average the cache adds ``warmup + (steps + 1) / 2`` tokens.
    """
    return parameter_bytes + cache_bytes_start + per_token * (warmup + (steps + 1) / 2)


def bound_ms(bytes_read: float, bandwidth_gbps: float) -> float:
    """Lower bound on a step's time in ms: the bytes it must read at the measured bandwidth."""
    return bytes_read / (bandwidth_gbps * GB) * 1e3
