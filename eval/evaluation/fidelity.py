"""Fidelity: how far eviction moves a model's outputs, whatever the model (a continuous signal).

For every sample, the full-cache and the compressed-cache model are compared on the same tokens:

- ``kl``: KL(full || compressed) of the next-token distributions, averaged over the positions of
  the reference answer fed teacher-forced (nats per token);
- ``agreement`` (the sample's score): the fraction of the full cache's first ``tokens`` greedy
  tokens that the compressed model also ranks first when fed the same greedy continuation.

Both work where accuracy saturates or is zero (random-weight models), so policies can be told
apart on any checkpoint.
"""

from __future__ import annotations

import statistics
import weakref
from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from typing import Any

import torch

from restkv.eval.benchmarks.contract.base import Benchmark
from restkv.eval.benchmarks.contract.sample import Sample
from restkv.eval.evaluation.base import Session
from restkv.eval.evaluation.decoding import answer, teacher_forced_logprobs
from restkv.eval.evaluation.prompting import PromptTokens

REFERENCE_CACHE_BYTES = 1 << 30
"""Host memory the full-cache references of one model may take (oldest dropped first): each is
``[reference tokens, vocab]`` float32 log-probabilities, ~0.5 MB per token at a 128k vocabulary."""
Reference = tuple[torch.Tensor, list[int], list[int]]
# Full-cache references do not depend on the policy: kept per model (dropped with it) for the other
# policies and budgets compared in the same process, in host memory so that the GPU holds only the
# sample being scored.
_FULL_CACHE_REFERENCES: weakref.WeakKeyDictionary[Any, OrderedDict[tuple, Reference]] = weakref.WeakKeyDictionary()


def reference_bytes(model: Any) -> int:
    """Bytes the cached full-cache references of ``model`` take (all in host memory)."""
    cached = _FULL_CACHE_REFERENCES.get(model, {})
    return sum(logprobs.nbytes for logprobs, _, _ in cached.values())


def _remember(cached: OrderedDict[tuple, Reference], key: tuple, reference: Reference, limit: int) -> None:
    """Keep ``reference`` unless it alone exceeds ``limit``, dropping the oldest until all fit."""
    size = reference[0].nbytes
    if size > limit:
        return
    held = sum(entry[0].nbytes for entry in cached.values())
    while cached and held + size > limit:
        held -= cached.popitem(last=False)[1][0].nbytes
    cached[key] = reference


@dataclass
class Fidelity:
    """Teacher-forced divergence from the full cache and greedy-token agreement.

    ``tokens``: greedy tokens compared; ``answer_separator`` is put before the reference when it
    is tokenized as the teacher-forced answer (RULER answers follow a space).
    """

    tokens: int = 16
    answer_separator: str = " "

    def __post_init__(self) -> None:
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int) or self.tokens < 1:
            raise ValueError(f"evaluation.tokens={self.tokens!r} must be an integer >= 1")

    @torch.no_grad()
    def evaluate(self, benchmark: Benchmark, session: Session, sample: Sample, prompt: PromptTokens) -> dict[str, Any]:
        stored, greedy, reference = self._full_cache_reference(session, sample, prompt)
        evicted_reference, evicted_greedy = teacher_forced_logprobs(
            session.model, prompt, session.compressor, session.protocol, [reference, greedy]
        )
        full_reference = stored.to(evicted_reference.device)
        kept = session.compressor.record.kept
        kl = (full_reference.exp() * (full_reference - evicted_reference)).sum(-1).clamp_min(0)
        agreement = (evicted_greedy.argmax(-1) == torch.tensor(greedy, device=evicted_greedy.device)).float()
        return {
            "prediction": session.tokenizer.decode(greedy, skip_special_tokens=True),
            "score": float(agreement.mean()),
            "kl": float(kl.mean()),
            "kept_tokens": sum(kept) / len(kept) if kept else float(prompt.length),
        }

    def _full_cache_reference(self, session: Session, sample: Sample, prompt: PromptTokens) -> Reference:
        """Full-cache log-probs over the reference, the full cache's greedy tokens, the reference tokens."""
        cached = _FULL_CACHE_REFERENCES.setdefault(session.model, OrderedDict())
        key = (session.protocol, tuple(prompt.context), tuple(prompt.query), self.tokens, sample.references[0])
        if key in cached:
            cached.move_to_end(key)
            return cached[key]
        model, compressor, protocol = session.model, session.compressor, session.protocol
        text = self.answer_separator + sample.references[0]
        reference = session.tokenizer(text, add_special_tokens=False)["input_ids"]
        with compressor.paused():
            greedy = answer(model, prompt, compressor, protocol, self.tokens, set()).tokens
            (logprobs,) = teacher_forced_logprobs(model, prompt, compressor, protocol, [reference])
        entry = (logprobs.cpu(), greedy, reference)
        _remember(cached, key, entry, REFERENCE_CACHE_BYTES)
        return entry

    def report(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        by_task: dict[str, list[float]] = defaultdict(list)
        for record in records:
            by_task[record["task"]].append(record["kl"])
        kl = {task: statistics.fmean(values) for task, values in by_task.items()}
        return {"kl": kl, "kl_average": statistics.fmean(kl.values()) if kl else float("nan"), "score_is": "agreement"}
