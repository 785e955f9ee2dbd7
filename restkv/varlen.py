"""Attention of new queries over a variable-length cache layer (`restkv.layouts.VarlenLayer`).

Each key/value head is its own sequence of kept tokens; the group of query heads sharing it
attends to that sequence only, and the new tokens (the last ``q`` of every head) see each other
causally. Two kernels compute the same thing:

- ``reference``: exact on every device, no padding: one small attention per key/value head over
  views into the layer's storage (a decode step adds no copy of the cache).
- ``flash``: flash-attn's ``flash_attn_varlen_func`` with each key/value head as one sequence and
  its query group as that sequence's heads (AdaKV's arrangement); CUDA, float16/bfloat16. When the
  decode reserve leaves free slots between heads, the kept tokens are first gathered back to back
  (one copy of the layer's cache per call, what a concatenating cache does every step anyway).

``auto`` picks ``flash`` where flash-attn is installed and the query is a CUDA half-precision
tensor, ``reference`` otherwise.
"""

from __future__ import annotations

import importlib.util

import torch

from restkv.layouts import VarlenLayer

VARLEN_KERNELS = ("auto", "reference", "flash")


def flash_available() -> bool:
    """Whether the ``flash_attn`` package can be imported."""
    return importlib.util.find_spec("flash_attn") is not None


def pick_kernel(requested: str, query: torch.Tensor) -> str:
    """The kernel that runs for ``requested`` (see `VARLEN_KERNELS`) on ``query``."""
    if requested == "reference":
        return requested
    usable = flash_available() and query.is_cuda and query.dtype in (torch.float16, torch.bfloat16)
    if requested == "flash" and not usable:
        raise RuntimeError(
            f"varlen_kernel='flash' needs the flash_attn package and a CUDA float16/bfloat16 query "
            f"(flash_attn installed: {flash_available()}, query on {query.device} in {query.dtype}); "
            "use varlen_kernel='reference' or 'auto'"
        )
    return "flash" if usable else "reference"


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


def flash_attention(query: torch.Tensor, layer: VarlenLayer, scaling: float, function=None) -> torch.Tensor:
    """The same attention through ``flash_attn_varlen_func`` (``function`` replaces it in tests)."""
    if function is None:
        from flash_attn import flash_attn_varlen_func as function
    _, heads, length, dim = query.shape
    kv_heads = layer.heads
    group = heads // kv_heads
    q = query[0].reshape(kv_heads, group, length, dim).permute(0, 2, 1, 3).reshape(kv_heads * length, group, dim)
    keys, values = layer.compact()
    lengths = torch.tensor(layer.lengths, dtype=torch.int32, device=query.device)
    cu_keys = torch.zeros(kv_heads + 1, dtype=torch.int32, device=query.device)
    cu_keys[1:] = lengths.cumsum(0)
    cu_queries = torch.arange(0, (kv_heads + 1) * length, length, dtype=torch.int32, device=query.device)
    out = function(
        q.contiguous(),
        keys.unsqueeze(1),
        values.unsqueeze(1),
        cu_queries,
        cu_keys,
        length,
        max(layer.lengths),
        softmax_scale=scaling,
        causal=True,
    )  # [kv_heads * q, g, d]
    return out.reshape(kv_heads, length, group, dim).permute(1, 0, 2, 3).reshape(1, length, heads, dim)


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
    if pick_kernel(kernel, query) == "flash":
        return flash_attention(query, layer, scaling), None
    return reference_attention(query, layer, scaling), None
