"""RULER's prompt templates, answer prefixes, generation lengths and metrics, per task family.

Reproduced from the official generator's ``scripts/data/synthetic/constants.py`` (text is data:
changing a character changes what the model reads). ``QUESTION_MARKERS`` locate the question inside a
prompt made elsewhere (an official RULER file), where context and question arrive as one string.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """How one family of RULER tasks is asked, answered and scored."""

    template: str
    answer_prefix: str
    max_new_tokens: int
    metric: str


FAMILIES: dict[str, Family] = {
    "niah": Family(
        template=(
            "Some special magic {type_needle_v} are hidden within the following text. Make sure to "
            "memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are "
            "all the special magic {type_needle_v} for {query} mentioned in the provided text?"
        ),
        answer_prefix=" The special magic {type_needle_v} for {query} mentioned in the provided text are",
        max_new_tokens=128,
        metric="string_match_all",
    ),
    "variable_tracking": Family(
        template=(
            "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
            "{context}\nQuestion: Find all variables that are assigned the value {query} in the text "
            "above."
        ),
        answer_prefix=(
            " Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
            "variables are assigned the value {query}, they are: "
        ),
        max_new_tokens=30,
        metric="string_match_all",
    ),
    "common_words_extraction": Family(
        template=(
            "Below is a numbered list of words. In these words, some appear more often than others. "
            "Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most "
            "common words in the above list?"
        ),
        answer_prefix=" Answer: The top 10 words that appear most often in the list are:",
        max_new_tokens=120,
        metric="string_match_all",
    ),
    "freq_words_extraction": Family(
        template=(
            "Read the following coded text and track the frequency of each coded word. Find the three "
            "most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. "
            "Please ignore the dots '....'. What are the three most frequently appeared words in the "
            "above coded text?"
        ),
        answer_prefix=" Answer: According to the coded text above, the three most frequently appeared words are:",
        max_new_tokens=50,
        metric="string_match_all",
    ),
    "qa": Family(
        template=(
            "Answer the question based on the given documents. Only give me the answer and do not "
            "output any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the "
            "question based on the given documents. Only give me the answer and do not output any "
            "other words.\n\nQuestion: {query}"
        ),
        answer_prefix=" Answer:",
        max_new_tokens=32,
        metric="string_match_part",
    ),
}

QUESTION_MARKERS: dict[str, tuple[str, ...]] = {
    "niah": ("What are all the special magic", "What is the special magic"),
    "variable_tracking": ("Question: Find all variables that are assigned the value",),
    "common_words_extraction": ("Question: What are the 10 most common words",),
    "freq_words_extraction": ("Question: Do not provide any explanation.",),
    "qa": (
        "Answer the question based on the given documents. Only give me the answer and do not output any other words.",
    ),
}
"""Text that starts each family's question; the last occurrence in a prompt is the question (cwe's
in-context example and qa's preamble repeat it earlier)."""

NOISE_SENTENCE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE_TEMPLATE = "One of the special magic {type_needle_v} for {key} is: {value}."
DOCUMENT_TEMPLATE = "Document {i}:\n{document}"


def split_template(template: str) -> tuple[str, str]:
    """The template's text before and after ``{context}``: the preamble and the question."""
    head, tail = template.split("{context}")
    return head, tail


def split_prompt(prompt: str, family: str) -> tuple[str, str] | None:
    """``prompt`` cut where its question starts (the whitespace before the question goes with it).

    ``None`` when no marker of ``family`` occurs.
    """
    at = max(prompt.rfind(marker) for marker in QUESTION_MARKERS[family])
    if at <= 0:
        return None
    while at > 0 and prompt[at - 1] in " \n\t":
        at -= 1
    return prompt[:at], prompt[at:]
