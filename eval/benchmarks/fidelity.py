"""How far eviction moves a model's outputs, whatever the model: a continuous quality signal.

For every sample of a source benchmark, the full-cache and the compressed-cache model are
compared on the same tokens:

- ``kl``: KL(full || compressed) of the next-token distributions, averaged over the positions of
  the reference answer fed teacher-forced (nats per token);
- ``agreement`` (the sample's score): the fraction of the full cache's first ``tokens`` greedy
  tokens that the compressed model also ranks first when fed the same greedy continuation.

Both work where accuracy saturates or is zero (random-weight models), so policies can be told
apart on any checkpoint.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eval.benchmarks.base import Benchmark, Sample
from eval.generation import answer, teacher_forced_logprobs
from eval.prompting import PromptTokens
from restkv.integrate import KVCompressor


@dataclass
class FidelityBenchmark:
    """Fidelity of eviction on the samples of ``source`` (any benchmark).

    ``tokens``: greedy tokens compared; ``answer_separator`` is put before the reference when it
    is tokenized as the teacher-forced answer (RULER answers follow a space).
    """

    source: Benchmark
    tokens: int = 16
    answer_separator: str = " "
    name: str = "fidelity"

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ValueError(f"bench.tokens={self.tokens} must be >= 1")

    def load_samples(self, tokenizer: Any) -> list[Sample]:
        return list(self.source.load_samples(tokenizer))

    def score(self, sample: Sample, prediction: str) -> float:
        raise NotImplementedError("fidelity scores come from evaluate_sample, which needs the model")

    @torch.no_grad()
    def evaluate_sample(
        self,
        model: Any,
        tokenizer: Any,
        sample: Sample,
        prompt: PromptTokens,
        compressor: KVCompressor,
        protocol: str,
        eos_ids: set[int],
    ) -> dict[str, Any]:
        reference = tokenizer(self.answer_separator + sample.references[0], add_special_tokens=False)["input_ids"]
        with compressor.paused():
            full_reference = teacher_forced_logprobs(model, prompt, compressor, protocol, reference)
            greedy = answer(model, prompt, compressor, protocol, self.tokens, set()).tokens
        evicted_reference = teacher_forced_logprobs(model, prompt, compressor, protocol, reference)
        kept = compressor.record.kept
        evicted_greedy = teacher_forced_logprobs(model, prompt, compressor, protocol, greedy)
        kl = (full_reference.exp() * (full_reference - evicted_reference)).sum(-1).clamp_min(0)
        agreement = (evicted_greedy.argmax(-1) == torch.tensor(greedy, device=evicted_greedy.device)).float()
        return {
            "prediction": tokenizer.decode(greedy, skip_special_tokens=True),
            "score": float(agreement.mean()),
            "kl": float(kl.mean()),
            "kept_tokens": sum(kept) / len(kept) if kept else float(prompt.length),
        }

    def report(self, records: list[dict[str, Any]], folder: Path) -> dict[str, Any]:
        by_task: dict[str, list[float]] = defaultdict(list)
        for record in records:
            by_task[record["task"]].append(record["kl"])
        kl = {task: statistics.fmean(values) for task, values in by_task.items()}
        return {"kl": kl, "kl_average": statistics.fmean(kl.values()) if kl else float("nan"), "score_is": "agreement"}
