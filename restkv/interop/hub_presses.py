"""Attaching kvpress's hub presses to a model: their per-model files checked, then loaded by kvpress's own code.

`attached` wraps every call in which kvpress loads a press's files (``post_init_from_model``, which
kvpress runs when a press's context is entered): first `restkv.interop.press_files.check_press_files`
(a clear refusal in well under a second when the files cannot be had), then, inside, the model
carries its hub id as ``config.name_or_path`` (the runner loads a cached model offline from its
snapshot folder, whose name kvpress would otherwise derive repository names from), and the HTTP
presses' URLs are read from the local copies in ``policy.files`` when it is set (kvpress has no
local-path option for them; it reads them with ``requests.get``, which is served from the folder
for exactly those URLs while kvpress loads, and refuses any other).

Scorer presses with files (`restkv.interop.press_catalogue.FILE_SCORERS`) run through our
integration: `scorer_press` attaches one press per model (through the compressor that runs the
layer) and gives it each layer's compression ratio. DuoAttentionPress's budget is a share of
streaming heads, not of tokens: `fit_budget` sets it per prompt so that the heads keep the budget on
average (to one head's share of the prompt).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch import nn

from restkv.interop.press_files import FILE_PRESSES, UrlFiles, check_press_files, hub_name, needed_files


class LocalResponse:
    """What kvpress reads of a ``requests`` response, from a local file."""

    def __init__(self, path: Path) -> None:
        self.content = path.read_bytes()
        self.status_code = 200

    @property
    def text(self) -> str:
        return self.content.decode("utf-8")

    def json(self) -> Any:
        import json

        return json.loads(self.content)

    def raise_for_status(self) -> None:
        return None


class LocalRequests:
    """A stand-in for the ``requests`` module that serves ``files``'s URLs from its folder and nothing else."""

    def __init__(self, files: UrlFiles) -> None:
        assert files.folder is not None
        self.served = {url: Path(files.folder) / name for url, name in zip(files.urls, files.names, strict=True)}

    def get(self, url: str, *args: Any, **kwargs: Any) -> LocalResponse:
        if url not in self.served:
            raise RuntimeError(
                f"restkv serves only {', '.join(self.served)} from policy.files; kvpress asked for {url}"
            )
        return LocalResponse(self.served[url])


HTTP_MODULES = {"DuoAttentionPress": "duo_attention_press", "LUKVPress": "lukv_press"}
"""The kvpress module whose ``requests`` reads each HTTP press's files."""


@contextlib.contextmanager
def served_locally(press: str, files: Any) -> Iterator[None]:
    """Inside, kvpress's module for ``press`` reads ``files``'s URLs from ``policy.files`` (when it is set)."""
    if not isinstance(files, UrlFiles) or files.folder is None:
        yield
        return
    import importlib

    module = importlib.import_module(f"kvpress.presses.{HTTP_MODULES[press]}")
    original = module.requests
    module.requests = LocalRequests(files)
    try:
        yield
    finally:
        module.requests = original


@contextlib.contextmanager
def hub_named(model: nn.Module, name: str) -> Iterator[None]:
    """Inside, ``model.config.name_or_path`` is ``name``."""
    config = model.config
    before = config.name_or_path
    config.name_or_path = name
    try:
        yield
    finally:
        config.name_or_path = before


def file_settings(policy: Any) -> dict[str, Any]:
    """What `restkv.interop.press_files.needed_files` reads of the policy."""
    return {**policy.settings(), "files": policy.files, "inner": policy.inner}


@contextlib.contextmanager
def attached(policy: Any, model: nn.Module) -> Iterator[None]:
    """Around kvpress's loading of ``policy``'s press for ``model``: the files checked, the hub id, local copies."""
    if policy.press not in FILE_PRESSES:
        yield
        return
    name = hub_name(model.config.name_or_path)
    settings = file_settings(policy)
    check_press_files(policy.press, name, model.config, settings)
    files = needed_files(policy.press, name, model.config, settings)
    with hub_named(model, name), served_locally(policy.press, files):
        yield


def compressor_model(module: nn.Module) -> nn.Module:
    """The whole model an attention layer under compression belongs to (its `restkv.integrate.KVCompressor`'s)."""
    from restkv.attention import ACTIVE

    compressor = ACTIVE.get(module)
    if compressor is None:
        raise RuntimeError(
            f"{type(module).__name__} is not under restkv.compress: a press with per-model files is attached to the "
            "whole model, which only the compressor knows"
        )
    return compressor.model


def scorer_press(policy: Any, module: nn.Module, ratio: float) -> Any:
    """``policy``'s press, attached (its files loaded by kvpress) once per model, at ``ratio``."""
    model = compressor_model(module)
    loaded = policy.__dict__.get("_attached")
    if loaded is None or loaded[0]() is not model:
        press = policy.build_press(ratio)
        with attached(policy, model):
            press.post_init_from_model(model)
        policy.__dict__["_attached"] = loaded = (weakref.ref(model), press)
    press = loaded[1]
    press.compression_ratio = ratio
    return press


def fit_budget(press: Any, model: nn.Module, keep: int, length: int) -> None:
    """DuoAttentionPress: the share of streaming heads under which the heads keep ``keep`` of ``length`` tokens on
    average (streaming heads keep its sink and recent tokens, the others everything). Call inside `attached`."""
    if type(press).__name__ != "DuoAttentionPress":
        return
    press.head_compression_ratio = 0.0
    press.post_init_from_model(model)  # kvpress loads the pattern (kept per model), which sizes the streaming heads
    span = length - press.sink_size - press.recent_size
    press.head_compression_ratio = min(1.0, max(0.0, (length - keep) / span)) if span > 0 else 0.0
