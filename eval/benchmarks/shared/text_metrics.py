"""The text-scoring pieces several benchmarks' metrics share: normalisation, token F1, ROUGE, best-of.

LongBench and InfiniteBench both score QA answers with the SQuAD-style English token F1 and
normalise Chinese text the same way; NIAH and InfiniteBench both use Google's ``rouge-score``.
These pieces live here once; each benchmark's own metrics sit beside it in
``eval/benchmarks/<benchmark>/metrics.py`` and the registry of metric names is
:mod:`restkv.eval.benchmarks.contract.metrics`.

``rouge-score`` is imported only when a ROUGE scorer is first asked for, so importing the metrics
costs nothing on machines (or in scripts) that never score a summary.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rouge_score.rouge_scorer import RougeScorer

__all__ = ["best", "english_token_f1", "normalize_en", "normalize_zh", "rouge_scorer", "token_f1"]

# The Chinese punctuation LongBench / InfiniteBench strip on top of ``string.punctuation``.
# Quirk: the set is irregular: it has the closing title mark 》 but not the opening 《, and lacks
# the full-width full stop ． (U+FF0E), 〈〉 and the low single quote ‚ (U+201A).
_ZH_EXTRA_PUNCTUATION = (
    "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､"
    "、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿"
    "–—‘’‛“”„‟…‧﹏."
)
_EN_PUNCTUATION = frozenset(string.punctuation)
_ZH_PUNCTUATION = frozenset(string.punctuation + _ZH_EXTRA_PUNCTUATION)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def _strip_chars(text: str, chars: frozenset[str]) -> str:
    """Drop every character of ``text`` that is in ``chars``."""
    return "".join(ch for ch in text if ch not in chars)


def normalize_en(text: str) -> str:
    """SQuAD-style normalisation: lower-case, drop ASCII punctuation, drop a/an/the, squeeze spaces.

    Punctuation is removed before the articles, so "the-end" becomes "theend" and keeps its
    "the"; the article pattern uses word boundaries, so "theory" is untouched.
    """
    text = _strip_chars(text.lower(), _EN_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def normalize_zh(text: str) -> str:
    """Chinese normalisation: lower-case, drop ASCII and Chinese punctuation, delete all whitespace.

    Whitespace is deleted rather than squeezed, so "New York" becomes "newyork".
    """
    return "".join(_strip_chars(text.lower(), _ZH_PUNCTUATION).split())


def token_f1(prediction_tokens: Sequence[str], reference_tokens: Sequence[str]) -> float:
    """Bag-of-tokens F1 (multiset overlap); 0 when nothing overlaps or either side is empty."""
    overlap = sum((Counter(prediction_tokens) & Counter(reference_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = 1.0 * overlap / len(prediction_tokens)
    recall = 1.0 * overlap / len(reference_tokens)
    return (2 * precision * recall) / (precision + recall)


def english_token_f1(prediction: str, reference: str) -> float:
    """English token F1 after :func:`normalize_en`, tokens being whitespace-separated words.

    LongBench's ``qa_f1_score`` and InfiniteBench's English QA scorer are both this, per reference.
    """
    return token_f1(normalize_en(prediction).split(), normalize_en(reference).split())


def best(scores: Iterable[float]) -> float:
    """The best of ``scores``; 0.0 when there are none (LongBench's running maximum starts at 0)."""
    return max(scores, default=0.0)


@cache
def rouge_scorer(rouge_type: str, use_stemmer: bool) -> RougeScorer:
    """A cached ``rouge-score`` scorer for one ROUGE type (the package is imported on first use)."""
    from rouge_score import rouge_scorer as scorers

    return scorers.RougeScorer([rouge_type], use_stemmer=use_stemmer)
