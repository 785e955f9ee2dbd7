"""Many prompts per decode step: the rows of a static decoder, filled as prompts come and refilled as they finish.

A decode step of an 8B model reads its ~15 GB of weights whatever the batch; after eviction each prompt adds only
its kept tokens. So after each prompt is prefilled and evicted on its own, its cache becomes one row of a
`restkv.decoding.static_decoder.StaticDecoder` and the rows are decoded together, each with its own positions,
write index, EOS flag and answer length. Rows of different lengths (a full cache, a head-wise allocation, a
fractional budget) share the buffers: each (row, head) has its own filled length, read through it by the static
attention. The host looks at the rows every ``check_every`` steps: a row whose answer is complete (an EOS has come,
or its ``max_new_tokens``) is handed back and its slot takes the next prompt; a finished row left without a
successor keeps computing (masked work, its writes kept in bounds) until the others finish. On CUDA the step of the
whole batch is recorded once and replayed.

Tokens are those of each prompt decoded alone (the answer is cut at its first EOS and at its own length);
the time of each window of steps is shared out among the rows active in it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from restkv.decoding.static_decoder import StaticDecoder, capacity, round_up
from restkv.devices import model_devices, synchronize

MAX_ROWS = 64
"""The most rows ``rows='auto'`` chooses."""
MEMORY_SHARE = 0.5
"""Share of a GPU's free memory the static buffers of ``rows='auto'`` may take."""


@dataclass
class Row:
    """One prompt being decoded in a row."""

    key: Any
    max_new_tokens: int
    seconds: float = 0.0


@dataclass
class Finished:
    """A prompt's answer: its tokens (cut at its length, not yet at its EOS), the forwards its row ran, its share
    of the decode time, and the batch size it was decoded in."""

    key: Any
    tokens: list[int]
    forwards: int
    seconds: float
    rows: int


def row_bytes(contents: list[dict[str, Any]], max_steps: int) -> int:
    """Bytes of one row of static buffers for a prompt of these contents answering ``max_steps`` tokens."""
    total = 0
    for c in contents:
        keys, values = c["keys"], c["values"]
        per_slot = keys.shape[1] * (keys.shape[-1] + values.shape[-1]) * keys.element_size()
        total += capacity(c, max_steps) * per_slot
    return total


def auto_rows(contents: list[dict[str, Any]], max_steps: int, free_bytes: int | None) -> int:
    """Rows for ``rows='auto'``: 1 without a GPU's free memory, else as many as `MEMORY_SHARE` of it holds."""
    if free_bytes is None:
        return 1
    return max(1, min(MAX_ROWS, int(free_bytes * MEMORY_SHARE) // max(1, row_bytes(contents, max_steps))))


@dataclass
class BatchedDecoding:
    """Rows of one static decoder, the prompts in them, and the host's view of their progress."""

    model: PreTrainedModel
    rows: int | str
    max_steps: int
    eos_ids: set[int]
    check_every: int
    record: bool
    free_bytes: Callable[[], int | None] = lambda: None
    decoder: StaticDecoder | None = None
    slots: list[Row | None] = field(default_factory=list)

    @property
    def active(self) -> int:
        return sum(row is not None for row in self.slots)

    def has_room(self) -> bool:
        return self.decoder is None or any(row is None for row in self.slots)

    def fits(self, contents: list[dict[str, Any]], max_new_tokens: int) -> bool:
        """Whether a prompt can take a free row now (else: drain the rows, `add` then builds a decoder for it)."""
        return self.decoder is None or self.decoder.fits(contents, max_new_tokens + self.check_every)

    def needs_build(self, contents: list[dict[str, Any]], max_new_tokens: int) -> bool:
        """Whether `add` builds (and records) a new decoder for this prompt."""
        return self.decoder is None or (self.active == 0 and not self.fits(contents, max_new_tokens))

    def reset(self) -> None:
        """Drop the decoder and its rows (one whose recording failed or disagreed must not be replayed)."""
        self.decoder, self.slots = None, []

    def add(self, key: Any, contents: list[dict[str, Any]], first_logits: torch.Tensor, position: int, max_new: int):
        """Put a prefilled prompt into a free row (building the decoder, recorded on CUDA, on first use)."""
        if self.needs_build(contents, max_new):
            self._build(contents)
        if self.decoder is None or not self.fits(contents, max_new) or not self.has_room():
            raise RuntimeError("no row can take this prompt now: decode the active rows to the end first (advance)")
        row = self.slots.index(None)
        first = first_logits.argmax()
        if self.record and self.decoder.graph is None:
            self.decoder.load(contents, first, position, row)
            self.decoder.capture()
        self.decoder.load(contents, first, position, row)
        self.slots[row] = Row(key, max_new)

    def _build(self, contents: list[dict[str, Any]]) -> None:
        steps = round_up(self.max_steps, 64)
        rows = auto_rows(contents, steps, self.free_bytes()) if self.rows == "auto" else int(self.rows)
        eos = sorted(self.eos_ids) or [-1]
        self.decoder = StaticDecoder(self.model, contents, steps, eos, self.record, rows, slack=self.check_every)
        self.slots = [None] * rows

    def advance(self) -> list[Finished]:
        """``check_every`` steps of every row, then the rows whose answers are complete (their slots freed)."""
        assert self.decoder is not None and self.active, "no row to decode"
        devices = model_devices(self.model)
        synchronize(*devices)
        start = time.perf_counter()
        for _ in range(self.check_every):
            self.decoder.advance()
        produced, ended = self.decoder.index.tolist(), self.decoder.ended.tolist()  # the one host read per window
        share = (time.perf_counter() - start) / self.active
        done = []
        for index, row in enumerate(self.slots):
            if row is None:
                continue
            row.seconds += share
            if ended[index] or produced[index] >= row.max_new_tokens:
                count = min(produced[index], row.max_new_tokens)
                tokens = self.decoder.generated[index, :count].tolist()
                done.append(Finished(row.key, tokens, count - 1, row.seconds, self.decoder.rows))
                self.slots[index] = None
        return done
