"""The micro needle grid: Needle-in-a-Haystack's lengths x depths sweep, with a needle the micro model can find.

``models/micro-llama`` never learned the paper's sentence needle ("The best thing to do in San
Francisco is ..."; ``bench=niah`` scores about 1 in 100 with it, whatever the policy), so its NIAH
heatmaps would say nothing about eviction. This grid keeps NIAH's shape (context lengths x needle
depths, a heatmap per run) and swaps the needle for the micro suite's cued single needle
(``micro_single_2``: ``{key} {value}.`` in the essay, asked as ``What is the number for {key}?``),
placed at each depth of the grid. Figures made from it say so. Real models use ``bench=niah``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from restkv.eval.benchmarks import micro, ruler
from restkv.eval.benchmarks.contract.base import Sample
from restkv.eval.benchmarks.contract.metrics import score as score_metric
from restkv.eval.benchmarks.niah.heatmap import grid_report
from restkv.eval.benchmarks.shared.haystack import check_haystack, haystack_name, load_haystack

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TASK = "micro_single_2"
NEEDLE_NOTE = "micro cued single needle (micro_single_2), not the paper's sentence needle"


@dataclass
class MicroNiahBenchmark:
    """``samples`` prompts per (length, depth) cell; writes ``heatmap.png`` into the run folder."""

    lengths: list[int] = field(default_factory=lambda: [512, 1024, 2048, 3072, 4096])
    depths: list[float] = field(default_factory=lambda: [0.0, 25.0, 50.0, 75.0, 100.0])
    samples: int = 2
    seed: int = 0
    haystack: str | None = None
    name: str = "niah_micro"

    def __post_init__(self) -> None:
        ruler.check_grid(self.lengths, self.samples)
        for depth in self.depths:
            if isinstance(depth, bool) or not isinstance(depth, int | float) or not 0 <= depth <= 100:
                raise ValueError(f"bench.depths has {depth!r}: depths are percents in [0, 100]")
        check_haystack(self.haystack)

    def load_samples(self, tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
        essay = ruler.parse_essay(load_haystack(self.haystack))
        samples = [
            micro.sample(TASK, tokenizer, int(length), self.seed, index, essay, depth=float(depth))
            for length in self.lengths
            for depth in self.depths
            for index in range(self.samples)
        ]
        for s in samples:
            s.meta["haystack"] = haystack_name(self.haystack)
        return samples

    def score(self, sample: Sample, prediction: str) -> float:
        return score_metric(sample.metric, prediction, sample.references)

    def report(self, records: list[dict[str, Any]], folder: Path) -> dict[str, Any]:
        written = grid_report(records, folder, "Micro needle grid")
        return {**written, "needle": NEEDLE_NOTE} if written else {}
