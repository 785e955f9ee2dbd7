"""Peak memory of a piece of work over a baseline taken just before it, and fresh processes to run it in.

CUDA: the caching allocator's peak (`torch.cuda.max_memory_allocated`) after resetting it, in
process. CPU: the process's peak resident set (``VmHWM``), reset through ``/proc/self/clear_refs``
just before the measured work, minus the resident set (``VmRSS``) at that moment. `Isolated` runs
each configuration in its own fresh process (forked from a server that has imported torch but
computed nothing), so no allocator cache from another configuration hides or inflates its peak.

This module knows nothing of what is measured: callers hand it the work (a callable), so the
dependencies point one way (`restkv.eval.latency.jobs` and `restkv.eval.latency.scoring_mode` use it, not the reverse).
"""

from __future__ import annotations

import multiprocessing
import resource
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from restkv.devices import synchronize

CPU_METHOD = (
    "process peak RSS (VmHWM, reset via /proc/self/clear_refs) minus RSS just before the measured work (after the "
    "model or the layer's inputs are built), one fresh process per configuration"
)
CPU_FALLBACK = "process peak RSS (ru_maxrss, not resettable) minus RSS just before the measured work, one process each"
CUDA_METHOD = "torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus memory_allocated before the run"

T = TypeVar("T")


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


class PeakMemory:
    """``start()`` before the work, ``stop()`` after it: peak bytes over the baseline at ``start``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.baseline = 0
        self.method = CUDA_METHOD if device.type == "cuda" else CPU_METHOD

    def start(self) -> None:
        if self.device.type == "cuda":
            synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.baseline = _status_kib("VmRSS") * 1024
        except OSError:
            self.method = CPU_FALLBACK
            self.baseline = _status_kib("VmRSS") * 1024 if Path("/proc/self/status").exists() else 0

    def stop(self) -> dict[str, Any]:
        """``peak_bytes``, ``baseline_bytes``, ``delta_bytes`` (peak over baseline) and the ``method``."""
        if self.device.type == "cuda":
            synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        elif self.method == CPU_METHOD:
            peak = _status_kib("VmHWM") * 1024
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {
            "peak_bytes": peak,
            "baseline_bytes": self.baseline,
            "delta_bytes": max(peak - self.baseline, 0),
            "method": self.method,
        }


def measured(device: torch.device, work: Callable[[], T]) -> tuple[T, dict[str, Any]]:
    """Run ``work()`` once under a `PeakMemory` probe; its result and the probe's reading."""
    probe = PeakMemory(device)
    probe.start()
    result = work()
    return result, probe.stop()


class Isolated:
    """Runs ``function(*args)`` in a fresh process per call (forkserver: ``preload`` imported once, fork per call).

    ``function`` must be importable by name (a module-level function) and its arguments picklable.
    """

    def __init__(self, preload: Sequence[str] = ()) -> None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(preload))
        self.context = context

    def __call__(self, function: Callable[..., T], *args: Any) -> T:
        with self.context.Pool(1, maxtasksperchild=1) as pool:
            return pool.apply(function, args)
