"""A deterministic toy benchmark for harness tests: no data files, exact-match scoring."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from restkv.eval.benchmarks.contract.base import Sample


@dataclass
class FakeBench:
    """``count`` samples over two tasks, each a short context with a question."""

    count: int = 6
    context_words: int = 200
    max_new_tokens: int = 4
    name: str = "fake"

    def load_samples(self, tokenizer: Any) -> Iterator[Sample]:
        for i in range(self.count):
            words = " ".join(f"word{(i * 7 + j) % 50}" for j in range(self.context_words))
            yield Sample(
                id=f"fake-{i}",
                task="even" if i % 2 == 0 else "odd",
                context=f"Text {i}: {words}.",
                question=" What is the answer?",
                answer_prefix=" Answer:",
                references=[f"word{i}"],
                max_new_tokens=self.max_new_tokens,
                metric="exact",
            )

    def score(self, sample: Sample, prediction: str) -> float:
        return float(prediction.strip() == sample.references[0])
