"""How much of a long prompt a scoring step processes at once: by the device and its free memory.

Scoring loops over the prompt in chunks so that no temporary grows with its length squared (or
with length x head_dim x group). On a CPU the chunk sizes stay the fixed ones that keep memory
small (`CPU_WORK_BYTES`). On a GPU every Python iteration is a handful of kernel launches, and
hundreds of them per layer at 128k tokens would cost more than the arithmetic: there a chunk takes
up to `GPU_MEMORY_SHARE` of the memory free at that moment, so one chunk covers any prompt a GPU
can hold (O(1) launches per layer, whatever the length).

`assume_free_memory` makes any device size its work as a GPU with that much free memory would:
tests count the operators an eviction launches on a CPU with the sizes a GPU would use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch

CPU_WORK_BYTES = 64 << 20
"""Bytes of one temporary on a CPU (16M float32 entries; the bound scoring has always used)."""
GPU_MEMORY_SHARE = 0.25
"""Share of a GPU's free memory one scoring temporary may take (the rest: the model's own
activations, the allocator's slack, and the other temporaries alive at the same time)."""

_ASSUMED_FREE: ContextVar[int | None] = ContextVar("assumed_free_memory", default=None)


@contextlib.contextmanager
def assume_free_memory(free_bytes: int) -> Iterator[None]:
    """Size work on every device as a GPU with ``free_bytes`` free would (inside the ``with`` block)."""
    if isinstance(free_bytes, bool) or not isinstance(free_bytes, int) or free_bytes <= 0:
        raise ValueError(f"free_bytes={free_bytes!r} must be a positive integer")
    token = _ASSUMED_FREE.set(free_bytes)
    try:
        yield
    finally:
        _ASSUMED_FREE.reset(token)


def gpu_free_bytes(device: torch.device) -> int | None:
    """Free bytes of ``device`` if work there is sized as on a GPU (assumed, or a CUDA device's), else None."""
    assumed = _ASSUMED_FREE.get()
    if assumed is not None:
        return assumed
    if device.type == "cuda":  # what the driver has free, plus what PyTorch's allocator holds unused
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    return None


def rows_at_once(total: int, row_bytes: int, device: torch.device, cpu_rows: int) -> int:
    """How many of ``total`` rows (``row_bytes`` of temporaries each) to process in one step.

    ``cpu_rows`` on a CPU; on a GPU as many as `GPU_MEMORY_SHARE` of its free memory holds, never
    fewer than ``cpu_rows`` and never more than ``total`` (at least 1).
    """
    if total < 1:
        return 1
    free = gpu_free_bytes(device)
    if free is None:
        return max(1, min(cpu_rows, total))
    fitting = int(free * GPU_MEMORY_SHARE) // max(1, row_bytes)
    return max(1, min(total, max(cpu_rows, fitting)))


def elements_at_once(device: torch.device, element_bytes: int = 4) -> int:
    """Entries of one temporary: `CPU_WORK_BYTES` worth on a CPU, `GPU_MEMORY_SHARE` of free memory on a GPU."""
    free = gpu_free_bytes(device)
    budget = CPU_WORK_BYTES if free is None else max(CPU_WORK_BYTES, int(free * GPU_MEMORY_SHARE))
    return max(1, budget // element_bytes)
