"""LongBench v1's per-sample metrics and prediction clean-up (the official ``eval.py`` / ``metrics.py``).

Every metric is called as ``metric(prediction, references, **kwargs)`` and returns the score of
one sample in ``[0, 1]``: the best score over the references, starting from 0, as ``eval.py``
does. Each one reproduces the number the official code gives for that sample, quirks included;
the quirks are spelled out in the docstrings ("Quirk:"). The registry of metric names is
:mod:`restkv.eval.benchmarks.contract.metrics`; apply :func:`longbench_postprocess` to a prediction before scoring it.
LongBench-E's length buckets (the official ``scorer_e``) are here too: :func:`bucket_scores`.

jieba (the Chinese tasks' word segmenter) is imported only when a Chinese metric first runs.
"""

from __future__ import annotations

import difflib
import re
import statistics
from collections.abc import Sequence
from typing import Any

from restkv.eval.benchmarks.shared.text_metrics import best, english_token_f1, normalize_zh, token_f1

__all__ = [
    "LENGTH_BUCKETS",
    "LONGBENCH_FIRST_LINE_TASKS",
    "LONGBENCH_TASKS",
    "METRICS",
    "bucket_scores",
    "format_buckets",
    "length_bucket",
    "longbench_classification",
    "longbench_code_sim",
    "longbench_count",
    "longbench_postprocess",
    "longbench_qa_f1",
    "longbench_qa_f1_zh",
    "longbench_retrieval",
    "longbench_retrieval_zh",
    "longbench_rouge",
    "longbench_rouge_zh",
]

_ANY_DIGITS = re.compile(r"\d+")  # Unicode digits, as LongBench's count/retrieval regexes


def _jieba_words(text: str) -> list[str]:
    """jieba's precise-mode segmentation (``cut_all=False``), the mode LongBench uses."""
    import jieba  # imported on first use: only LongBench's Chinese tasks need it

    return list(jieba.cut(text, cut_all=False))


def _required_kwarg(kwargs: dict[str, Any], name: str, metric: str, meaning: str) -> Any:
    """Return ``kwargs[name]``, or raise ``TypeError`` naming it (and saying what it is) when absent or None."""
    value = kwargs.get(name)
    if value is None:
        raise TypeError(f"metric {metric!r} requires the keyword argument {name!r} ({meaning})")
    return value


LONGBENCH_TASKS: frozenset[str] = frozenset(
    {
        "narrativeqa",
        "qasper",
        "multifieldqa_en",
        "multifieldqa_zh",
        "hotpotqa",
        "2wikimqa",
        "musique",
        "dureader",
        "gov_report",
        "qmsum",
        "multi_news",
        "vcsum",
        "trec",
        "triviaqa",
        "samsum",
        "lsht",
        "passage_retrieval_en",
        "passage_count",
        "passage_retrieval_zh",
        "lcc",
        "repobench-p",
    }
)
LONGBENCH_FIRST_LINE_TASKS: frozenset[str] = frozenset({"trec", "triviaqa", "samsum", "lsht"})


def longbench_postprocess(task: str, prediction: str) -> str:
    """Apply LongBench's prediction clean-up for ``task`` (LongBench and LongBench-E task names).

    For the few-shot tasks ``trec``, ``triviaqa``, ``samsum`` and ``lsht`` the official scorer keeps
    only the first line of the prediction after dropping leading newlines (the model tends to go
    on with another few-shot example). Quirk: only ``\\n`` is stripped first, so a prediction that
    starts with a space and then a newline keeps just that space. All other tasks are unchanged.
    """
    if task not in LONGBENCH_TASKS:
        raise ValueError(f"unknown LongBench task {task!r}; valid tasks are: {', '.join(sorted(LONGBENCH_TASKS))}")
    if task in LONGBENCH_FIRST_LINE_TASKS:
        return prediction.lstrip("\n").split("\n")[0]
    return prediction


def _qa_f1_zh_one(prediction: str, reference: str) -> float:
    """Chinese token F1 over jieba words, each normalised, empty words dropped."""

    def tokens(text: str) -> list[str]:
        return [word for word in map(normalize_zh, _jieba_words(text)) if word]

    return token_f1(tokens(prediction), tokens(reference))


def longbench_qa_f1(prediction: str, references: list[str], **kwargs: Any) -> float:
    """Token F1 on normalised English text (LongBench ``qa_f1_score``), best over references.

    Normalisation: lower-case, remove ASCII punctuation, remove the articles a/an/the, squeeze
    whitespace; tokens are whitespace-separated words.
    """
    return best(english_token_f1(prediction, ref) for ref in references)


def longbench_qa_f1_zh(prediction: str, references: list[str], **kwargs: Any) -> float:
    """Token F1 over jieba words (LongBench ``qa_f1_zh_score``), best over references.

    Each jieba word is lower-cased and stripped of ASCII/Chinese punctuation and whitespace;
    words that end up empty are dropped.
    """
    return best(_qa_f1_zh_one(prediction, ref) for ref in references)


# ROUGE-L as computed by the PyPI package ``rouge`` 1.0.1 (LongBench's ``rouge_score`` uses
# ``Rouge().get_scores([pred], [ref], avg=True)["rouge-l"]["f"]`` and maps any exception to 0).
#
# That package reconstructs the LCS recursively, one Python frame per backtracking step, so a
# long "sentence" pair raises RecursionError and LongBench scores the sample 0. The budgets below
# are the most backtracking calls that fit under Python's default recursion limit (1000) with the
# call stack of the official ``python eval.py`` on CPython 3.8-3.10 (measured: 990 calls for
# ``rouge``, one less for ``rouge_zh`` whose wrapper adds a frame). CPython >= 3.11 allows one
# more call; copies of eval.py with a deeper call stack allow fewer.
_ROUGE_RECON_CALL_BUDGET = 990
_ROUGE_ZH_RECON_CALL_BUDGET = 989


def _pyrouge_sentences(text: str) -> list[list[str]]:
    """Split text the way ``rouge`` does: sentences on '.', words on single spaces.

    Quirks: any '.' ends a sentence (decimals, abbreviations, "..."); a whitespace-only piece
    between two periods survives as a sentence made of one empty-string word.
    """
    return [piece.split() or [""] for piece in text.split(".") if piece]


def _lcs_backtrack(ref: list[str], hyp: list[str]) -> tuple[list[str], int]:
    """One LCS of ``ref`` and ``hyp`` and the number of backtracking calls ``rouge`` spends on it.

    Which LCS is returned matters (ROUGE-L here counts distinct words in it), so ties are broken
    as in ``rouge``: walking back from the end, a match is taken, otherwise the step goes to the
    shorter ``ref`` prefix only when that strictly keeps a longer LCS, else to the shorter ``hyp``
    prefix. The call count includes the final call that reaches an empty prefix.
    """
    table = [[0] * (len(hyp) + 1) for _ in range(len(ref) + 1)]
    for i, ref_word in enumerate(ref, start=1):
        above, row = table[i - 1], table[i]
        for j, hyp_word in enumerate(hyp, start=1):
            row[j] = above[j - 1] + 1 if ref_word == hyp_word else max(above[j], row[j - 1])
    words: list[str] = []
    i, j, calls = len(ref), len(hyp), 1
    while i > 0 and j > 0:
        if ref[i - 1] == hyp[j - 1]:
            words.append(ref[i - 1])
            i, j = i - 1, j - 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
        calls += 1
    return words, calls


def _pyrouge_rouge_l_f(prediction: str, reference: str, call_budget: int | None) -> float:
    """Summary-level ROUGE-L F of the ``rouge`` package (default ``exclusive=True``), or 0 on its errors.

    Quirks of that implementation, all reproduced:

    * no lower-casing and no punctuation removal; words are split on spaces only;
    * sentences are split on '.' and every reference sentence is compared with every prediction
      sentence; the overlap is the number of *distinct* words found in any of those LCSs, and the
      lengths are numbers of *distinct* words, so repeating words is never penalised;
    * F = 2PR / (P + R + 1e-8), hence a perfect match scores 0.99999999..., not 1;
    * an empty prediction or reference (nothing but periods included) raises in ``rouge`` and
      LongBench returns 0; so does a sentence pair too long for the recursion limit
      (``call_budget``, None = no limit).
    """
    hyp_sents = _pyrouge_sentences(prediction)
    ref_sents = _pyrouge_sentences(reference)
    if not hyp_sents or not ref_sents:
        return 0.0
    lcs_words: set[str] = set()
    for ref_words in ref_sents:
        for hyp_words in hyp_sents:
            words, calls = _lcs_backtrack(ref_words, hyp_words)
            if call_budget is not None and calls > call_budget:
                return 0.0
            lcs_words.update(words)
    ref_size = len({word for sent in ref_sents for word in sent})
    hyp_size = len({word for sent in hyp_sents for word in sent})
    recall = len(lcs_words) / ref_size
    precision = len(lcs_words) / hyp_size
    return 2.0 * ((precision * recall) / (precision + recall + 1e-8))


def longbench_rouge(prediction: str, references: list[str], **kwargs: Any) -> float:
    """ROUGE-L F as LongBench computes it with the ``rouge`` package, best over references.

    See :func:`_pyrouge_rouge_l_f` for the (many) ways this differs from textbook ROUGE-L and
    from Google's ``rouge-score``; notably a pair of '.'-free stretches about 990 words long
    makes the official code hit Python's recursion limit and score 0, which is reproduced.
    """
    return best(_pyrouge_rouge_l_f(prediction, ref, _ROUGE_RECON_CALL_BUDGET) for ref in references)


def longbench_rouge_zh(prediction: str, references: list[str], **kwargs: Any) -> float:
    """LongBench's Chinese ROUGE-L: jieba words joined by spaces, then :func:`longbench_rouge`'s score.

    Quirk: no punctuation is removed and sentences are still split on '.', which Chinese text
    rarely contains, so a whole answer is usually one long "sentence"; long summaries (vcsum)
    can therefore hit the recursion limit of the official code and score 0, which is reproduced.
    """
    joined = " ".join(_jieba_words(prediction))
    return best(
        _pyrouge_rouge_l_f(joined, " ".join(_jieba_words(ref)), _ROUGE_ZH_RECON_CALL_BUDGET) for ref in references
    )


def _classification_one(prediction: str, reference: str, all_classes: Sequence[str]) -> float:
    """LongBench ``classification_score`` for one reference.

    Classes appearing as substrings of the prediction are collected in ``all_classes`` order;
    those that are a strict substring of the reference are then dropped, and the score is
    1 / (number of remaining classes) if the reference is among them, else 0.
    Quirk: the official code removes items from the list it is iterating over, so the item right
    after each removed one is never examined (and may stay); ``list.remove`` also removes the first
    equal item, not necessarily the current one. Both are reproduced.
    """
    matches = [name for name in all_classes if name in prediction]
    position = 0
    while position < len(matches):
        name = matches[position]
        if name in reference and name != reference:
            matches.remove(name)
        position += 1
    return 1.0 / len(matches) if reference in matches else 0.0


def longbench_classification(prediction: str, references: list[str], **kwargs: Any) -> float:
    """LongBench classification accuracy (trec, lsht), best over references.

    Requires the keyword argument ``all_classes``: the list of every class label of the sample
    (LongBench's ``all_classes`` field). Substring matching is case-sensitive.
    """
    all_classes = _required_kwarg(kwargs, "all_classes", "classification", "the list of all class labels of the sample")
    return best(_classification_one(prediction, ref, all_classes) for ref in references)


def _share_equal_to(numbers: Sequence[str], target: str) -> float:
    """Fraction of ``numbers`` equal to ``target`` (0 when there are none)."""
    return 0.0 if not numbers else sum(number == target for number in numbers) / len(numbers)


def _passage_retrieval(prediction: str, references: list[str], label: str, metric: str) -> float:
    """Shared body of the retrieval metrics; ``label`` is the regex capturing the paragraph id."""
    numbers = _ANY_DIGITS.findall(prediction)
    scores = []
    for ref in references:
        found = re.findall(label, ref)
        if not found:
            raise ValueError(f"metric {metric!r}: reference {ref!r} does not name a paragraph")
        scores.append(_share_equal_to(numbers, found[0]))
    return best(scores)


def longbench_retrieval(prediction: str, references: list[str], **kwargs: Any) -> float:
    """passage_retrieval_en: share of the numbers in the prediction equal to the gold paragraph id.

    The id is the first ``Paragraph <n>`` in the reference. Quirk: every number in the prediction
    counts, so "Paragraph 3 (of 30)" scores 0.5 for gold 3; a prediction with no number scores 0.
    """
    return _passage_retrieval(prediction, references, r"Paragraph (\d+)", "retrieval")


def longbench_retrieval_zh(prediction: str, references: list[str], **kwargs: Any) -> float:
    """passage_retrieval_zh: as :func:`longbench_retrieval` with the id taken from ``段落<n>``."""
    return _passage_retrieval(prediction, references, r"段落(\d+)", "retrieval_zh")


def longbench_count(prediction: str, references: list[str], **kwargs: Any) -> float:
    """passage_count: share of the numbers in the prediction equal to the reference, best over references.

    Numbers are compared as digit strings, so "07" does not equal "7".
    """
    numbers = _ANY_DIGITS.findall(prediction)
    return best(_share_equal_to(numbers, ref) for ref in references)


def _first_code_line(prediction: str) -> str:
    """The first line (after leading newlines) that has no '`', '#' or '//'; '' if there is none."""
    for line in prediction.lstrip("\n").split("\n"):
        if "`" not in line and "#" not in line and "//" not in line:
            return line
    return ""


def _fuzzywuzzy_ratio(first: str, second: str) -> int:
    """``fuzzywuzzy.fuzz.ratio`` without python-Levenshtein: difflib similarity x100, rounded.

    Equal strings (both empty included) give 100, otherwise an empty side gives 0. Python's
    ``round`` rounds halves to even. difflib uses its default "autojunk" heuristic, which only
    kicks in when the second string has 200 characters or more.
    """
    if first == second:
        return 100
    if not first or not second:
        return 0
    return round(100 * difflib.SequenceMatcher(None, first, second).ratio())


def longbench_code_sim(prediction: str, references: list[str], **kwargs: Any) -> float:
    """LongBench edit similarity (lcc, repobench-p), best over references.

    Only the first prediction line without '`', '#' or '//' is compared (comments and markdown
    fences are skipped, so is any code line containing them), with fuzzywuzzy's ``ratio``
    divided by 100: multiples of 0.01. LongBench's requirements install fuzzywuzzy without
    python-Levenshtein, so the ratio is difflib's, not a Levenshtein one.
    """
    line = _first_code_line(prediction)
    return best(_fuzzywuzzy_ratio(line, ref) / 100 for ref in references)


# -------------------------------------------------------------------- LongBench-E's length buckets

LENGTH_BUCKETS: tuple[str, ...] = ("0-4k", "4-8k", "8k+")


def length_bucket(length: int) -> str:
    """The official LongBench-E bucket of a sample's ``length`` field."""
    if length < 4000:
        return "0-4k"
    if length < 8000:
        return "4-8k"
    return "8k+"


def bucket_scores(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per task and bucket the mean score (x100), and per bucket the mean over tasks (official ``scorer_e``)."""
    per_task: dict[str, dict[str, list[float]]] = {}
    for record in records:
        bucket = length_bucket(int(record["meta"]["length"]))
        per_task.setdefault(record["task"], {}).setdefault(bucket, []).append(float(record["score"]))
    tasks = {
        task: {b: 100 * statistics.fmean(buckets[b]) for b in LENGTH_BUCKETS if b in buckets}
        for task, buckets in per_task.items()
    }
    average = {
        b: statistics.fmean(scores[b] for scores in tasks.values() if b in scores)
        for b in LENGTH_BUCKETS
        if any(b in scores for scores in tasks.values())
    }
    return {"tasks": tasks, "average": average}


def format_buckets(buckets: dict[str, Any]) -> str:
    """The LongBench-E length-bucket table as plain text."""
    tasks = buckets["tasks"]
    width = max([len("average"), *(len(t) for t in tasks)])
    lines = [f"{'LongBench-E':<{width}}  " + "  ".join(f"{b:>6}" for b in LENGTH_BUCKETS)]
    rows = [*tasks.items(), ("average", buckets["average"])]
    for task, scores in rows:
        cells = "  ".join(f"{scores[b]:6.2f}" if b in scores else f"{'-':>6}" for b in LENGTH_BUCKETS)
        lines.append(f"{task:<{width}}  {cells}")
    return "\n".join(lines)


METRICS = {
    "qa_f1": longbench_qa_f1,
    "qa_f1_zh": longbench_qa_f1_zh,
    "rouge": longbench_rouge,
    "rouge_zh": longbench_rouge_zh,
    "classification": longbench_classification,
    "retrieval": longbench_retrieval,
    "retrieval_zh": longbench_retrieval_zh,
    "count": longbench_count,
    "code_sim": longbench_code_sim,
}
"""LongBench v1's metrics by the name a `Sample` carries (collected by `restkv.eval.benchmarks.contract.metrics`)."""
