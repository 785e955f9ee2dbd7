"""Greedy decoding through a step recorded once and replayed: no host work per token on a GPU.

After prefill (and eviction) the cache moves into static-shape layers (`restkv.decoding.static_layers`) held by a
`StaticDecoder`; one step (the forward of the current token, its argmax written at the step's index
of a device buffer, "has an EOS come?" folded into a device flag, the position advanced) touches
only tensors of fixed shape and address. On CUDA that step is recorded once as a CUDA graph and
replayed with one launch per token; the host reads the EOS flag every ``check_every`` steps only.
Elsewhere the same step runs eagerly, which is how its arithmetic and bookkeeping are tested.

Decoders are kept per model and *signature* (every layer's kind, heads, capacity, dtype; the answer
length): the next prompt of the same shape loads its cache into the same buffers and replays the
same graph. Capacities are rounded up (`CAPACITY_STEP`) so that prompts of nearby lengths share one;
at most `KEPT_DECODERS` decoders stay alive (their buffers are a second copy of a cache).

The tokens are those of the eager loop (``restkv.eval``'s decoding) whatever the path: the first
token comes from the prefill's logits, each step from the previous token, the answer is cut at the
first EOS, and the stop flag is read at the same steps.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from restkv.choices import DECODE_PATHS as DECODE_PATHS  # re-exported: the paths this module implements
from restkv.decoding.static_layers import StaticLayer, static_contents

CAPACITY_STEP = 256
"""Static buffers hold a multiple of this many slots per head (prompts of nearby lengths share a decoder)."""
STEPS_STEP = 64
"""Answer lengths are rounded up to a multiple of this in a decoder's signature (tasks of nearby lengths share one)."""
KEPT_DECODERS = 2
RECORDING_STEPS = 2
"""Steps recording runs on the loaded prompt (warm-up, capture): room for them is kept in every buffer."""
RECORDING_DEVICES = ("cuda",)
"""Device types whose decode step is recorded (`StaticDecoder.capture`; CPU tests add ``cpu`` with a fake capture)."""


def round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def capacity(contents: dict[str, Any], max_steps: int) -> int:
    """Slots per head of a static layer decoding ``max_steps`` tokens after ``contents`` (and the recording's)."""
    return round_up(max(contents["lengths"]) + max_steps + RECORDING_STEPS, CAPACITY_STEP)


@dataclass
class Decoded:
    tokens: torch.Tensor
    """The tokens produced, on the device (the first from the prefill's logits); may run past an EOS."""
    forwards: int
    """Decode forwards run (one per token after the first)."""


class StaticDecoder:
    """Static buffers for ``rows`` prompts, the step over them and, on CUDA, its recording: one per model and
    signature. Each row has its own tokens, positions, write index and EOS flag; a step advances every row."""

    def __init__(
        self,
        model: PreTrainedModel,
        contents: list[dict[str, Any]],
        max_steps: int,
        eos: list[int],
        record: bool,
        rows: int = 1,
        slack: int = 0,
    ) -> None:
        device = model.device
        self.model = weakref.ref(model)
        self.cache = DynamicCache(config=model.config)
        self.capacities = [capacity(c, max_steps + slack) for c in contents]
        self.cache.layers = [
            StaticLayer(capacity=cap, rows=rows, **c) for c, cap in zip(contents, self.capacities, strict=True)
        ]
        self.ids = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.positions = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.width = max_steps + slack + RECORDING_STEPS
        self.generated = torch.zeros((rows, self.width), dtype=torch.long, device=device)
        self.index = torch.zeros(rows, dtype=torch.long, device=device)
        self.ended = torch.zeros(rows, dtype=torch.bool, device=device)
        self.logits = torch.zeros((rows, model.config.vocab_size), dtype=torch.float32, device=device)
        """The last step's logits per row (for checks of a recorded step against the eager one)."""
        self.eos = torch.tensor(eos, dtype=torch.long, device=device)
        self.record = record
        self.graph: Any = None

    @property
    def rows(self) -> int:
        return self.ids.shape[0]

    def fits(self, contents: list[dict[str, Any]], max_steps: int) -> bool:
        """Whether a prompt of these contents, answering up to ``max_steps`` tokens, fits a row of this decoder."""
        if len(contents) != len(self.cache.layers) or max_steps + RECORDING_STEPS > self.width:
            return False
        for layer, cap, c in zip(self.cache.layers, self.capacities, contents, strict=True):
            same = c["keys"].shape[1] == layer.heads and c["repeat"] == layer.repeat
            same = same and c["keys"].dtype == layer.dtype and (c["visible"] is None) == (layer.visible is None)
            if not same or max(c["lengths"]) + max_steps + RECORDING_STEPS > cap:
                return False
        return True

    def load(self, contents: list[dict[str, Any]], first: torch.Tensor, position: int, row: int = 0) -> None:
        """A new prompt in ``row``: its evicted cache into the buffers, its first token (from the prefill) as step 0."""
        for layer, content in zip(self.cache.layers, contents, strict=True):
            layer.load(content["keys"], content["values"], content["lengths"], content["visible"], row)
        self.ids[row].copy_(first.view(1))
        self.positions[row].fill_(position)
        self.generated[row].zero_()
        self.generated[row, 0] = first
        self.index[row] = 1
        self.ended[row] = torch.isin(first, self.eos)

    def step(self) -> None:
        """One token per row: the forward of the current ones, the next written at each row's ``index``, the flags
        and positions advanced (a finished row goes on until it is loaded again; its writes stay in bounds)."""
        model = self.model()
        assert model is not None, "the model of this decoder is gone"
        out = model(input_ids=self.ids, cache=self.cache, position_ids=self.positions, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1]
        self.logits.copy_(logits)
        tokens = logits.argmax(dim=-1)
        self.generated.scatter_(1, self.index.clamp(max=self.width - 1)[:, None], tokens[:, None])
        self.ended |= torch.isin(tokens, self.eos)
        self.ids.copy_(tokens[:, None])
        self.positions.add_(1)
        self.index.add_(1)

    def capture(self) -> None:
        """Record the step: a warm-up on a side stream (kernels and workspaces set up), then the capture. Both run
        real steps on the loaded prompt, which must be loaded again before decoding."""
        model = self.model()
        assert model is not None, "the model of this decoder is gone"
        device = model.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            self.step()
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.step()

    def advance(self) -> None:
        """One step of every row: replayed when recorded, else run."""
        self.graph.replay() if self.graph is not None else self.step()

    def decode(self, max_new_tokens: int, check_every: int) -> Decoded:
        """Row 0's tokens after its loaded first one, stopping at a check where an EOS has come (as the eager loop
        does; one prompt at a time)."""
        forwards = 0
        for step in range(max_new_tokens):
            if ((step + 1) % check_every == 0 or step + 1 == max_new_tokens) and bool(self.ended[0]):
                return Decoded(self.generated[0, : step + 1], forwards)
            if step + 1 < max_new_tokens:
                self.advance()
                forwards += 1
        return Decoded(self.generated[0, :max_new_tokens], forwards)

    def sync_host_lengths(self) -> None:
        for layer in self.cache.layers:
            layer.sync_host_length()


_DECODERS: OrderedDict[tuple, StaticDecoder] = OrderedDict()


def signature(model: PreTrainedModel, contents: list[dict[str, Any]], max_steps: int, eos: list[int]) -> tuple:
    """What a decoder's buffers and recording depend on: the model, each layer's static shape, the answer length."""
    layers = tuple(
        (
            tuple(c["keys"].shape[:2]),
            capacity(c, max_steps),
            c["keys"].shape[-1],
            c["keys"].dtype,
            c["repeat"],
            None if c["visible"] is None else c["visible"].shape[1],
        )
        for c in contents
    )
    return (id(model), str(model.device), layers, max_steps, tuple(eos))


def decoder_for(model: PreTrainedModel, contents: list[dict[str, Any]], max_steps: int, eos: list[int], record: bool):
    """The kept decoder of this signature, else a new one (the least recently used one dropped past the limit)."""
    key = (*signature(model, contents, max_steps, eos), record)
    decoder = _DECODERS.get(key)
    if decoder is None or decoder.model() is not model:
        decoder = StaticDecoder(model, contents, max_steps, eos, record)
        _DECODERS[key] = decoder
        while len(_DECODERS) > KEPT_DECODERS:
            _DECODERS.popitem(last=False)
    _DECODERS.move_to_end(key)
    return decoder


def forget(model: PreTrainedModel, contents: list[dict[str, Any]], max_new_tokens: int, eos_ids: set[int]) -> None:
    """Drop the kept decoders of this prompt's signature (one whose recording failed must not be replayed)."""
    base = signature(model, contents, round_up(max_new_tokens, STEPS_STEP), sorted(eos_ids) or [-1])
    for key in [key for key in _DECODERS if key[: len(base)] == base]:
        del _DECODERS[key]


def static_form(cache: DynamicCache) -> list[dict[str, Any]]:
    """Every layer's static contents (`restkv.decoding.static_layers.static_contents`); NotImplementedError for a
    cache without one."""
    return [static_contents(layer) for layer in cache.layers]


def decode_static(
    model: PreTrainedModel,
    contents: list[dict[str, Any]],
    first_logits: torch.Tensor,
    position: int,
    max_new_tokens: int,
    eos_ids: set[int],
    check_every: int,
    record: bool,
) -> Decoded:
    """Greedy tokens from ``first_logits`` on, through the static step (recorded and replayed when ``record``)."""
    eos = sorted(eos_ids) or [-1]
    decoder = decoder_for(model, contents, round_up(max_new_tokens, STEPS_STEP), eos, record)
    first = first_logits.argmax()
    decoder.load(contents, first, position)
    if decoder.record and decoder.graph is None and max_new_tokens > 1:
        decoder.capture()
        decoder.load(contents, first, position)
    return decoder.decode(max_new_tokens, check_every)
