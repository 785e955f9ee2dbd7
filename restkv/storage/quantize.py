"""Quantized storage of what eviction keeps: eviction first, then the kept keys and values quantized.

A switch that composes with every policy (``quantization=kivi`` in the runner, ``compress(...,
quantization=Quantization(...))`` in code). Each layer's kept tokens go into one of transformers'
quantized cache layers, which keep the newest ``residual_length`` tokens in full precision and
requantize everything when that residual fills (KIVI's scheme; the quantization itself is the
backend's: per group of ``group_size`` along ``axis_key`` / ``axis_value``):

- ``hqq`` (the ReST-KV authors' backend; 1, 2, 3, 4 or 8 bits) and ``quanto`` (optimum-quanto; 2 or
  4 bits; its first use compiles a CPU extension, about 30 s): KIVI-style.
- ``kvquant``: the authors' KVQuant-style variant, HQQ with the outliers (entries beyond
  ``outlier_threshold`` in magnitude, 6.0 as theirs) kept aside in full precision and put back
  after dequantization (our own layer over transformers' HQQ one).

Decoding reads a quantized layer through the model's own attention (each step dequantizes it, as
transformers does), so eviction layers that only restkv's attention can read (head-wise layouts)
cannot be quantized, and neither can ``gqa='expand'`` caches of grouped-query models (their
stored heads are query heads): both are refused. The ReST-KV authors quantize with
``axis_key=1``, ``q_group_size=64`` and a residual as long as the generation
(``residual_length=max_new_tokens``); the defaults here are transformers' (axis 0, residual 128),
which hold for every sequence length (HQQ along axis 1 needs the token count to divide evenly
into its packing).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch
from transformers.cache_utils import HQQQuantizedLayer, QuantizedLayer, QuantoQuantizedLayer

from restkv.checks import check_choice, check_number
from restkv.choices import QUANT_BACKEND_MODULES, QUANT_BACKEND_PACKAGES

QUANT_BACKENDS = ("none", "hqq", "quanto", "kvquant")
BACKEND_BITS = {"hqq": (1, 2, 3, 4, 8), "quanto": (2, 4), "kvquant": (1, 2, 3, 4, 8)}
BACKEND_AXES = {"hqq": (0, 1), "quanto": (0,), "kvquant": (0, 1)}
"""Axes we allow: quanto's ``-1`` fails on token counts its group size does not divide, mid-run."""
HQQ_PACKING = {1: 8, 2: 4, 3: 10, 4: 2, 8: 1}
"""Rows of ``group_size`` entries HQQ packs together along axis 1 (its bit packing)."""
BACKEND_MODULES = QUANT_BACKEND_MODULES
BACKEND_PACKAGES = QUANT_BACKEND_PACKAGES


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a missing parent package (optimum)
        return False


@dataclass
class Quantization:
    """How kept keys and values are stored: ``backend`` (`QUANT_BACKENDS`; ``none`` stores them as computed),
    ``nbits`` (`BACKEND_BITS`), ``group_size`` (entries sharing a scale and zero point), ``axis_key`` /
    ``axis_value`` (`BACKEND_AXES`), ``residual_length`` (newest tokens kept in full precision) and, for
    ``kvquant``, ``outlier_threshold``."""

    backend: str = "none"
    nbits: int = 4
    group_size: int = 64
    axis_key: int = 0
    axis_value: int = 0
    residual_length: int = 128
    outlier_threshold: float = 6.0

    def __post_init__(self) -> None:
        owner = "quantization"
        check_choice(owner, "backend", self.backend, QUANT_BACKENDS)
        check_number(owner, "group_size", self.group_size, low=1, low_open=False, integer=True)
        check_number(owner, "residual_length", self.residual_length, low=1, low_open=False, integer=True)
        check_number(owner, "outlier_threshold", self.outlier_threshold, low=0)
        if not self.enabled:
            return
        bits = BACKEND_BITS[self.backend]
        if self.nbits not in bits:
            raise ValueError(
                f"quantization.nbits={self.nbits!r} is not supported by the {self.backend!r} backend; "
                f"it supports {', '.join(map(str, bits))} bits"
            )
        for name in ("axis_key", "axis_value"):
            if getattr(self, name) not in BACKEND_AXES[self.backend]:
                raise ValueError(
                    f"quantization.{name}={getattr(self, name)!r} is not supported by the {self.backend!r} backend; "
                    f"allowed: {', '.join(map(str, BACKEND_AXES[self.backend]))}"
                )
        if not _installed(BACKEND_MODULES[self.backend]):
            raise ImportError(
                f"quantization.backend={self.backend!r} needs the {BACKEND_PACKAGES[self.backend]!r} package, which is "
                f"not installed: pip install -e '.[quant]' (or pip install {BACKEND_PACKAGES[self.backend]})"
            )

    @property
    def enabled(self) -> bool:
        return self.backend != "none"

    def describe(self) -> dict[str, object]:
        """The settings, for result files (``{'backend': 'none'}`` when off)."""
        if not self.enabled:
            return {"backend": "none"}
        described = {name: getattr(self, name) for name in self.__dataclass_fields__}
        if self.backend != "kvquant":
            described.pop("outlier_threshold")
        return described

    def check_shape(self, heads: int, head_dim: int, layer: int) -> None:
        """Refuse, before anything is quantized, a group size that some token count would not fit: every
        requantization (each time the residual fills) must succeed, whatever the length then."""
        row = heads * head_dim
        if row % self.group_size:
            raise ValueError(
                f"quantization.group_size={self.group_size} does not divide layer {layer}'s heads x head_dim "
                f"({heads} x {head_dim} = {row}), so some token counts cannot be grouped; use a divisor of {row}"
            )
        packing = HQQ_PACKING.get(self.nbits, 1) if self.backend in ("hqq", "kvquant") else 1
        if 1 in (self.axis_key, self.axis_value) and (row // self.group_size) % packing:
            raise ValueError(
                f"quantization along axis 1 at {self.nbits} bits packs {packing} groups together, and layer {layer} "
                f"has {row // self.group_size} groups per token ({row} entries / group_size {self.group_size}): some "
                "token counts would not pack; use axis 0 or a smaller group size"
            )

    def layer(self, keys: torch.Tensor, values: torch.Tensor, layer: int) -> QuantizedLayer:
        """A quantized cache layer holding ``keys``/``values`` ``[b, heads, n, d]`` (quantized now)."""
        self.check_shape(keys.shape[1], keys.shape[3], layer)
        settings = {
            "nbits": self.nbits,
            "axis_key": self.axis_key,
            "axis_value": self.axis_value,
            "q_group_size": self.group_size,
            "residual_length": self.residual_length,
        }
        if self.backend == "kvquant":
            stored: QuantizedLayer = OutlierQuantizedLayer(threshold=self.outlier_threshold, **settings)
        else:
            stored = (HQQQuantizedLayer if self.backend == "hqq" else QuantoQuantizedLayer)(**settings)
        try:
            stored.update(keys, values)
        except (RuntimeError, ValueError, AssertionError) as error:
            raise ValueError(
                f"the {self.backend!r} backend cannot quantize layer {layer}'s kept keys and values of shape "
                f"{tuple(keys.shape)} at {self.nbits} bits in groups of {self.group_size} along axes "
                f"{self.axis_key}/{self.axis_value}: {error}"
            ) from error
        stored.stored_heads = keys.shape[1]
        stored.token_bytes = keys.shape[3] * keys.element_size() + values.shape[3] * values.element_size()
        return stored


class OutlierQuantizedLayer(HQQQuantizedLayer):
    """HQQ quantization with KVQuant's dense-and-sparse split: entries beyond ``threshold`` in magnitude stay
    in full precision (their flat positions, int64, and values), the rest is quantized with them set to 0."""

    def __init__(self, threshold: float = 6.0, **settings: int) -> None:
        super().__init__(**settings)
        self.threshold = threshold

    def _quantize(self, tensor: torch.Tensor, axis: int) -> tuple:
        outliers = tensor.abs() > self.threshold
        positions = outliers.flatten().nonzero().flatten()
        kept_aside = tensor.flatten()[positions]
        quantized = super()._quantize(tensor.masked_fill(outliers, 0), axis)
        return (*quantized, positions, kept_aside)

    def _dequantize(self, qtensor: tuple) -> torch.Tensor:
        *quantized, positions, kept_aside = qtensor
        tensor = super()._dequantize(tuple(quantized))
        flat = tensor.view(-1)
        flat[positions] = kept_aside.to(flat.dtype)
        return tensor


def _nbytes(stored: object) -> int:
    """Bytes of every tensor inside a backend's quantized state (nested tuples, dicts, tensor subclasses)."""
    if isinstance(stored, (tuple, list)):
        return sum(_nbytes(item) for item in stored)
    if isinstance(stored, dict):
        return sum(_nbytes(item) for item in stored.values())
    if isinstance(stored, torch.Tensor):
        if type(stored) is not torch.Tensor and hasattr(stored, "__tensor_flatten__"):  # quanto's packed tensors
            names, _ = stored.__tensor_flatten__()
            return sum(_nbytes(getattr(stored, name)) for name in names)
        return stored.numel() * stored.element_size()
    return 0


def quantized_shape(layer: QuantizedLayer) -> tuple[int, int]:
    """(stored heads, full-precision bytes of one token of one head) of a layer built by `Quantization.layer`."""
    if not hasattr(layer, "stored_heads"):
        name = type(layer).__name__
        raise TypeError(f"{name} was not built by restkv.storage.quantize.Quantization.layer: its size is unknown")
    return layer.stored_heads, layer.token_bytes


def quantized_bytes(layer: QuantizedLayer) -> tuple[int, int]:
    """What a quantized layer stores: (bytes of its quantized part, bytes of its full-precision residual)."""
    quantized = _nbytes(layer._quantized_keys) + _nbytes(layer._quantized_values)
    residual = 0
    if torch.is_tensor(layer.keys) and layer.keys.dim() == 4:
        residual = _nbytes(layer.keys) + _nbytes(layer.values)
    return quantized, residual


def enabled_quantization(quantization: Quantization | None) -> Quantization | None:
    """``quantization`` when it stores anything quantized, else None; anything but a `Quantization` is refused."""
    if quantization is not None and not isinstance(quantization, Quantization):
        raise TypeError(
            f"compress(quantization=...) takes a restkv.Quantization, e.g. Quantization(backend='hqq', nbits=4); "
            f"got {quantization!r}"
        )
    return quantization if quantization is not None and quantization.enabled else None
