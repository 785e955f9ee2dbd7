"""Dtypes by name, device choice and device synchronisation: the one home every layer uses.

Timings of GPU work are only meaningful between two synchronisations (kernels run
asynchronously), so every timer in the project goes through `synchronize`; every config key that
names a dtype or a device goes through `torch_dtype` and `pick_device`, which name the key and
the allowed values when a value is wrong.
"""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str, key: str = "dtype") -> torch.dtype:
    """The dtype called ``name`` (``float32``, ``bfloat16``, ``float16``); ``key`` names the setting in errors."""
    if name not in DTYPES:
        raise ValueError(f"{key}={name!r} is not allowed; choose one of: {', '.join(DTYPES)}")
    return DTYPES[name]


def pick_device(name: str, key: str = "device") -> torch.device:
    """``auto`` (CUDA when available, else CPU) or an explicit device, refused if this machine lacks it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"{key}={name!r} is not a device; use auto, cpu, cuda or cuda:N") from error
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{key}={name!r} but CUDA is not available on this machine; use {key}=cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"{key}={name!r} but this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def synchronize(*devices: torch.device) -> None:
    """Wait for the queued work of every device given (a no-op on CPUs), so that a timer reads finished work.

    A model split over several GPUs (``model.device_map=auto``) runs its last layers on another
    device than its first: timing it means waiting for all of them (`model_devices`).
    """
    for device in dict.fromkeys(devices):
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def model_devices(model: torch.nn.Module) -> tuple[torch.device, ...]:
    """Every device holding one of ``model``'s parameters or buffers, in the order they first appear."""
    found = dict.fromkeys(tensor.device for tensor in (*model.parameters(), *model.buffers()))
    return tuple(found) or (torch.device("cpu"),)
