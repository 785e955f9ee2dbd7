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

_MAX_REFERENCES = 512
_FULL_CACHE_REFERENCES: dict[tuple, tuple[torch.Tensor, list[int], list[int]]] = {}


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
        full_reference, greedy, reference = self._full_cache_reference(
            model, tokenizer, sample, prompt, compressor, protocol
        )
        evicted_reference, evicted_greedy = teacher_forced_logprobs(
            model, prompt, compressor, protocol, [reference, greedy]
        )
        kept = compressor.record.kept
        kl = (full_reference.exp() * (full_reference - evicted_reference)).sum(-1).clamp_min(0)
        agreement = (evicted_greedy.argmax(-1) == torch.tensor(greedy, device=evicted_greedy.device)).float()
        return {
            "prediction": tokenizer.decode(greedy, skip_special_tokens=True),
            "score": float(agreement.mean()),
            "kl": float(kl.mean()),
            "kept_tokens": sum(kept) / len(kept) if kept else float(prompt.length),
        }

    def _full_cache_reference(
        self, model: Any, tokenizer: Any, sample: Sample, prompt: PromptTokens, compressor: KVCompressor, protocol: str
    ) -> tuple[torch.Tensor, list[int], list[int]]:
        """Full-cache log-probs over the reference, the full cache's greedy tokens, the reference tokens.

        They do not depend on the policy, so they are kept (per model, prompt and protocol) for
        the other policies and budgets compared in the same process.
        """
        key = (id(model), protocol, tuple(prompt.context), tuple(prompt.query), self.tokens, sample.references[0])
        if key not in _FULL_CACHE_REFERENCES:
            reference = tokenizer(self.answer_separator + sample.references[0], add_special_tokens=False)["input_ids"]
            with compressor.paused():
                greedy = answer(model, prompt, compressor, protocol, self.tokens, set()).tokens
                (logprobs,) = teacher_forced_logprobs(model, prompt, compressor, protocol, [reference])
            if len(_FULL_CACHE_REFERENCES) >= _MAX_REFERENCES:
                _FULL_CACHE_REFERENCES.pop(next(iter(_FULL_CACHE_REFERENCES)))
            _FULL_CACHE_REFERENCES[key] = (logprobs, greedy, reference)
        return _FULL_CACHE_REFERENCES[key]

    def report(self, records: list[dict[str, Any]], folder: Path) -> dict[str, Any]:
        by_task: dict[str, list[float]] = defaultdict(list)
        for record in records:
            by_task[record["task"]].append(record["kl"])
        kl = {task: statistics.fmean(values) for task, values in by_task.items()}
        return {"kl": kl, "kl_average": statistics.fmean(kl.values()) if kl else float("nan"), "score_is": "agreement"}
