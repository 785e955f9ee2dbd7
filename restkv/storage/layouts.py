"""How a layer's kept tokens are stored when heads keep different numbers of them, and what it costs.

Two layouts besides the dense one (`restkv.cache.CompressedLayer`, every head the same length):

- `VarlenLayer` (``layout='varlen'``): every key/value head's kept tokens one after another in a
  flat ``[tokens, head_dim]`` tensor, with per-head lengths, as AdaKV's flattened cache; the memory
  is the sum of what the heads keep (plus the decode reserve). Attention over it is
  `restkv.storage.varlen.varlen_attention`.
- `MaskedLayer` (``layout='masked'``, kvpress's approach): the full-length cache stays in memory
  and evicted positions are masked per head; same decisions and outputs, the memory of the full
  cache. A comparison point.

Neither can be read by a model's own attention function (it would attend to every head's tokens,
or to the evicted ones), so both refuse to be updated outside the ``compress(...)`` block whose
attention function knows them (``guard``), instead of answering silently wrong. The integration
finds the layout behind the key tensor an attention call receives with `layout_of`.

`layer_size` reports, for every layer kind, the logical size (tokens kept, summed over heads) and
the bytes physically allocated.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary
from transformers.cache_utils import DynamicLayer, QuantizedLayer

from restkv.cache import CompressedLayer
from restkv.choices import LAYOUTS as LAYOUTS  # re-exported: the layouts this module builds
from restkv.select import gather_positions
from restkv.stages.allocation import HeadSelection
from restkv.storage.quantize import quantized_bytes, quantized_shape

"""``auto``: dense when every head keeps the same number of tokens, ``varlen`` otherwise."""

_LAYOUT_OF = WeakIdKeyDictionary()  # key tensor handed to attention -> weakref to its layer
_READERS = {"installed": 0}  # attention functions that read these layouts, installed (`restkv.attention`)


def reader_installed(delta: int = 0) -> bool:
    """Whether an attention function that reads head-wise layouts is installed (``delta`` counts one in or out)."""
    _READERS["installed"] += delta
    return _READERS["installed"] > 0


def require_reader() -> None:
    """A layer built without its compressor's guard still refuses a model's own attention function."""
    if not reader_installed():
        raise RuntimeError(
            "this cache holds head-wise compressed layers (varlen, masked) or static-shape ones, which only "
            "restkv's attention function can read (a model's own would attend to other heads' or to evicted "
            "tokens); decode inside a compress(...) block"
        )


def register_layout(keys: torch.Tensor, layer: DynamicLayer) -> None:
    """Let attention find ``layer`` (a layout with its own attention path) from the ``keys`` it returns."""
    _LAYOUT_OF[keys] = weakref.ref(layer)


def layout_of(keys: torch.Tensor) -> DynamicLayer | None:
    """The varlen, masked or static layer whose ``update`` returned ``keys``, else None."""
    ref = _LAYOUT_OF.get(keys)
    return None if ref is None else ref()


def _unsupported(name: str) -> Callable[..., None]:
    def refuse(self: DynamicLayer, *args: object, **kwargs: object) -> None:
        raise NotImplementedError(
            f"{type(self).__name__}.{name}: a head-wise compressed cache layer supports decoding (appending) only; "
            "beam search, assisted decoding and cache cropping are not supported"
        )

    return refuse


class VarlenLayer(DynamicLayer):
    """Each key/value head's kept tokens, flattened head after head, with room for ``reserve`` more each.

    ``keys``/``values`` ``[sum(lengths), d]`` (heads one after another, as `restkv.stages.allocation.
    HeadSelection` orders positions); ``repeat`` repeats incoming key/value heads to the stored heads
    (``gqa='expand'``). Head ``h`` occupies ``[offsets[h], offsets[h] + lengths[h])`` of the storage,
    which holds ``capacities[h] = lengths[h] + reserve`` slots for it.
    """

    def __init__(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        lengths: list[int],
        reserve: int = 0,
        repeat: int = 1,
        guard: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self.repeat = repeat
        self._guard = guard or require_reader
        self.growth = reserve
        self._store(keys, values, list(lengths), [n + reserve for n in lengths])

    def _store(self, keys: torch.Tensor, values: torch.Tensor, lengths: list[int], capacities: list[int]) -> None:
        """Lay ``keys``/``values`` (heads back to back, ``lengths`` each) into storage of ``capacities``."""
        self.lengths, self.capacities = lengths, capacities
        self.offsets = [sum(capacities[:h]) for h in range(len(capacities))]
        if capacities == lengths:
            self.keys, self.values = keys, values
        else:
            total = sum(capacities)
            self.keys = keys.new_empty((total, keys.shape[-1]))
            self.values = values.new_empty((total, values.shape[-1]))
            slots = self.occupied(lengths)
            self.keys[slots], self.values[slots] = keys, values
        self._register()

    def _register(self) -> None:
        _LAYOUT_OF[self.keys] = weakref.ref(self)

    @property
    def heads(self) -> int:
        return len(self.lengths)

    @property
    def has_gaps(self) -> bool:
        """Whether free reserve slots lie between heads (the storage is not the heads back to back)."""
        return self.lengths != self.capacities

    def occupied(self, lengths: list[int] | None = None) -> torch.Tensor:
        """Storage rows holding tokens, head after head: int64 ``[sum(lengths)]``."""
        lengths = self.lengths if lengths is None else lengths
        ranges = [torch.arange(o, o + n, device=self.device) for o, n in zip(self.offsets, lengths, strict=True)]
        return torch.cat(ranges)

    def head_states(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each head's (keys ``[n_h, d]``, values ``[n_h, d]``), views into the storage."""
        return [(self.keys[o : o + n], self.values[o : o + n]) for o, n in zip(self.offsets, self.lengths, strict=True)]

    def compact(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values with the heads back to back (the storage itself when it has no gaps)."""
        if not self.has_gaps:
            return self.keys, self.values
        rows = self.occupied()
        return self.keys[rows], self.values[rows]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._guard()
        if key_states.shape[0] != 1:
            raise NotImplementedError(f"a varlen cache layer holds batch size 1; got {key_states.shape[0]}")
        if self.repeat > 1:
            key_states = key_states.repeat_interleave(self.repeat, dim=1)
            value_states = value_states.repeat_interleave(self.repeat, dim=1)
        new_keys, new_values = key_states[0], value_states[0]  # [heads, q, d]
        if new_keys.shape[0] != self.heads:
            raise ValueError(f"varlen layer holds {self.heads} heads; got states for {new_keys.shape[0]}")
        new = new_keys.shape[1]
        if all(n + new <= c for n, c in zip(self.lengths, self.capacities, strict=True)):
            start = torch.tensor([o + n for o, n in zip(self.offsets, self.lengths, strict=True)], device=self.device)
            rows = (start[:, None] + torch.arange(new, device=self.device)).reshape(-1)
            self.keys.index_copy_(0, rows, new_keys.reshape(-1, new_keys.shape[-1]))
            self.values.index_copy_(0, rows, new_values.reshape(-1, new_values.shape[-1]))
            self.lengths = [n + new for n in self.lengths]
            self._register()
        else:  # past the reserve: rebuild with the new tokens and another reserve of room (none without one)
            heads = self.head_states()
            keys = torch.cat([torch.cat([k, new_keys[h]]) for h, (k, _) in enumerate(heads)])
            values = torch.cat([torch.cat([v, new_values[h]]) for h, (_, v) in enumerate(heads)])
            lengths = [n + new for n in self.lengths]
            self._store(keys, values, lengths, [n + self.growth for n in lengths])
        return self.keys, self.values

    def get_seq_length(self, *args: object) -> int:
        """The longest head's length (what a mask sized for this layer must cover)."""
        return max(self.lengths)

    crop = _unsupported("crop")
    reorder_cache = _unsupported("reorder_cache")
    batch_repeat_interleave = _unsupported("batch_repeat_interleave")
    batch_select_indices = _unsupported("batch_select_indices")


class MaskedLayer(CompressedLayer):
    """The full prompt's keys/values with a per-head visibility mask (evicted positions masked).

    ``visible`` is boolean ``[1, mask_heads, L]``: ``mask_heads`` is the number of key/value heads,
    or of query heads under ``gqa='expand'`` (keys are never repeated: the mask is per query head).
    Tokens appended later are visible to every head.
    """

    def __init__(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        visible: torch.Tensor,
        reserve: int = 0,
        guard: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(keys, values, reserve=reserve)
        self._guard = guard or require_reader
        self._visible = torch.ones((*visible.shape[:2], self.capacity), dtype=torch.bool, device=visible.device)
        self._visible[..., : visible.shape[-1]] = visible
        _LAYOUT_OF[self.keys] = weakref.ref(self)

    @property
    def visible(self) -> torch.Tensor:
        """``[1, mask_heads, length]``: which stored positions each head attends to."""
        return self._visible[..., : self.get_seq_length()]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._guard()
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        missing = self.capacity - self._visible.shape[-1]
        if missing > 0:
            more = self._visible.new_ones((*self._visible.shape[:2], missing))
            self._visible = torch.cat([self._visible, more], dim=-1)
        _LAYOUT_OF[keys] = weakref.ref(self)
        return keys, values

    def attention_mask(self, query_length: int, query_heads: int, dtype: torch.dtype) -> torch.Tensor:
        """The mask for ``query_length`` new queries ``[1, query_heads, q, length]``: causal among the
        new tokens, evicted positions hidden. Boolean (True attends) for ``dtype=torch.bool``,
        else additive in ``dtype``."""
        length = self.get_seq_length()
        visible = self.visible[:, :, None, :]
        causal = torch.ones(query_length, length, dtype=torch.bool, device=visible.device).tril(length - query_length)
        mask = visible & causal
        if mask.shape[1] != query_heads:
            mask = mask.repeat_interleave(query_heads // mask.shape[1], dim=1)
        if dtype == torch.bool:
            return mask
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


@dataclass(frozen=True)
class LayerSize:
    """One layer's cache: what it keeps, what it costs, and what a decode step reads and adds.

    ``head_tokens``: tokens kept summed over ``heads`` (the stored heads; a masked layer's mask heads);
    ``logical_bytes``: their keys and values; ``allocated_bytes``: everything allocated (decode reserve
    and mask included), of which ``reserve_bytes`` are free decode slots; ``read_bytes``: the keys and
    values a decode step's attention reads (a masked layer's whole context); ``token_bytes``: what one
    decoded token adds; ``pruned_bytes``: key entries zero-filled by channel pruning (ThinK), allocated
    but left out of the logical size.
    """

    head_tokens: int
    logical_bytes: int
    allocated_bytes: int
    heads: int = 1
    read_bytes: int = 0
    reserve_bytes: int = 0
    token_bytes: int = 0
    pruned_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        sizes = {
            "head_tokens": self.head_tokens,
            "logical_bytes": self.logical_bytes,
            "allocated_bytes": self.allocated_bytes,
        }
        return {**sizes, "pruned_bytes": self.pruned_bytes} if self.pruned_bytes else sizes


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def layer_size(layer: DynamicLayer) -> LayerSize:
    """The `LayerSize` of any layer kind: dynamic, compressed (dense), varlen, masked or quantized."""
    if isinstance(layer, QuantizedLayer):  # what it holds: its quantized part and its full-precision residual
        heads, row = quantized_shape(layer)
        stored = sum(quantized_bytes(layer))
        return LayerSize(heads * layer.get_seq_length(), stored, stored, heads, stored, 0, heads * row)
    if isinstance(layer, VarlenLayer):
        tokens = sum(layer.lengths)
        row = _nbytes(layer.keys[:1], layer.values[:1])  # one token of one head
        free = sum(c - n for c, n in zip(layer.capacities, layer.lengths, strict=True))
        allocated = _nbytes(layer.keys, layer.values)
        return LayerSize(tokens, tokens * row, allocated, layer.heads, tokens * row, free * row, layer.heads * row)
    keys, values = layer.keys, layer.values
    if keys is None or not torch.is_tensor(keys) or keys.dim() != 4:
        return LayerSize(0, 0, 0)
    heads, length = keys.shape[1], keys.shape[2]
    row = keys.shape[3] * keys.element_size() + values.shape[3] * values.element_size()
    if hasattr(layer, "head_tokens"):  # a static layer (restkv.decoding.static_layers): full buffers, partly filled
        tokens = layer.head_tokens
        free = heads * length * keys.shape[0] - tokens
        allocated = _nbytes(keys, values)
        return LayerSize(tokens, tokens * row, allocated, heads, heads * length * row, free * row, heads * row)
    stored = heads * length * row
    free = layer.capacity - length if isinstance(layer, CompressedLayer) else 0
    buffers = (layer._key_buffer, layer._value_buffer) if isinstance(layer, CompressedLayer) else (None, None)
    allocated = _nbytes(*buffers) if buffers[0] is not None else _nbytes(keys, values)
    if isinstance(layer, MaskedLayer):
        tokens = int(layer.visible.sum())  # over the mask's heads (query heads under gqa='expand')
        mask_heads = layer.visible.shape[1]
        step = heads * row + mask_heads  # the keys and values, and one mask byte per mask head
        return LayerSize(
            tokens, tokens * row, allocated + _nbytes(layer._visible), mask_heads, stored, free * step, step
        )
    return LayerSize(heads * length, stored, allocated, heads, stored, free * heads * row, heads * row)


def store(
    layer: DynamicLayer,
    keys: torch.Tensor,
    values: torch.Tensor,
    selection: torch.Tensor | HeadSelection | None,
    layout: str,
    reserve: int = 0,
    guard: Callable[[], None] | None = None,
) -> DynamicLayer:
    """The cache layer holding what ``selection`` keeps of ``keys``/``values`` ``[1, h_kv, L, d]``.

    ``selection``: positions ``[1, heads, n]``, a `HeadSelection`, or None (everything kept: ``layer``
    itself, or a preallocated copy when ``reserve`` > 0). ``heads`` may be a multiple of ``h_kv``
    (``gqa='expand'``): dense and varlen layers then store repeated heads, masked ones mask per head.
    """
    if selection is None:
        return CompressedLayer(keys, values, reserve=reserve) if reserve > 0 else layer
    heads = selection.heads if isinstance(selection, HeadSelection) else selection.shape[1]
    repeat = heads // keys.shape[1]
    if layout == "masked":
        visible = torch.zeros((1, heads, keys.shape[2]), dtype=torch.bool, device=keys.device)
        if isinstance(selection, HeadSelection):
            head_of = torch.arange(heads, device=keys.device).repeat_interleave(selection.lengths.to(keys.device))
            visible[0, head_of, selection.positions.to(keys.device)] = True
        else:
            visible.scatter_(2, selection, True)
        return MaskedLayer(keys, values, visible, reserve=reserve, guard=guard)
    if isinstance(selection, torch.Tensor) and layout == "auto":
        kept_keys, kept_values = gather_positions(keys, selection), gather_positions(values, selection)
        return CompressedLayer(kept_keys, kept_values, repeat=repeat, reserve=reserve)
    if isinstance(selection, torch.Tensor):  # layout='varlen' for a uniform selection
        lengths = torch.full((heads,), selection.shape[2], device=selection.device)
        selection = HeadSelection(selection[0].reshape(-1), lengths)
    lengths = selection.lengths.to(keys.device)
    head_of = (torch.arange(heads, device=keys.device) // repeat).repeat_interleave(lengths)
    positions = selection.positions.to(keys.device)
    return VarlenLayer(
        keys[0, head_of, positions],
        values[0, head_of, positions],
        lengths.tolist(),
        reserve=reserve,
        repeat=repeat,
        guard=guard,
    )
