"""Attention of new queries over a variable-length cache layer (`restkv.storage.layouts.VarlenLayer`).

Each key/value head is its own sequence of kept tokens; the group of query heads sharing it
attends to that sequence only, and the new tokens (the last ``q`` of every head) see each other
causally. Two kernels compute the same thing:

- ``reference``: exact on every device, no padding: one small attention per key/value head over
  views into the layer's storage (a decode step adds no copy of the cache).
- ``torch``: PyTorch's own ``torch.nn.attention.varlen.varlen_attn`` (PyTorch 2.9 and later; flash
  attention built into PyTorch, CUDA, float16/bfloat16) with each key/value head as one sequence and
  its query group as that sequence's heads (AdaKV's arrangement). No extra package.
- ``flash``: the same arrangement through flash-attn's ``flash_attn_varlen_func`` (the flash-attn package).

Both fused kernels read the kept tokens back to back: when the decode reserve leaves free slots between
heads, the tokens are first gathered (one copy of the layer's cache per call, what a concatenating cache
does every step anyway). ``auto`` takes the first that can run: ``torch``, then ``flash``, then
``reference``, and checks a fused kernel's first output of each shape against the reference
(`restkv.fastpath`): one that fails or disagrees is replaced by the reference for that shape.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from collections.abc import Callable
from typing import Any

import torch

from restkv.fastpath import CHECKS, far_apart
from restkv.storage.layouts import VarlenLayer

VARLEN_KERNELS = ("auto", "reference", "torch", "flash")
"""``auto`` tries them in this order of preference: ``torch``, ``flash``, ``reference``."""


def flash_available() -> bool:
    """Whether the ``flash_attn`` package can be imported."""
    return importlib.util.find_spec("flash_attn") is not None


@functools.cache
def torch_varlen() -> Callable[..., torch.Tensor] | None:
    """PyTorch's ``varlen_attn``, or None where this PyTorch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


FUSED_DEVICES = ("cuda",)
"""Device types the fused kernels run on (CPU tests add ``cpu`` with a fake kernel)."""
FUSED_DTYPES = (torch.float16, torch.bfloat16)
CHECK_TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 2e-2}
"""Largest difference from the reference, as a share of its largest output, that ``auto``'s check accepts (float
outputs of other dtypes: `DEFAULT_TOLERANCE`); a kernel computing the wrong thing misses by far more."""
DEFAULT_TOLERANCE = 1e-4


def pick_kernel(requested: str, query: torch.Tensor) -> str:
    """The kernel that runs for ``requested`` (see `VARLEN_KERNELS`) on ``query``."""
    if requested == "reference":
        return requested
    fused = torch.device(query.device).type in FUSED_DEVICES and query.dtype in FUSED_DTYPES
    usable = {"torch": fused and torch_varlen() is not None, "flash": fused and flash_available()}
    if requested in usable and not usable[requested]:
        needs = "PyTorch's varlen_attn (PyTorch >= 2.9)" if requested == "torch" else "the flash_attn package"
        raise RuntimeError(
            f"varlen_kernel={requested!r} needs {needs} and a CUDA float16/bfloat16 query (varlen_attn: "
            f"{torch_varlen() is not None}, flash_attn installed: {flash_available()}, query on {query.device} in "
            f"{query.dtype}); use varlen_kernel='reference' or 'auto'"
        )
    if requested != "auto":
        return requested
    return next((kernel for kernel in ("torch", "flash") if usable[kernel]), "reference")


def reference_attention(query: torch.Tensor, layer: VarlenLayer, scaling: float) -> torch.Tensor:
    """``query`` ``[1, h, q, d]`` over ``layer``; returns ``[1, q, h, d]`` in the query's dtype.

    Scores and softmax in float32 (the query dtype's when it is float32: no casts on that path).
    """
    _, heads, length, _ = query.shape
    group = heads // layer.heads
    queries = query[0] * scaling  # [h, q, d]
    upcast = query.dtype != torch.float32
    outputs = []
    for head, (keys, values) in enumerate(layer.head_states()):
        scores = queries[head * group : (head + 1) * group] @ keys.transpose(0, 1)  # [g, q, n]
        scores = scores.float() if upcast else scores
        if length > 1:
            n = keys.shape[0]
            causal = torch.ones(length, n, dtype=torch.bool, device=query.device).tril(n - length)
            scores = scores.masked_fill(~causal, float("-inf"))
        weights = scores.softmax(dim=-1)
        outputs.append((weights.to(values.dtype) if upcast else weights) @ values)  # [g, q, d]
    return torch.cat(outputs).transpose(0, 1).unsqueeze(0).to(query.dtype)


def _packed(query: torch.Tensor, layer: VarlenLayer) -> tuple[torch.Tensor, ...]:
    """The fused kernels' inputs: queries ``[kv_heads * q, group, d]``, keys and values ``[tokens, 1, d]`` back to
    back, the cumulative query and key lengths (int32), one sequence per key/value head."""
    _, heads, length, dim = query.shape
    kv_heads = layer.heads
    group = heads // kv_heads
    q = query[0].reshape(kv_heads, group, length, dim).permute(0, 2, 1, 3).reshape(kv_heads * length, group, dim)
    keys, values = layer.compact()
    lengths = torch.tensor(layer.lengths, dtype=torch.int32, device=query.device)
    cu_keys = torch.zeros(kv_heads + 1, dtype=torch.int32, device=query.device)
    cu_keys[1:] = lengths.cumsum(0)
    cu_queries = torch.arange(0, (kv_heads + 1) * length, length, dtype=torch.int32, device=query.device)
    return q.contiguous(), keys.unsqueeze(1), values.unsqueeze(1), cu_queries, cu_keys


def _unpacked(out: torch.Tensor, query: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``[kv_heads * q, group, d]`` back to an attention function's ``[1, q, h, d]``."""
    _, heads, length, dim = query.shape
    return out.reshape(kv_heads, length, heads // kv_heads, dim).permute(1, 0, 2, 3).reshape(1, length, heads, dim)


@functools.cache
def _accepts(function: Callable[..., Any], name: str) -> bool:
    return name in inspect.signature(function).parameters


def torch_attention(query: torch.Tensor, layer: VarlenLayer, scaling: float, function=None) -> torch.Tensor:
    """The same attention through PyTorch's ``varlen_attn`` (``function`` replaces it in tests). Causality is asked
    the way the installed PyTorch takes it (``is_causal``, or ``window_size=(-1, 0)``); the new tokens are the
    last of each sequence, as in the reference."""
    function = function or torch_varlen()
    q, keys, values, cu_queries, cu_keys = _packed(query, layer)
    causal = {}
    if query.shape[2] > 1:
        causal = {"is_causal": True} if _accepts(function, "is_causal") else {"window_size": (-1, 0)}
    if q.shape[1] > 1 and _accepts(function, "enable_gqa"):
        causal["enable_gqa"] = True
    out = function(q, keys, values, cu_queries, cu_keys, query.shape[2], max(layer.lengths), scale=scaling, **causal)
    return _unpacked(out, query, layer.heads)


def flash_attention(query: torch.Tensor, layer: VarlenLayer, scaling: float, function=None) -> torch.Tensor:
    """The same attention through ``flash_attn_varlen_func`` (``function`` replaces it in tests)."""
    if function is None:
        from flash_attn import flash_attn_varlen_func as function
    q, keys, values, cu_queries, cu_keys = _packed(query, layer)
    length = query.shape[2]
    out = function(
        q, keys, values, cu_queries, cu_keys, length, max(layer.lengths), softmax_scale=scaling, causal=True
    )  # [kv_heads * q, g, d]
    return _unpacked(out, query, layer.heads)


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    layer: VarlenLayer,
    kernel: str = "auto",
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """An attention function's result (``[1, q, h, d]``, no weights) for ``query`` over ``layer``."""
    if query.shape[0] != 1:
        raise NotImplementedError(f"varlen attention runs on batch size 1; got {query.shape[0]}")
    if sliding_window is not None and max(layer.lengths) > sliding_window:
        raise NotImplementedError(
            f"{type(module).__name__} uses a sliding window of {sliding_window} tokens and a varlen cache head holds "
            f"{max(layer.lengths)}: sliding-window attention over a head-wise cache is not implemented"
        )
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        raise NotImplementedError("varlen attention does not implement soft-capping or attention sinks")
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    picked = pick_kernel(kernel, query)
    if picked == "reference":
        return reference_attention(query, layer, scaling), None
    fused = torch_attention if picked == "torch" else flash_attention
    capturing = query.is_cuda and torch.cuda.is_current_stream_capturing()
    if kernel != "auto" or capturing:  # asked for by name: its failures are the user's to see
        return fused(query, layer, scaling), None
    key = (
        "varlen",
        picked,
        str(query.device),
        query.dtype,
        query.shape[1],
        layer.heads,
        query.shape[-1],
        query.shape[2] == 1,
    )
    tolerance = CHECK_TOLERANCE.get(query.dtype, DEFAULT_TOLERANCE)
    out = CHECKS.run(
        key,
        ("varlen", picked, "reference"),
        lambda: fused(query, layer, scaling),
        lambda: reference_attention(query, layer, scaling),
        lambda a, b: far_apart(a, b, tolerance),
    )
    return out, None
