"""Per-sample answer scoring for LongBench v1, RULER, Needle-in-a-Haystack and InfiniteBench.

Every metric is called as ``metric(prediction, references, **kwargs)`` and returns the score of
one sample in ``[0, 1]``. Each one reproduces the number the benchmark's official evaluation code
gives for that sample, quirks included; the quirks are spelled out in the docstrings ("Quirk:").
How several references are combined follows each benchmark:

* LongBench v1 (``eval.py``): best score over the references (starting from 0).
* RULER: ``string_match_all`` averages over the references, ``string_match_part`` takes the best.
* NIAH: a single needle; with several references the best one counts.
* InfiniteBench (``compute_scores.py``): task by task, see each ``infbench_*`` docstring; several
  tasks read only ``references[0]``, and the two multiple-choice tasks expect
  ``references == [answer_text, option_letter]``.

Use :func:`score` to look a metric up by its registered name, and apply
:func:`longbench_postprocess` to LongBench predictions before scoring them.
"""

from __future__ import annotations

import difflib
import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rouge_score.rouge_scorer import RougeScorer

__all__ = ["LONGBENCH_FIRST_LINE_TASKS", "LONGBENCH_TASKS", "METRICS", "Metric", "longbench_postprocess", "score"]


class Metric(Protocol):
    """A per-sample scorer: ``(prediction, references, **kwargs) -> float`` in ``[0, 1]``.

    Keyword arguments that a metric does not use are ignored (LongBench's own scorer hands
    ``all_classes`` to every metric in the same way).
    """

    def __call__(self, prediction: str, references: list[str], /, **kwargs: Any) -> float: ...


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------

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
_ANY_DIGITS = re.compile(r"\d+")  # Unicode digits, as LongBench's count/retrieval regexes
_ASCII_DIGITS = re.compile(r"[0-9]+")  # ASCII digits only, as InfiniteBench's re.split("[^0-9]")


def _strip_chars(text: str, chars: frozenset[str]) -> str:
    """Drop every character of ``text`` that is in ``chars``."""
    return "".join(ch for ch in text if ch not in chars)


def _normalize_en(text: str) -> str:
    """SQuAD-style normalisation: lower-case, drop ASCII punctuation, drop a/an/the, squeeze spaces.

    Punctuation is removed before the articles, so "the-end" becomes "theend" and keeps its
    "the"; the article pattern uses word boundaries, so "theory" is untouched.
    """
    text = _strip_chars(text.lower(), _EN_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _normalize_zh(text: str) -> str:
    """Chinese normalisation: lower-case, drop ASCII and Chinese punctuation, delete all whitespace.

    Whitespace is deleted rather than squeezed, so "New York" becomes "newyork".
    """
    return "".join(_strip_chars(text.lower(), _ZH_PUNCTUATION).split())


def _token_f1(prediction_tokens: Sequence[str], reference_tokens: Sequence[str]) -> float:
    """Bag-of-tokens F1 (multiset overlap); 0 when nothing overlaps or either side is empty."""
    overlap = sum((Counter(prediction_tokens) & Counter(reference_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = 1.0 * overlap / len(prediction_tokens)
    recall = 1.0 * overlap / len(reference_tokens)
    return (2 * precision * recall) / (precision + recall)


def _best(scores: Iterable[float]) -> float:
    """The best of ``scores``; 0.0 when there are none (LongBench's running maximum starts at 0)."""
    return max(scores, default=0.0)


def _jieba_words(text: str) -> list[str]:
    """jieba's precise-mode segmentation (``cut_all=False``), the mode LongBench uses."""
    import jieba  # imported on first use: only LongBench's Chinese tasks need it

    return list(jieba.cut(text, cut_all=False))


def _blank_out(text: str, pieces: Iterable[str]) -> str:
    """Replace every occurrence of each of ``pieces`` (characters or words), in order, by a space."""
    for piece in pieces:
        text = text.replace(piece, " ")
    return text


def _squeeze_double_spaces(text: str) -> str:
    """Collapse runs of plain spaces (not other whitespace) to one space."""
    while "  " in text:
        text = text.replace("  ", " ")
    return text


def _required_kwarg(kwargs: dict[str, Any], name: str, metric: str, meaning: str) -> Any:
    """Return ``kwargs[name]``, or raise ``TypeError`` naming it (and saying what it is) when absent or None."""
    value = kwargs.get(name)
    if value is None:
        raise TypeError(f"metric {metric!r} requires the keyword argument {name!r} ({meaning})")
    return value


def _int_reference(reference: str, metric: str) -> int:
    """Parse an integer reference, raising ``ValueError`` that names the metric if it is not one."""
    try:
        return int(reference)
    except ValueError:
        raise ValueError(f"metric {metric!r} expects integer references, got {reference!r}") from None


# --------------------------------------------------------------------------------------------
# LongBench v1
# --------------------------------------------------------------------------------------------

LONGBENCH_TASKS: frozenset[str] = frozenset(
    {
        "narrativeqa", "qasper", "multifieldqa_en", "multifieldqa_zh", "hotpotqa", "2wikimqa",
        "musique", "dureader", "gov_report", "qmsum", "multi_news", "vcsum", "trec", "triviaqa",
        "samsum", "lsht", "passage_retrieval_en", "passage_count", "passage_retrieval_zh", "lcc",
        "repobench-p",
    }
)  # fmt: skip
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


def _qa_f1_one(prediction: str, reference: str) -> float:
    """English token F1 after :func:`_normalize_en`."""
    return _token_f1(_normalize_en(prediction).split(), _normalize_en(reference).split())


def _qa_f1_zh_one(prediction: str, reference: str) -> float:
    """Chinese token F1 over jieba words, each normalised, empty words dropped."""

    def tokens(text: str) -> list[str]:
        return [word for word in map(_normalize_zh, _jieba_words(text)) if word]

    return _token_f1(tokens(prediction), tokens(reference))


def longbench_qa_f1(prediction: str, references: list[str], **kwargs: Any) -> float:
    """Token F1 on normalised English text (LongBench ``qa_f1_score``), best over references.

    Normalisation: lower-case, remove ASCII punctuation, remove the articles a/an/the, squeeze
    whitespace; tokens are whitespace-separated words.
    """
    return _best(_qa_f1_one(prediction, ref) for ref in references)


def longbench_qa_f1_zh(prediction: str, references: list[str], **kwargs: Any) -> float:
    """Token F1 over jieba words (LongBench ``qa_f1_zh_score``), best over references.

    Each jieba word is lower-cased and stripped of ASCII/Chinese punctuation and whitespace;
    words that end up empty are dropped.
    """
    return _best(_qa_f1_zh_one(prediction, ref) for ref in references)


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
    return _best(_pyrouge_rouge_l_f(prediction, ref, _ROUGE_RECON_CALL_BUDGET) for ref in references)


def longbench_rouge_zh(prediction: str, references: list[str], **kwargs: Any) -> float:
    """LongBench's Chinese ROUGE-L: jieba words joined by spaces, then :func:`longbench_rouge`'s score.

    Quirk: no punctuation is removed and sentences are still split on '.', which Chinese text
    rarely contains, so a whole answer is usually one long "sentence"; long summaries (vcsum)
    can therefore hit the recursion limit of the official code and score 0, which is reproduced.
    """
    joined = " ".join(_jieba_words(prediction))
    return _best(
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
    return _best(_classification_one(prediction, ref, all_classes) for ref in references)


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
    return _best(scores)


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
    return _best(_share_equal_to(numbers, ref) for ref in references)


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
    return _best(_fuzzywuzzy_ratio(line, ref) / 100 for ref in references)


# --------------------------------------------------------------------------------------------
# RULER
# --------------------------------------------------------------------------------------------

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
    return _best(_ruler_hits(prediction, references))


# --------------------------------------------------------------------------------------------
# Needle in a haystack
# --------------------------------------------------------------------------------------------


@cache
def _rouge_scorer(rouge_type: str, use_stemmer: bool) -> RougeScorer:
    """A cached ``rouge-score`` scorer for one ROUGE type (the package is imported on first use)."""
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer([rouge_type], use_stemmer=use_stemmer)


def niah_rouge(prediction: str, references: list[str], **kwargs: Any) -> float:
    """ROUGE-1 F (rouge-score, Porter stemming) of the needle against the response, best over references.

    The LLMTest_NeedleInAHaystack-style scripts report this x10 (0-10 heat maps); this returns
    the 0-1 value. rouge-score lower-cases and keeps only [a-z0-9] tokens, so non-Latin needles
    score 0.
    """
    scorer = _rouge_scorer("rouge1", True)
    return _best(scorer.score(ref, prediction)["rouge1"].fmeasure for ref in references)


# --------------------------------------------------------------------------------------------
# InfiniteBench
# --------------------------------------------------------------------------------------------

_RETRIEVAL_SEPARATORS = ("\n", ":", '"', "'", ".", ",", "?", "!", "{", "}")
_CODE_RUN_SEPARATORS = ("\n", ".", "`", "'", '"', ":")
_CHOICE_SEPARATORS = ("\n", '"', "'", ".", ",", "?", "!", "{", "}")
_CODE_DEBUG_SEPARATORS = ("\n", "`", "'", '"', "-", "*", "Option", "option")
_CHOICE_PREFIXES = ("answer is:", "answer:", "answer is", "option is")
_CODE_DEBUG_PREFIXES = ("answer is:", "is:", "answer:", "correct option is:")
_FIRST_NUMBER = re.compile(r"\d+\.\d+|\d+")


def _first_ascii_integer(prediction: str) -> str:
    """The first run of ASCII digits in the prediction, '' if there is none."""
    found = _ASCII_DIGITS.search(prediction)
    return found.group(0) if found else ""


def _text_after_prefix(text: str, prefixes: Sequence[str]) -> tuple[bool, str | None]:
    """Find the answer after the first of ``prefixes`` (in list order) occurring in ``text``.

    Returns ``(found, rest)``: ``found`` says whether any prefix occurs; ``rest`` is the text after
    its first occurrence with one more character skipped (meant to be the space), or None when
    nothing follows the prefix. Quirks: the prefix list order wins over the position in the
    text, and the search is case-sensitive.
    """
    for prefix in prefixes:
        index = text.find(prefix)
        if index == -1:
            continue
        start = index + len(prefix) + 1
        return True, (text[start:] if len(text) >= start else None)
    return False, None


def infbench_passkey(prediction: str, references: list[str], **kwargs: Any) -> float:
    """1 if the first ASCII digit run of the prediction equals ``references[0]`` (string compare).

    Quirk: only the first reference is used and any earlier number wins, e.g. "In 2024 the key is
    123" answers "2024".
    """
    return float(_first_ascii_integer(prediction) == references[0])


def infbench_number_string(prediction: str, references: list[str], **kwargs: Any) -> float:
    """Same rule as :func:`infbench_passkey` (first ASCII digit run equals ``references[0]``)."""
    return infbench_passkey(prediction, references)


def infbench_kv_retrieval(prediction: str, references: list[str], **kwargs: Any) -> float:
    """1 if ``references[0]`` (the value) is one of the prediction's words, else 0.

    Words are split on whitespace after turning newline : " ' . , ? ! { } into spaces; '-' is
    kept, so UUID values stay whole. The official label is a single string; only the first
    reference is read.
    """
    return float(references[0] in _blank_out(prediction, _RETRIEVAL_SEPARATORS).split())


def infbench_longbook_sum_eng(prediction: str, references: list[str], **kwargs: Any) -> float:
    """ROUGE-Lsum F (rouge-score, no stemming), best over references (HF ``evaluate`` "rouge").

    Summary-level LCS with sentences split on newlines only; rouge-score lower-cases and keeps
    [a-z0-9] tokens.
    """
    scorer = _rouge_scorer("rougeLsum", False)
    return _best(scorer.score(ref, prediction)["rougeLsum"].fmeasure for ref in references)


def infbench_longbook_choice_eng(prediction: str, references: list[str], **kwargs: Any) -> float:
    """Multiple choice on a book; ``references`` is ``[answer_text, option_letter]``.

    Official parsing, in order: (1) if the stripped prediction starts with A/B/C/D, that letter
    alone decides; (2) a prediction equal to a reference is right; (3) after turning newline
    " ' . , ? ! { } into spaces, the text after the first of "answer is:", "answer:", "answer is",
    "option is" found decides (must start with a reference); (4) else the first word that is a
    substring of "ABCD" decides. Quirks: (1) also fires on ordinary words ("Based on..." answers
    B, "After..." answers A); in (4) a word such as "AB" also counts as a letter and then fails.
    """
    text = prediction.strip()
    if not text:
        return 0.0
    if text[0] in "ABCD":
        return float(text[0] in references)
    if text in references:
        return 1.0
    text = _squeeze_double_spaces(_blank_out(text, _CHOICE_SEPARATORS))
    found, rest = _text_after_prefix(text, _CHOICE_PREFIXES)
    if found:
        return float(rest is not None and any(rest.startswith(ref) for ref in references))
    for word in text.split():
        if word in "ABCD":
            return float(word in references)
    return 0.0


def infbench_longbook_qa_eng(prediction: str, references: list[str], **kwargs: Any) -> float:
    """English QA F1 on a book: the same normalised token F1 as LongBench ``qa_f1``, best over references."""
    return longbench_qa_f1(prediction, references)


def infbench_longbook_qa_chn(prediction: str, references: list[str], **kwargs: Any) -> float:
    """Chinese QA F1 over characters, best over references.

    Unlike LongBench's ``qa_f1_zh`` there is no jieba: each whole text is normalised (lower-case,
    ASCII/Chinese punctuation and all whitespace removed) and every remaining character is a
    token, Latin letters included.
    """
    return _best(_token_f1(list(_normalize_zh(prediction)), list(_normalize_zh(ref))) for ref in references)


def infbench_longdialogue_qa_eng(prediction: str, references: list[str], **kwargs: Any) -> float:
    """1 if ``references[0]`` is one of the upper-cased words of the prediction, else 0.

    Words are split as in :func:`infbench_kv_retrieval`, then upper-cased. Quirks: only the
    first reference is checked (the other name variants are ignored), the reference itself is
    not upper-cased, and a multi-word reference ("ACE ROTHSTEIN") can never match one word.
    """
    words = [word.upper() for word in _blank_out(prediction.strip(), _RETRIEVAL_SEPARATORS).split()]
    return float(references[0] in words)


def _number_reference(reference: str, metric: str) -> int | float:
    """Parse a reference as int when it is an integer literal, else as float (the type matters)."""
    try:
        return int(reference)
    except ValueError:
        pass
    try:
        return float(reference)
    except ValueError:
        raise ValueError(f"metric {metric!r} expects a numeric reference, got {reference!r}") from None


def infbench_math_find(prediction: str, references: list[str], **kwargs: Any) -> float:
    """1 if the first number (``\\d+\\.\\d+`` or ``\\d+``) in the prediction equals ``references[0]``.

    ``references[0]`` must be ``str`` of the official JSON value: an integer literal (e.g. "42")
    is compared as int, anything else (e.g. "49.5", "50.0") as float. Signs are ignored, so "-5"
    reads as 5. Quirk: for an integer answer whose first number in the prediction is a decimal,
    the official scorer crashes (``int("3.5")``); here that counts as wrong (0).
    """
    expected = _number_reference(references[0], "infbench_math_find")
    found = _FIRST_NUMBER.search(prediction)
    if found is None:
        return 0.0
    number = found.group(0)
    if isinstance(expected, int):
        return float("." not in number and int(number) == expected)
    return float(float(number) == expected)


def infbench_math_calc(prediction: str, references: list[str], **kwargs: Any) -> float:
    """Share of the expected value sequence the prediction gets right before its first mistake.

    ``references`` is the expected sequence, one integer per item (InfiniteBench's answer list,
    each value passed through ``str``). The prediction's numbers are its ASCII digit runs, in
    order; the score is the length of the matching prefix divided by the length of
    ``references``. Quirks: minus signs are dropped from the prediction (a negative expected
    value can never match), and a missing or wrong first value scores 0 however good the rest is.
    The official "gpt4" special case (dropping the first predicted number) is not applied.
    """
    expected = [_int_reference(ref, "infbench_math_calc") for ref in references]
    predicted = [int(run) for run in _ASCII_DIGITS.findall(prediction)]
    correct = 0
    for want, got in zip(expected, predicted, strict=False):
        if want != got:
            break
        correct += 1
    return correct / len(expected) if expected else 0.0


def infbench_code_run(prediction: str, references: list[str], **kwargs: Any) -> float:
    """1 if the last word of the prediction parses (Python ``int``) to the integer ``references[0]``.

    Words are split after turning newline . ` ' " : into spaces. Quirk: only the last word
    counts, so "The answer is 7, I think" scores 0.
    """
    expected = _int_reference(references[0], "infbench_code_run")
    words = _blank_out(prediction.strip(), _CODE_RUN_SEPARATORS).split()
    if not words:
        return 0.0
    try:
        return float(int(words[-1]) == expected)
    except ValueError:
        return 0.0


def infbench_code_debug(prediction: str, references: list[str], **kwargs: Any) -> float:
    """Which function has the bug; ``references`` is ``[function_name, option_letter]``.

    Official parsing: (1) a stripped prediction starting with "<letter>." or "<letter>:" is right;
    (2) otherwise, after turning newline ` ' " - * "Option" "option" into spaces and squeezing
    spaces, the text after the first of "answer is:", "is:", "answer:", "correct option is:"
    found must start with the letter or the function name; (3) anything else is wrong.
    Quirks: (2) is a plain prefix test, so "B" also accepts "Because..."; a bare "B" or
    "The answer is B" (no colon) scores 0.
    """
    if len(references) < 2:
        raise ValueError("metric 'infbench_code_debug' expects references [function_name, option_letter]")
    function_name, letter = references[0], references[1]
    text = prediction.strip()
    if text[:2] in (f"{letter}.", f"{letter}:"):
        return 1.0
    text = _squeeze_double_spaces(_blank_out(text, _CODE_DEBUG_SEPARATORS))
    _, rest = _text_after_prefix(text, _CODE_DEBUG_PREFIXES)
    if rest is None:
        return 0.0
    return float(rest.startswith(letter) or rest.startswith(function_name))


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

METRICS: dict[str, Metric] = {
    # LongBench v1
    "qa_f1": longbench_qa_f1,
    "qa_f1_zh": longbench_qa_f1_zh,
    "rouge": longbench_rouge,
    "rouge_zh": longbench_rouge_zh,
    "classification": longbench_classification,
    "retrieval": longbench_retrieval,
    "retrieval_zh": longbench_retrieval_zh,
    "count": longbench_count,
    "code_sim": longbench_code_sim,
    # RULER
    "string_match_all": ruler_string_match_all,
    "string_match_part": ruler_string_match_part,
    # Needle in a haystack
    "niah_rouge": niah_rouge,
    # InfiniteBench
    "infbench_passkey": infbench_passkey,
    "infbench_number_string": infbench_number_string,
    "infbench_kv_retrieval": infbench_kv_retrieval,
    "infbench_longbook_sum_eng": infbench_longbook_sum_eng,
    "infbench_longbook_choice_eng": infbench_longbook_choice_eng,
    "infbench_longbook_qa_eng": infbench_longbook_qa_eng,
    "infbench_longbook_qa_chn": infbench_longbook_qa_chn,
    "infbench_longdialogue_qa_eng": infbench_longdialogue_qa_eng,
    "infbench_math_find": infbench_math_find,
    "infbench_math_calc": infbench_math_calc,
    "infbench_code_run": infbench_code_run,
    "infbench_code_debug": infbench_code_debug,
}


def score(metric: str, prediction: str, references: list[str], **kwargs: Any) -> float:
    """Score one prediction with the registered metric ``metric``; returns a value in [0, 1].

    Keyword arguments are passed to the metric; the only required one today is
    ``all_classes`` (list of the sample's class labels) for ``classification``. Raises
    ``ValueError`` for an unknown metric (listing the valid names) or an empty reference list,
    and ``TypeError`` when a required keyword argument is missing.
    """
    scorer = METRICS.get(metric)
    if scorer is None:
        raise ValueError(f"unknown metric {metric!r}; valid metrics are: {', '.join(sorted(METRICS))}")
    if not references:
        raise ValueError(f"metric {metric!r} needs at least one reference")
    return float(scorer(prediction, references, **kwargs))
