"""``bench=fidelity``: the samples of another benchmark (``source``), evaluated with `restkv.eval.evaluation.Fidelity`.

The strategy is chosen by ``configs/bench/fidelity.yaml`` (``evaluation: fidelity``); this class only
forwards the source's samples and scorer, so ``evaluation=fidelity`` on the source bench itself gives
the same records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from restkv.eval.benchmarks.contract.base import Benchmark
from restkv.eval.benchmarks.contract.sample import Sample


@dataclass
class FidelityBenchmark:
    """The samples and scorer of ``source`` (any benchmark)."""

    source: Benchmark
    name: str = "fidelity"

    def load_samples(self, tokenizer: Any) -> list[Sample]:
        return list(self.source.load_samples(tokenizer))

    def score(self, sample: Sample, prediction: str) -> float:
        return self.source.score(sample, prediction)
