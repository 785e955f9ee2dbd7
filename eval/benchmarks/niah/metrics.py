"""Needle-in-a-Haystack's per-sample metric: ROUGE-1 of the needle against the response.

Called as ``metric(prediction, references, **kwargs)``, it returns the score of one sample in
``[0, 1]`` (a single needle; with several references the best one counts). The registry of
metric names is :mod:`restkv.eval.benchmarks.contract.metrics`; ``rouge-score`` is imported when the metric first runs.
"""

from __future__ import annotations

from typing import Any

from restkv.eval.benchmarks.shared.text_metrics import best, rouge_scorer

__all__ = ["METRICS", "niah_rouge"]


def niah_rouge(prediction: str, references: list[str], **kwargs: Any) -> float:
    """ROUGE-1 F (rouge-score, Porter stemming) of the needle against the response, best over references.

    The LLMTest_NeedleInAHaystack-style scripts report this x10 (0-10 heat maps); this returns
    the 0-1 value. rouge-score lower-cases and keeps only [a-z0-9] tokens, so non-Latin needles
    score 0.
    """
    scorer = rouge_scorer("rouge1", True)
    return best(scorer.score(ref, prediction)["rouge1"].fmeasure for ref in references)


METRICS = {
    "niah_rouge": niah_rouge,
}
"""Needle-in-a-Haystack's metrics by the name a `Sample` carries (collected by
`restkv.eval.benchmarks.contract.metrics`)."""
