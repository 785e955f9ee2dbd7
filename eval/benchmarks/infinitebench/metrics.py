"""InfiniteBench's per-sample scorers (the official ``src/compute_scores.py``), one per task.

Every scorer is called as ``metric(prediction, references, **kwargs)`` and returns the score of
one sample in ``[0, 1]``; each reproduces the official number for that sample, quirks included
("Quirk:" in the docstrings). How the references are read is task by task: several scorers read
only ``references[0]``, and the two multiple-choice tasks expect
``references == [answer_text, option_letter]`` (built by
:func:`restkv.eval.benchmarks.infinitebench.benchmark.references`).
The registry of metric names is :mod:`restkv.eval.benchmarks.contract.metrics`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from restkv.eval.benchmarks.shared.text_metrics import best, english_token_f1, normalize_zh, rouge_scorer, token_f1

__all__ = [
    "METRICS",
    "infbench_code_debug",
    "infbench_code_run",
    "infbench_kv_retrieval",
    "infbench_longbook_choice_eng",
    "infbench_longbook_qa_chn",
    "infbench_longbook_qa_eng",
    "infbench_longbook_sum_eng",
    "infbench_longdialogue_qa_eng",
    "infbench_math_calc",
    "infbench_math_find",
    "infbench_number_string",
    "infbench_passkey",
]

_ASCII_DIGITS = re.compile(r"[0-9]+")  # ASCII digits only, as InfiniteBench's re.split("[^0-9]")
_RETRIEVAL_SEPARATORS = ("\n", ":", '"', "'", ".", ",", "?", "!", "{", "}")
_CODE_RUN_SEPARATORS = ("\n", ".", "`", "'", '"', ":")
_CHOICE_SEPARATORS = ("\n", '"', "'", ".", ",", "?", "!", "{", "}")
_CODE_DEBUG_SEPARATORS = ("\n", "`", "'", '"', "-", "*", "Option", "option")
_CHOICE_PREFIXES = ("answer is:", "answer:", "answer is", "option is")
_CODE_DEBUG_PREFIXES = ("answer is:", "is:", "answer:", "correct option is:")
_FIRST_NUMBER = re.compile(r"\d+\.\d+|\d+")


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


def _int_reference(reference: str, metric: str) -> int:
    """Parse an integer reference, raising ``ValueError`` that names the metric if it is not one."""
    try:
        return int(reference)
    except ValueError:
        raise ValueError(f"metric {metric!r} expects integer references, got {reference!r}") from None


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
    scorer = rouge_scorer("rougeLsum", False)
    return best(scorer.score(ref, prediction)["rougeLsum"].fmeasure for ref in references)


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
    return best(english_token_f1(prediction, ref) for ref in references)


def infbench_longbook_qa_chn(prediction: str, references: list[str], **kwargs: Any) -> float:
    """Chinese QA F1 over characters, best over references.

    Unlike LongBench's ``qa_f1_zh`` there is no jieba: each whole text is normalised (lower-case,
    ASCII/Chinese punctuation and all whitespace removed) and every remaining character is a
    token, Latin letters included.
    """
    return best(token_f1(list(normalize_zh(prediction)), list(normalize_zh(ref))) for ref in references)


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


METRICS = {
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
"""InfiniteBench's metrics by the name a `Sample` carries (collected by `restkv.eval.benchmarks.contract.metrics`)."""
