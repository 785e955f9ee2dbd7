"""Peak memory of one prefill or decode configuration, over a baseline taken after model construction.

CUDA: the caching allocator's peak (`torch.cuda.max_memory_allocated`) after resetting it, in
process. CPU: the process's peak resident set (``VmHWM``), reset through ``/proc/self/clear_refs``
just before the measured work, minus the resident set (``VmRSS``) at that moment; each configuration
runs in its own fresh process (forked from a server that has imported torch but computed nothing),
so no allocator cache from another configuration hides or inflates its peak.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import torch

from restkv.devices import synchronize

CPU_METHOD = (
    "process peak RSS (VmHWM, reset via /proc/self/clear_refs) minus RSS after model construction, "
    "one fresh process per configuration"
)
CPU_FALLBACK = "process peak RSS (ru_maxrss, not resettable) minus RSS after model construction, one process each"
CUDA_METHOD = "torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus memory_allocated before the run"


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
            import resource

            self.method = CPU_FALLBACK
            self.baseline = _status_kib("VmRSS") * 1024 if Path("/proc/self/status").exists() else 0
            self._fallback_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def stop(self) -> dict[str, Any]:
        if self.device.type == "cuda":
            synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        elif self.method == CPU_METHOD:
            peak = _status_kib("VmHWM") * 1024
        else:
            import resource

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {"peak_bytes": peak, "baseline_bytes": self.baseline, "delta_bytes": max(peak - self.baseline, 0)}


def measure(model: Any, settings: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Run one configuration once under a `PeakMemory` probe (``job``: see `eval.latency.runner`).

    (On CUDA the runner instead probes the first timed round of each configuration in process.)
    """
    from eval.latency import runner  # runner imports this module

    probe = PeakMemory(model.device)
    inputs = runner.job_inputs(model, settings, job)
    probe.start()
    runner.run_job(model, settings, job, inputs)
    result = probe.stop()
    result["method"] = probe.method
    return result


def _child(settings_dict: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    from eval.latency.runner import build_model
    from eval.latency.settings import Settings

    settings = Settings(**settings_dict)
    model = build_model(settings)
    return measure(model, settings, job)


class Isolated:
    """Runs memory jobs one per fresh process (forkserver: torch imported once, fork per job)."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["eval.latency.runner"])
        self.context = context

    def __call__(self, settings_dict: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
        with self.context.Pool(1, maxtasksperchild=1) as pool:
            return pool.apply(_child, (settings_dict, job))
