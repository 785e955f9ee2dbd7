"""Several questions about one compressed context, in turn: how a policy holds up when a cache is reused.

SCBench (Li et al., 2024) found that methods which look fine on one question degrade when one compressed context
serves several, which is how caches are reused in practice. Here the context alone is prefilled and compressed
once (so no question is in the observation window), then each turn's question is appended to the same cache and
answered greedily. With ``append_answers`` (default) the answer stays in the cache before the next question (a
conversation); without it, every turn starts again from the compressed context (independent questions on a shared
prefix). A sample's turns are its own question, then those of ``meta["turns"]``: benchmarks that know several
questions about one context give them (the micro suite's ``micro_multikey_1``: its other keys asked in turn;
``bench=scbench``).
``max_turns`` caps how many are asked. The record holds each turn's prediction, score and length; the sample's
score is their mean; ``metrics.json`` adds the accuracy of each turn (``turn_scores``), the per-turn curve.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

import torch

from restkv.eval.benchmarks.contract.base import Benchmark
from restkv.eval.benchmarks.contract.sample import Sample
from restkv.eval.evaluation.base import Session
from restkv.eval.evaluation.decoding import forward_tokens, prefill
from restkv.eval.evaluation.prompting import PromptTokens


@dataclass
class MultiTurn:
    """Turns on one compressed context (see the module); ``max_turns`` None asks every turn a sample has."""

    append_answers: bool = True
    max_turns: int | None = None

    def __post_init__(self) -> None:
        if self.max_turns is not None and (isinstance(self.max_turns, bool) or self.max_turns < 1):
            raise ValueError(f"evaluation.max_turns={self.max_turns!r} must be an integer >= 1 (or null: every turn)")

    def turns(self, benchmark: Benchmark, sample: Sample) -> list[Sample]:
        """The sample's turns as samples (its own question first), refused when it has only one."""
        extra = [
            replace(sample, question=t["question"], answer_prefix=t["answer_prefix"], references=t["references"])
            for t in sample.meta.get("turns", [])
        ]
        turns = [sample, *extra][: self.max_turns]
        if len(turns) < 2 and self.max_turns != 1:
            raise ValueError(
                f"evaluation=multi_turn asks several questions about one context, but {benchmark.name}'s sample "
                f"{sample.id} has one; use bench=micro bench.tasks=[micro_multikey_1] (its other keys asked in turn) "
                "or bench=scbench, or evaluation.max_turns=1"
            )
        return turns

    def check_samples(self, benchmark: Benchmark, samples: list[Sample]) -> None:
        """Refuse, before any folder or model, samples that have no further turns (see `turns`)."""
        for sample in samples:
            self.turns(benchmark, sample)

    @torch.no_grad()
    def evaluate(self, benchmark: Benchmark, session: Session, sample: Sample, prompt: PromptTokens) -> dict[str, Any]:
        turns = self.turns(benchmark, sample)
        context = PromptTokens(context=prompt.context, query=[], truncated=prompt.truncated)
        cache, _, kept = prefill(session.model, context, "query_agnostic", session.compressor)
        start = copy.deepcopy(cache) if not self.append_answers else None
        position, results = len(prompt.context), []
        for turn in turns:
            question = session.tokenizer(turn.question + turn.answer_prefix, add_special_tokens=False).input_ids
            work = cache if self.append_answers else copy.deepcopy(start)
            tokens = answer_turn(session, work, question, position, turn.max_new_tokens, self.append_answers)
            if self.append_answers:
                position += len(question) + len(tokens)
            prediction = session.tokenizer.decode(tokens, skip_special_tokens=True)
            results.append(
                {"prediction": prediction, "score": float(benchmark.score(turn, prediction)), "new_tokens": len(tokens)}
            )
        return {
            "prediction": results[0]["prediction"],
            "score": sum(r["score"] for r in results) / len(results),
            "kept_tokens": kept,
            "new_tokens": sum(r["new_tokens"] for r in results),
            "turns": results,
        }

    def report(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Accuracy of each turn over the samples that reached it (the per-turn curve)."""
        scores: list[list[float]] = []
        for record in records:
            for index, turn in enumerate(record.get("turns", [])):
                if index == len(scores):
                    scores.append([])
                scores[index].append(turn["score"])
        return {"turn_scores": [round(100 * sum(s) / len(s), 2) for s in scores]}


def answer_turn(
    session: Session, cache: Any, question: list[int], position: int, max_new_tokens: int, keep_answer: bool
) -> list[int]:
    """Append ``question`` at ``position`` and decode greedily until EOS (excluded from the answer) or the limit;
    with ``keep_answer`` every answer token, EOS included, is in the cache afterwards."""
    logits = forward_tokens(session.model, question, cache, position)
    position += len(question)
    tokens: list[int] = []
    for _ in range(max_new_tokens):
        token = int(logits.argmax())
        if token in session.eos_ids:
            if keep_answer:
                forward_tokens(session.model, [token], cache, position)
            break
        tokens.append(token)
        if len(tokens) < max_new_tokens or keep_answer:
            logits = forward_tokens(session.model, [token], cache, position)
            position += 1
    return tokens
