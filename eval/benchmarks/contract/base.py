"""What every benchmark hands the runner: samples as plain data, and how to score them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from restkv.eval.benchmarks.contract.sample import Sample

__all__ = ["Benchmark", "Sample"]


class Benchmark(Protocol):
    """A benchmark yields samples and scores predictions (0-1 per sample).

    It may also define ``report(records, folder) -> dict``: extra entries for ``metrics.json``
    (e.g. per-length averages) and extra files (e.g. a heatmap) written into the run folder.
    """

    name: str

    def load_samples(self, tokenizer: Any) -> Iterable[Sample]: ...

    def score(self, sample: Sample, prediction: str) -> float: ...
