"""A new benchmark is one module plus one config: a magic number hidden in filler text, asked back.

The module yields `Sample`s (context, question, references, the metric's registered name, the answer
length) and scores predictions; the config names it. With this file on the path and its config's
folder on Hydra's search path, every policy, budget and protocol runs on it:

    PYTHONPATH=docs/examples python eval/run.py hydra.searchpath=[file://docs/examples/configs] \\
        bench=magic_number policy=snapkv budget=64
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from restkv.eval.benchmarks.contract.metrics import score as score_metric
from restkv.eval.benchmarks.contract.sample import Sample

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


@dataclass
class MagicNumberBenchmark:
    """``samples`` prompts of about ``words`` filler words, a magic number at a random depth."""

    samples: int = 4
    words: int = 300
    seed: int = 0
    name: str = "magic_number"

    def load_samples(self, tokenizer: Any) -> list[Sample]:
        found = []
        for index in range(self.samples):
            rng = random.Random(f"{self.seed}-{index}")  # one generator per sample: reproducible one by one
            number = str(rng.randrange(10_000, 100_000))
            filler = (FILLER * (self.words // 18 + 1)).split(". ")
            filler.insert(rng.randrange(len(filler)), f"The magic number is {number}")
            found.append(
                Sample(
                    id=f"magic_number-{index}",
                    task="magic_number",
                    context=". ".join(filler),
                    question="\nWhat is the magic number?",
                    answer_prefix=" The magic number is",
                    references=[number],
                    max_new_tokens=8,
                    metric="string_match_all",  # RULER's: every reference must appear in the answer
                    chat_template=False,
                )
            )
        return found

    def score(self, sample: Sample, prediction: str) -> float:
        return score_metric(sample.metric, prediction, sample.references)
