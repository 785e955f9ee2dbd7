"""One GPU per worker of a parallel sweep: ``hydra/launcher=joblib`` on a machine with several GPUs.

The joblib launcher runs ``hydra.launcher.n_jobs`` cells at once, each in a worker process (joblib's
loky backend, which the plugin always uses; a worker runs several cells one after another). Left
alone, every worker would put its model on the first visible GPU. Here each worker claims a slot of
its own instead, before anything touches CUDA, and keeps it for its whole life:

- the GPUs are ``CUDA_VISIBLE_DEVICES`` when it is set (indices, UUIDs or MIG names, kept as
  written), else ``torch.cuda.device_count()`` of them. That count does not initialise CUDA: before
  CUDA is initialised torch asks NVML, which reads ``CUDA_VISIBLE_DEVICES`` afresh on every call
  (``torch.cuda.is_available()``, by contrast, initialises the CUDA driver, which then keeps the
  device list it read; it is not called before the claim). Where NVML is unavailable torch falls
  back to the driver too. So `use_slot` checks the result: after narrowing ``CUDA_VISIBLE_DEVICES``
  it initialises CUDA and stops if more than one GPU is still visible, asking for
  ``CUDA_VISIBLE_DEVICES`` to be set when the sweep is launched (which avoids the question);
- slot ``i`` is the exclusive ``flock`` on ``<hydra.sweep.dir>/.gpu-slots/<i>.lock``, taken without
  waiting; a worker takes the first free slot and holds the lock until it exits. The kernel
  releases it when the process dies, however it dies, so a lock file left by a killed sweep never
  blocks a rerun;
- the worker's ``CUDA_VISIBLE_DEVICES`` becomes that one GPU, so ``device=auto`` (and
  ``model.device_map=auto``) sees exactly it;
- more workers than GPUs is refused before any cell runs (``hydra.launcher.n_jobs`` and the GPU
  count are named), and so is a claim when every slot is held: two workers never share a GPU
  silently.

Nothing happens for a single run, for the basic launcher (one process, cells in turn), for the slurm
launcher (the scheduler gives each job its GPU), for ``device=cpu`` and where no GPU is visible.
POSIX only (``fcntl``).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SLOTS_FOLDER = ".gpu-slots"
JOBLIB_LAUNCHER = "JoblibLauncher"
"""The class name ending the joblib launcher's ``_target_``
(``hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher``)."""


class GpuSlotError(RuntimeError):
    """No GPU can be given to this worker; the message says why and what to change."""


@dataclass(frozen=True)
class GpuSlot:
    """A claimed GPU: its slot number, its ``CUDA_VISIBLE_DEVICES`` entry and the lock file held."""

    index: int
    device: str
    path: Path


_HELD: dict[str, tuple[GpuSlot, int]] = {}
"""This process's claim (key ``"slot"``) and the open descriptor that keeps its lock."""


def visible_gpus(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries (see the module docstring)."""
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [entry.strip() for entry in listed.split(",") if entry.strip()]
    import torch  # only here: a machine that lists its GPUs needs no torch to claim one

    return [str(index) for index in range(torch.cuda.device_count())]  # NVML: CUDA stays uninitialised


def claim_slot(folder: Path, devices: list[str]) -> GpuSlot:
    """Take the first free slot of ``folder/.gpu-slots`` for this process and keep its lock.

    A process holds one slot: a second call returns the first claim. Raises `GpuSlotError` when
    ``devices`` is empty or every slot is held by another live process (it never waits).
    """
    if "slot" in _HELD:
        return _HELD["slot"][0]
    if not devices:
        raise GpuSlotError("no GPU to claim: CUDA_VISIBLE_DEVICES lists none and torch sees none")
    slots = Path(folder) / SLOTS_FOLDER
    slots.mkdir(parents=True, exist_ok=True)
    for index, device in enumerate(devices):
        path = slots / f"{index}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps({"pid": os.getpid(), "device": device}) + "\n").encode(), 0)
        slot = GpuSlot(index, device, path)
        _HELD["slot"] = (slot, fd)
        return slot
    raise GpuSlotError(
        f"every GPU slot in {slots} is held ({len(devices)} GPU(s): CUDA_VISIBLE_DEVICES="
        f"{','.join(devices)}): another worker has each one. Run at most {len(devices)} workers at "
        "once (hydra.launcher.n_jobs), or wait for the other sweep using this folder to end"
    )


def release_slot() -> None:
    """Give this process's slot back (its lock file stays, emptied); a no-op when none is held.

    A worker never needs this (its slot goes with it); it serves callers that claim in a long-lived
    process, such as tests.
    """
    held = _HELD.pop("slot", None)
    if held is not None:
        os.ftruncate(held[1], 0)
        os.close(held[1])


def use_slot(slot: GpuSlot) -> None:
    """Make ``slot``'s GPU the only one this process sees; refused once CUDA is initialised."""
    import torch

    if torch.cuda.is_initialized() and os.environ.get("CUDA_VISIBLE_DEVICES") != slot.device:
        raise GpuSlotError(
            f"CUDA is already initialised in process {os.getpid()}, so it cannot be limited to GPU "
            f"{slot.device}; the slot must be claimed before anything uses CUDA"
        )
    os.environ["CUDA_VISIBLE_DEVICES"] = slot.device
    if torch.cuda.device_count() == 0:  # a CPU build of torch, or the slot's GPU does not exist
        return
    torch.cuda.init()  # from here on torch counts what the driver sees, not what NVML reads
    if torch.cuda.device_count() != 1:
        raise GpuSlotError(
            f"this worker still sees {torch.cuda.device_count()} GPUs after setting CUDA_VISIBLE_DEVICES="
            f"{slot.device}: the CUDA driver read the device list before the claim (NVML is unavailable, "
            "or something initialised CUDA). Set CUDA_VISIBLE_DEVICES to the sweep's GPUs when launching it"
        )


def parallel_workers(n_jobs: Any, cpus: int | None = None) -> int:
    """How many cells joblib runs at once for ``n_jobs`` (-1: one per CPU, -2: all but one, ...)."""
    if n_jobs is None:
        return 1
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs == 0:
        raise GpuSlotError(f"hydra.launcher.n_jobs={n_jobs!r} is not allowed; use a positive integer, or -1")
    if n_jobs > 0:
        return n_jobs
    return max(1, (cpus or os.cpu_count() or 1) + 1 + n_jobs)


def under_joblib(hydra_cfg: Any) -> bool:
    """Whether this job is a cell of a multirun started by the joblib launcher (its ``_target_``)."""
    from hydra.types import RunMode

    launcher = hydra_cfg.get("launcher") or {}
    target = str(launcher.get("_target_", ""))
    return hydra_cfg.get("mode") == RunMode.MULTIRUN and target.rsplit(".", 1)[-1] == JOBLIB_LAUNCHER


def claim_for_job(hydra_cfg: Any, device: str) -> GpuSlot | None:
    """Give this joblib worker one GPU of its own (see the module docstring); None where nothing is done.

    ``hydra_cfg`` is the job's Hydra config (``HydraConfig.get()``), ``device`` the run's ``device``.
    """
    if device == "cpu" or not under_joblib(hydra_cfg):
        return None
    if "slot" in _HELD:  # a later cell of this worker: the GPU it already has
        slot = _HELD["slot"][0]
    else:
        devices = visible_gpus()
        if not devices:
            return None
        n_jobs = hydra_cfg.launcher.get("n_jobs")
        workers = parallel_workers(n_jobs)
        if workers > len(devices):
            raise GpuSlotError(
                f"hydra.launcher.n_jobs={n_jobs} runs {workers} cells at once, but {len(devices)} GPU(s) are "
                f"visible (CUDA_VISIBLE_DEVICES={','.join(devices)}) and each worker takes one of its own: pass "
                f"hydra.launcher.n_jobs={len(devices)} or fewer, or device=cpu"
            )
        slot = claim_slot(Path(str(hydra_cfg.sweep.dir)), devices)
    use_slot(slot)
    print(f"gpu slot {slot.index}: this worker (process {os.getpid()}) uses CUDA_VISIBLE_DEVICES={slot.device}")
    return slot
