"""RULER's per-sample metrics (``string_match_all`` / ``string_match_part`` of RULER's ``constants.py``).

Called as ``metric(prediction, references, **kwargs)``, each returns the score of one sample in
``[0, 1]``: ``string_match_all`` averages over the references, ``string_match_part`` takes the
best. The registry of metric names is :mod:`restkv.eval.benchmarks.contract.metrics`.
"""

from __future__ import annotations

import re
from typing import Any

from restkv.eval.benchmarks.shared.text_metrics import best

__all__ = ["METRICS", "ruler_string_match_all", "ruler_string_match_part"]

_CONTROL_CHARS = re.compile(r"[\x00-\x1f]")


def _ruler_clean(prediction: str) -> str:
    """RULER's prediction clean-up: strip, turn control characters into newlines, strip again."""
    return _CONTROL_CHARS.sub("\n", prediction.strip()).strip()


def _ruler_hits(prediction: str, references: list[str]) -> list[float]:
    """1.0 per reference found (case-insensitively) as a substring of the cleaned prediction, else 0.0."""
    text = _ruler_clean(prediction).lower()
    return [1.0 if ref.lower() in text else 0.0 for ref in references]


def ruler_string_match_all(prediction: str, references: list[str], **kwargs: Any) -> float:
    """Share of the references that occur, case-insensitively, as substrings of the prediction.

    Used by RULER's niah, variable_tracking, common/freq word extraction tasks. Substring, not
    word, matching: reference "12" is found in "3125".
    """
    hits = _ruler_hits(prediction, references)
    return sum(hits) / len(hits) if hits else 0.0


def ruler_string_match_part(prediction: str, references: list[str], **kwargs: Any) -> float:
    """1 if any reference occurs (case-insensitively) as a substring of the prediction, else 0 (RULER qa)."""
    return best(_ruler_hits(prediction, references))


METRICS = {
    "string_match_all": ruler_string_match_all,
    "string_match_part": ruler_string_match_part,
}
"""RULER's metrics by the name a `Sample` carries (collected by `restkv.eval.benchmarks.contract.metrics`)."""
