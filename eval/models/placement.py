"""Where a model's weights go: one device, or every visible GPU through Accelerate (``model.device_map``)."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
"""``model.device_map`` values that split a model over every visible GPU (Accelerate places the layers)."""


def check_device_map(device_map: str | None, device: torch.device) -> None:
    """Refuse, before any work, a ``model.device_map`` that cannot place the model here."""
    if device_map not in DEVICE_MAPS:
        return
    key = f"model.device_map={device_map}"
    if importlib.util.find_spec("accelerate") is None:
        raise ValueError(f"{key} needs the 'accelerate' package: pip install -e '.[gpu]' (or accelerate)")
    if device.type != "cuda":
        raise ValueError(
            f"{key} splits the model over GPUs and this run's device is {device.type!r}; "
            "leave model.device_map=null on a CPU"
        )


def dispatched(model: PreTrainedModel, device_map: str) -> PreTrainedModel:
    """``model`` (built in host memory) spread over the GPUs as Accelerate places it; CPU or disk refused."""
    from accelerate import dispatch_model, infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    keep_whole = model._no_split_modules
    memory = None
    if device_map != "sequential":  # auto and balanced spread the layers evenly, as from_pretrained does
        memory = get_balanced_memory(model, no_split_module_classes=keep_whole, low_zero=device_map == "balanced_low_0")
    placement = infer_auto_device_map(model, max_memory=memory, no_split_module_classes=keep_whole)
    off_gpu = sorted({str(where) for where in placement.values() if str(where) in ("cpu", "disk")})
    if off_gpu:
        raise ValueError(
            f"model.device_map={device_map} would put layers on {', '.join(off_gpu)}: the GPUs are too small"
        )
    return dispatch_model(model, device_map=placement)
