"""What an evaluation strategy receives from the runner, and what it must provide."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

from restkv.eval.benchmarks.contract.base import Benchmark
from restkv.eval.benchmarks.contract.sample import Sample
from restkv.eval.evaluation.prompting import PromptTokens
from restkv.integrate import PrefillRecord


class Compressor(Protocol):
    """The part of a KV compressor evaluation relies on (`restkv.KVCompressor` is one).

    ``record`` describes the last prefill (tokens kept per layer, eviction time); ``active`` is
    False inside ``paused()``, where the model runs with its full cache.
    """

    record: PrefillRecord
    active: bool

    def reserve_decode(self, tokens: int) -> None: ...

    def paused(self) -> contextlib.AbstractContextManager[None]: ...


@dataclass
class Session:
    """Everything a strategy may use for one run: built once by the runner, shared by every sample."""

    model: Any
    tokenizer: Any
    compressor: Compressor
    protocol: str
    eos_ids: set[int]
    decode: str = "eager"
    """How greedy answers are decoded (`restkv.choices.DECODE_PATHS`); every path gives the same tokens."""


class Evaluation(Protocol):
    """A way to evaluate one sample: returns the record's outcome fields.

    The outcome must hold ``prediction``, ``score`` (0-1) and ``kept_tokens``; strategies add their
    own fields (timings, ``kl``). ``report`` returns extra ``metrics.json`` entries over all records.
    """

    def evaluate(
        self, benchmark: Benchmark, session: Session, sample: Sample, prompt: PromptTokens
    ) -> dict[str, Any]: ...

    def report(self, records: list[dict[str, Any]]) -> dict[str, Any]: ...
