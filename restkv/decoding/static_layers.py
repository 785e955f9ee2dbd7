"""Static-shape cache layers, so that a decode step can be recorded once and replayed (CUDA graphs).

Every tensor a decode step touches keeps its shape and address: keys and values live in buffers
``[b, heads, capacity, d]``; how many tokens each (row, head) holds is a device tensor ``lengths``;
a step writes its token at that index and advances it in place; attention reads the filled slots
only through those lengths. No step reads a value back to the host, so the step's kernels can be
recorded once (`torch.cuda.CUDAGraph`, `restkv.decoding.static_decoder`) and replayed with one launch, which takes
the host's per-kernel launch time out of the step.

Every layout converts (`static_layer`): a dense layer (compressed or the full cache) keeps one
length for all its heads; a varlen layer (head-wise budgets) keeps each head's tokens at the front
of its own row with its own length (rows padded to the longest head: the buffer of a captured step
is sized once, whatever the prompt's allocation); a masked layer keeps the full prompt and its
per-head visibility. Quantized layers do not convert (their kernels dequantize on the host's
schedule): such runs decode eagerly.

Attention over a static layer is one of `STATIC_KERNELS` (`static_attention`):

- ``flash``: PyTorch's ``varlen_attn`` (flash attention, CUDA, float16/bfloat16) with every (row,
  key/value head) as one sequence of ``capacity`` slots of which ``seqused_k`` are read, its query
  group as that sequence's heads: no mask, no repeated heads, only the filled slots' bytes read.
  Needs a ``varlen_attn`` that takes ``seqused_k`` (PyTorch 2.11 and later where built with it)
  and no visibility mask.
- ``masked``: the same attention over every slot with the lengths (and visibility) as a mask, in
  two GEMMs per key/value head group: capturable on any device, reads the whole buffer.
- ``exact``: the model's own attention (or the varlen reference) over the filled slots, counted on
  the host: what the eager path computes, bit for bit; eager only (never captured).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from restkv.cache import CompressedLayer
from restkv.storage.layouts import MaskedLayer, VarlenLayer, register_layout, require_reader

STATIC_KERNELS = ("auto", "exact", "masked", "flash")


class StaticLayer(DynamicLayer):
    """``keys``/``values`` ``[rows, h, capacity, d]``; ``lengths`` ``[rows, h]`` (device): each head's filled slots.

    Each row holds one prompt (a batch decodes several, `restkv.decoding.static_decoder`); ``visible`` (optional,
    boolean
    ``[rows, mask_heads, capacity]``) hides evicted positions of a masked layout; ``repeat`` repeats incoming
    key/value heads to the stored ones (``gqa='expand'``). ``kernel`` is the attention that reads it
    (`STATIC_KERNELS`; the decoder sets it). A row that goes on decoding past its capacity (a finished row of a
    batch waiting for the others) keeps overwriting its last slot.
    """

    def __init__(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        spare: int = 1,
        capacity: int | None = None,
        lengths: list[int] | None = None,
        visible: torch.Tensor | None = None,
        repeat: int = 1,
        rows: int | None = None,
    ) -> None:
        super().__init__()
        b, h, n, d = keys.shape
        rows = b if rows is None else rows
        capacity = n + spare if capacity is None else capacity
        host = [n] * h if lengths is None else list(lengths)
        if capacity < max(host) + 1:
            raise ValueError(f"a static layer needs room for at least one decoded token: {max(host)} of {capacity}")
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self.repeat, self.kernel = repeat, "auto"
        self.keys = keys.new_zeros((rows, h, capacity, d))
        self.values = values.new_zeros((rows, h, capacity, values.shape[-1]))
        self.lengths = torch.zeros((rows, h), dtype=torch.long, device=keys.device)
        self._host_lengths = [[0] * h for _ in range(rows)]
        self.visible = None
        if visible is not None:
            self.visible = torch.ones((rows, visible.shape[1], capacity), dtype=torch.bool, device=keys.device)
        self._slots = torch.arange(capacity, device=keys.device)
        for row in range(b):
            self.load(
                keys[row : row + 1],
                values[row : row + 1],
                host,
                None if visible is None else visible[row : row + 1],
                row,
            )
        register_layout(self.keys, self)

    def load(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        lengths: list[int],
        visible: torch.Tensor | None = None,
        row: int = 0,
    ) -> None:
        """Put a prompt's keys/values ``[1, h, n, d]`` (each head's ``lengths[h]`` first slots) into ``row``, in place
        (a recorded step keeps reading the same buffers)."""
        n = keys.shape[2]
        if n > self.capacity or len(lengths) != self.heads:
            raise ValueError(f"a row of {self.heads} heads x {self.capacity} slots cannot hold {len(lengths)} x {n}")
        self.keys[row, :, :n].copy_(keys[0])
        self.values[row, :, :n].copy_(values[0])
        self.keys[row, :, n:].zero_()  # no stale value of the row's last prompt is ever read, even times a zero weight
        self.values[row, :, n:].zero_()
        self.lengths[row].copy_(torch.tensor(lengths, device=self.device))
        if (visible is None) != (self.visible is None):
            raise ValueError("a static layer's visibility mask cannot be added or dropped by a load")
        if visible is not None and self.visible is not None:
            self.visible[row].fill_(True)
            self.visible[row, :, : visible.shape[-1]].copy_(visible[0])
        self._host_lengths[row] = list(lengths)

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    @property
    def heads(self) -> int:
        return self.keys.shape[1]

    @property
    def rows(self) -> int:
        return self.keys.shape[0]

    @property
    def length(self) -> torch.Tensor:
        """The longest row's filled slots, on the device (one value for a dense layer)."""
        return self.lengths.amax()

    @property
    def uniform(self) -> bool:
        """Whether every head holds the same number of tokens and none is hidden (a dense layer)."""
        return self.visible is None and all(len(set(row)) == 1 for row in self._host_lengths)

    @property
    def filled_tokens(self) -> int:
        """The longest head's filled slots, as counted on the host (`restkv.storage.layouts.layer_size`)."""
        return max(max(row) for row in self._host_lengths)

    @property
    def head_tokens(self) -> int:
        """Tokens held summed over heads and rows, as counted on the host."""
        return sum(sum(row) for row in self._host_lengths)

    def row_lengths(self, row: int) -> list[int]:
        """``row``'s filled slots per head, as counted on the host."""
        return self._host_lengths[row]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        require_reader()  # a model's own attention would read the free slots unmasked
        if key_states.shape[2] != 1:
            raise NotImplementedError(f"a static layer decodes one token a step; got {key_states.shape[2]}")
        if self.repeat > 1:
            key_states = key_states.repeat_interleave(self.repeat, dim=1)
            value_states = value_states.repeat_interleave(self.repeat, dim=1)
        at = self.lengths.clamp(max=self.capacity - 1)[:, :, None, None]
        self.keys.scatter_(2, at.expand(*at.shape[:2], 1, self.keys.shape[-1]), key_states)
        self.values.scatter_(2, at.expand(*at.shape[:2], 1, self.values.shape[-1]), value_states)
        self.lengths.add_(1).clamp_(max=self.capacity)
        self._host_lengths = [[min(n + 1, self.capacity) for n in row] for row in self._host_lengths]
        return self.keys, self.values

    def filled_mask(self) -> torch.Tensor:
        """Boolean ``[rows, mask_heads, 1, capacity]``: the slots each head attends to (the new token's included)."""
        filled = self._slots < self.lengths[:, :, None]  # [rows, h, capacity]
        if self.visible is not None:
            filled = filled[:, :1] & self.visible if filled.shape[1] != self.visible.shape[1] else filled & self.visible
        return filled[:, :, None, :]

    def attention_mask(self, query_length: int, query_heads: int, dtype: torch.dtype) -> torch.Tensor:
        """The mask of the model's own kernel (``exact`` over a masked layout): ``[rows, query_heads, 1, capacity]``,
        boolean for ``torch.bool``, else additive in ``dtype``."""
        mask = self.filled_mask()
        if mask.shape[1] not in (1, query_heads):
            mask = mask.repeat_interleave(query_heads // mask.shape[1], dim=1)
        if dtype == torch.bool:
            return mask
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)

    def get_seq_length(self, *args: object) -> int:
        """Tokens held, as counted on the host; a replayed step does not advance it (`sync_host_length`)."""
        return self.filled_tokens

    def get_max_length(self) -> int:
        return self.capacity

    def sync_host_length(self) -> None:
        """Set the host's counts from the device's (one read): after replays, which the host does not see."""
        self._host_lengths = self.lengths.tolist()


def static_contents(layer: DynamicLayer) -> dict[str, Any]:
    """What a static layer needs of ``layer`` (dense, compressed, varlen or masked): ``keys``/``values``
    ``[b, h, n, d]`` with each head's tokens first, ``lengths`` per head, ``visible`` and ``repeat``."""
    if not getattr(layer, "is_initialized", True) or getattr(layer, "keys", None) is None:
        raise ValueError("the layer holds no tokens yet: convert a cache after its prefill")
    if isinstance(layer, VarlenLayer):
        longest = max(layer.lengths)
        keys = layer.keys.new_zeros((1, layer.heads, longest, layer.keys.shape[-1]))
        values = layer.values.new_zeros((1, layer.heads, longest, layer.values.shape[-1]))
        for head, (k, v) in enumerate(layer.head_states()):
            keys[0, head, : k.shape[0]], values[0, head, : v.shape[0]] = k, v
        return {"keys": keys, "values": values, "lengths": list(layer.lengths), "visible": None, "repeat": layer.repeat}
    if isinstance(layer, MaskedLayer):
        n = layer.get_seq_length()
        lengths = [n] * layer.keys.shape[1]
        return {"keys": layer.keys, "values": layer.values, "lengths": lengths, "visible": layer.visible, "repeat": 1}
    if type(layer) not in (DynamicLayer, CompressedLayer):
        raise NotImplementedError(
            f"a {type(layer).__name__} has no static form (a quantized layer dequantizes on the host's schedule, a "
            "sliding-window one drops tokens as it decodes): decode such caches eagerly"
        )
    lengths = [layer.keys.shape[2]] * layer.keys.shape[1]
    repeat = getattr(layer, "repeat", 1)
    return {"keys": layer.keys, "values": layer.values, "lengths": lengths, "visible": None, "repeat": repeat}


def static_layer(layer: DynamicLayer, capacity: int) -> StaticLayer:
    """``layer`` (dense, compressed, varlen or masked) as a `StaticLayer` of ``capacity`` slots per head."""
    contents = static_contents(layer)
    return StaticLayer(capacity=capacity, **contents)


def to_static(cache: DynamicCache, spare: int) -> DynamicCache:
    """``cache`` with every layer moved into a `StaticLayer` with room for ``spare`` more tokens per head."""
    for index, layer in enumerate(cache.layers):
        longest = max(layer.lengths) if isinstance(layer, VarlenLayer) else (layer.get_seq_length() or 0)
        try:
            cache.layers[index] = static_layer(layer, longest + spare)
        except (NotImplementedError, ValueError) as error:
            raise type(error)(f"layer {index}: {error}") from None
    return cache


# -- attention -------------------------------------------------------------------------------------------


@functools.cache
def flash_varlen() -> Callable[..., torch.Tensor] | None:
    """PyTorch's ``varlen_attn`` when it reads a prefix of each sequence's slots (``seqused_k``), else None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn if "seqused_k" in inspect.signature(varlen_attn).parameters else None


@functools.cache
def _accepts(function: Callable[..., Any], name: str) -> bool:
    return name in inspect.signature(function).parameters


def pick_static_kernel(requested: str, query: torch.Tensor, layer: StaticLayer, capturing: bool) -> str:
    """The kernel that reads ``layer`` for ``requested`` (`STATIC_KERNELS`); a captured step never gets ``exact``."""
    flash = flash_varlen() is not None and query.is_cuda and query.dtype in (torch.float16, torch.bfloat16)
    flash = flash and layer.visible is None
    if requested == "flash" and not flash:
        raise RuntimeError(
            "static_kernel='flash' needs CUDA, a float16/bfloat16 model, a varlen_attn that takes seqused_k "
            f"(found: {flash_varlen() is not None}) and no visibility mask (a masked layout has one); use 'masked'"
        )
    if requested == "exact" and capturing:
        raise RuntimeError("static_kernel='exact' counts lengths on the host: it cannot be captured; use 'masked'")
    if requested != "auto":
        return requested
    if capturing or query.is_cuda:
        return "flash" if flash else "masked"
    return "exact"


def flash_static_attention(
    query: torch.Tensor, layer: StaticLayer, scaling: float, function: Callable[..., torch.Tensor] | None = None
) -> torch.Tensor:
    """``query`` ``[b, h, 1, d]`` over ``layer`` through ``varlen_attn`` (``function`` replaces it in tests);
    returns ``[b, 1, h, d]``. Each (row, stored head) is a sequence of ``capacity`` slots, ``lengths`` of them read."""
    function = function or flash_varlen()
    b, heads, _, d = query.shape
    stored, capacity = layer.heads, layer.capacity
    group = heads // stored
    q = query.reshape(b * stored, group, d)  # one query token per sequence, its group as the heads
    keys = layer.keys.reshape(b * stored * capacity, 1, d)
    values = layer.values.reshape(b * stored * capacity, 1, layer.values.shape[-1])
    sequences = torch.arange(b * stored + 1, dtype=torch.int32, device=query.device)
    extra = {"enable_gqa": True} if group > 1 and _accepts(function, "enable_gqa") else {}
    out = function(
        q,
        keys,
        values,
        sequences,
        sequences * capacity,
        1,
        capacity,
        scale=scaling,
        seqused_k=layer.lengths.reshape(-1).to(torch.int32),
        **extra,
    )
    return out.reshape(b, 1, heads, d)


def masked_static_attention(query: torch.Tensor, layer: StaticLayer, scaling: float) -> torch.Tensor:
    """The same attention over every slot, the unfilled (and hidden) ones masked; returns ``[b, 1, h, d]``."""
    b, heads, _, d = query.shape
    stored = layer.heads
    mask = layer.filled_mask()  # [b, 1 | stored | heads, 1, capacity]
    group = heads // stored
    q = query.reshape(b, stored, group, d) * scaling
    scores = (q @ layer.keys.transpose(-1, -2)).float()  # [b, stored, group, capacity]
    if mask.shape[1] == heads and group > 1:
        mask = mask.reshape(b, stored, group, -1)
    scores = scores.masked_fill(~mask, float("-inf"))
    out = scores.softmax(dim=-1).to(layer.values.dtype) @ layer.values  # [b, stored, group, d]
    return out.reshape(b, 1, heads, d)


def exact_static_attention(
    original: Callable[..., Any],
    module: nn.Module,
    query: torch.Tensor,
    layer: StaticLayer,
    args: tuple,
    kwargs: dict,
    implementation: str,
) -> torch.Tensor:
    """What the eager path computes over the same tokens: the model's kernel over the filled slots of a dense
    layer, the varlen reference per head, the model's kernel with the layer's mask for a masked layout."""
    from restkv.storage.varlen import reference_attention

    if layer.rows > 1:  # one row at a time over its own filled slots, as each prompt alone
        rows = [
            exact_static_attention(original, module, query[r : r + 1], _RowView(layer, r), args, kwargs, implementation)
            for r in range(layer.rows)
        ]
        return torch.cat(rows)
    scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
    if layer.visible is None and not layer.uniform:
        return reference_attention(query, _HeadViews(layer), scaling)
    kwargs = {k: v for k, v in kwargs.items() if k != "attention_mask"}
    rest = args[1:] if args else ()
    n = layer.filled_tokens
    given = args[0] if args and torch.is_tensor(args[0]) else None
    if layer.visible is not None:  # as the masked layout's own path builds its mask (restkv.attention)
        dtype = given.dtype if given is not None else (query.dtype if implementation == "eager" else torch.bool)
        mask = layer.attention_mask(1, query.shape[1], dtype)[..., :n]
        return original(module, query, layer.keys[:, :, :n], layer.values[:, :, :n], mask, *rest, **kwargs)[0]
    mask = None if given is None else given[..., -n:]
    keys, values = layer.keys[:, :, :n], layer.values[:, :, :n]
    groups = getattr(module, "num_key_value_groups", 1)
    if keys.shape[1] == query.shape[1] and groups > 1:  # per-query-head selections (gqa='expand')
        module.num_key_value_groups = 1
        try:
            return original(module, query, keys, values, mask, *rest, **kwargs)[0]
        finally:
            module.num_key_value_groups = groups
    return original(module, query, keys, values, mask, *rest, **kwargs)[0]


class _HeadViews:
    """A one-row static layer's heads as the varlen reference reads them
    (`restkv.storage.varlen.reference_attention`)."""

    def __init__(self, layer: StaticLayer) -> None:
        self.layer = layer
        self.heads = layer.heads

    def head_states(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        keys, values = self.layer.keys[0], self.layer.values[0]
        return [(keys[h, :n], values[h, :n]) for h, n in enumerate(self.layer.row_lengths(0))]


class _RowView:
    """One row of a static layer, seen as a one-row layer (the ``exact`` kernel over a batch)."""

    def __init__(self, layer: StaticLayer, row: int) -> None:
        self.keys, self.values = layer.keys[row : row + 1], layer.values[row : row + 1]
        self.visible = None if layer.visible is None else layer.visible[row : row + 1]
        self.lengths = layer.lengths[row : row + 1]
        self._lengths, self._slots = layer.row_lengths(row), layer._slots
        self.heads, self.rows, self.capacity = layer.heads, 1, layer.capacity

    def row_lengths(self, row: int) -> list[int]:
        return self._lengths

    @property
    def uniform(self) -> bool:
        return self.visible is None and len(set(self._lengths)) == 1

    @property
    def filled_tokens(self) -> int:
        return max(self._lengths)

    filled_mask = StaticLayer.filled_mask
    attention_mask = StaticLayer.attention_mask


def static_attention(
    original: Callable[..., Any],
    module: nn.Module,
    query: torch.Tensor,
    layer: StaticLayer,
    args: tuple,
    kwargs: dict,
    implementation: str,
) -> tuple[torch.Tensor, None]:
    """An attention function's result (``[b, 1, h, d]``, no weights) for one new token over ``layer``."""
    if query.shape[2] != 1:
        raise NotImplementedError(f"a static layer decodes one token a step; got {query.shape[2]} queries")
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        raise NotImplementedError("static attention does not implement soft-capping or attention sinks")
    capturing = query.is_cuda and torch.cuda.is_current_stream_capturing()
    kernel = pick_static_kernel(layer.kernel, query, layer, capturing)
    scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
    if kernel == "flash":
        return flash_static_attention(query, layer, scaling), None
    if kernel == "masked":
        return masked_static_attention(query, layer, scaling), None
    if layer.visible is not None and implementation.startswith("flash"):
        raise NotImplementedError(f"a masked layout needs a per-slot mask, which {implementation} does not take")
    return exact_static_attention(original, module, query, layer, args, kwargs, implementation), None
