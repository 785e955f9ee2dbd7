"""What every benchmark hands the runner: samples as plain data, and how to score them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Sample:
    """One prompt to answer.

    The prompt is ``context + question + answer_prefix``. The split matters for the two
    evaluation protocols: ``query_aware`` compresses the whole prompt (the observation window
    sees the question); ``query_agnostic`` compresses ``context`` alone and appends
    ``question + answer_prefix`` after eviction. ``context`` is also the part that is
    truncated from the middle when a prompt exceeds the model's context.
    """

    id: str
    task: str
    context: str
    question: str
    references: list[str]
    max_new_tokens: int
    metric: str
    answer_prefix: str = ""
    chat_template: bool = True
    meta: dict[str, Any] = field(default_factory=dict)


class Benchmark(Protocol):
    """A benchmark yields samples and scores predictions (0-1 per sample)."""

    name: str

    def samples(self, tokenizer: Any) -> Iterator[Sample]: ...

    def score(self, sample: Sample, prediction: str) -> float: ...
