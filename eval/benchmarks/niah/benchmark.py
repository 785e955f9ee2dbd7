"""Needle-in-a-Haystack, as run for the ReST-KV paper.

The paper's script (adapted from the "Long-Context Data Engineering" version of Greg Kamradt's
test) hides one fixed sentence, the *needle*, in a haystack of essays trimmed to a target length,
at a target depth, and asks for it back. This module re-implements that procedure:

* needle ``"\\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on
  a sunny day.\\n"``, retrieval question ``"The best thing to do in San Francisco is: "``;
* haystack: the Paul Graham essays folder when given, the bundled evaluation novel otherwise
  (:func:`restkv.eval.benchmarks.shared.haystack.load_haystack`), repeated if it is shorter than the longest
  requested length;
* for a context length ``L`` the haystack is cut to ``L - 200 - len(needle)`` tokens (the
  authors keep a 200-token buffer for the instructions and the answer) and the needle tokens are
  inserted at ``depth_percent`` of it, moved back to just after the closest preceding
  sentence-ending token (a token whose text ends in a period, closing quotes aside); at 100 % the
  needle is appended. Everything happens in the tokenizer's token space, then decoded;
* grid: the authors sweep lengths ``1000, 1200, ..., 32000`` and ten linearly spaced depths
  ``0, 11, 22, ..., 100`` (:func:`context_length_grid`, :func:`depth_percent_grid`);
* answers are limited to 30 new tokens and scored against the needle with ROUGE
  (metric ``niah_rouge``).

Prompt formats. ``"chat"`` (default) is the authors' chat-model prompt: a system message
(``Sample.system_prompt``), the document as the user's message, then the question followed by
"Don't give information outside the document or repeat your findings. ..."; here
``context`` is the document and ``question`` is ``"\\n\\n"`` plus that second user message, for
the runner's chat template. ``"book"`` is the raw-text prompt that the authors' script actually
builds for the Llama-3 and Mistral models it evaluates ("This is a very long story book: <book>
... </book>. Based on the content of the book, Question: ... Answer:"), with no chat template.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from restkv.checks import check_choice
from restkv.eval.benchmarks.contract.base import Sample
from restkv.eval.benchmarks.contract.metrics import score as score_metric
from restkv.eval.benchmarks.niah.heatmap import grid_report
from restkv.eval.benchmarks.shared.haystack import check_haystack, haystack_name, load_haystack

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

NEEDLE = "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n"
RETRIEVAL_QUESTION = "The best thing to do in San Francisco is: "
SYSTEM_PROMPT = "You are a helpful AI bot that answers questions for a user. Keep your response short and direct"
INSTRUCTION = (
    "Don't give information outside the document or repeat your findings. The document definitely "
    "contains the answer, and I'm 100% sure. So try your best to find it."
)
BOOK_PREFIX = "<|im_start|> This is a very long story book: <book> "
BOOK_SUFFIX = " </book>."
BOOK_QUESTION = "\n Based on the content of the book, Question: "
BOOK_ANSWER_PREFIX = "\nAnswer:"

FINAL_CONTEXT_LENGTH_BUFFER = 200
"""Tokens of each context length left for the instructions, the question and the answer."""
MAX_NEW_TOKENS = 30
METRIC = "niah_rouge"

PromptFormat = Literal["chat", "book"]
PROMPT_FORMATS: tuple[str, ...] = ("chat", "book")


def context_length_grid(min_length: int = 1000, max_length: int = 32001, step: int = 200) -> list[int]:
    """The authors' length sweep: ``min_length, min_length + step, ...`` up to ``max_length``."""
    return list(range(min_length, max_length + 1, step))


def depth_percent_grid(minimum: float = 0, maximum: float = 100, intervals: int = 10) -> list[float]:
    """``intervals`` linearly spaced depths from ``minimum`` to ``maximum``, rounded to integers."""
    if intervals == 1:
        return [float(round(minimum))]
    step = (maximum - minimum) / (intervals - 1)
    return [float(round(minimum + i * step)) for i in range(intervals)]


def _encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def _haystack_tokens(tokenizer: PreTrainedTokenizerBase, text: str, needed: int) -> list[int]:
    """At least ``needed`` tokens of ``text`` (repeated as often as necessary)."""
    if not text.strip():
        raise ValueError("the haystack is empty")
    margin = 64  # keep the cut well away from the end of the encoded prefix
    chars = min(len(text), 6 * (needed + margin) + 1024)
    source = text
    while True:
        ids = _encode(tokenizer, source[:chars])
        if len(ids) >= needed + margin or (chars >= len(source) and len(ids) >= needed):
            return ids
        if chars >= len(source):
            source = source + ("" if source[-1].isspace() else "\n") + text
        chars = min(len(source), 2 * chars)


class _SentenceEnds:
    """Whether a token ends a sentence (its text, without trailing quotes, ends in a period)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[int, bool] = {}

    def __call__(self, token_id: int) -> bool:
        if token_id not in self.cache:
            text = self.tokenizer.decode([token_id], skip_special_tokens=True)
            self.cache[token_id] = text.strip().rstrip("\"'”’)]").endswith(".")
        return self.cache[token_id]


def _insert(tokens: list[int], needle: list[int], depth_percent: float, ends: _SentenceEnds) -> tuple[list[int], int]:
    if depth_percent >= 100:
        return tokens + needle, len(tokens)
    point = int(len(tokens) * depth_percent / 100)
    while point > 0 and not ends(tokens[point - 1]):
        point -= 1
    return tokens[:point] + needle + tokens[point:], point


@dataclass(frozen=True)
class _PromptParts:
    """What surrounds the document in one prompt format: ``prefix + document + suffix`` is the context."""

    question: str
    answer_prefix: str = ""
    prefix: str = ""
    suffix: str = ""
    system_prompt: str = ""
    chat_template: bool = False


def _prompt_parts(prompt_format: PromptFormat) -> _PromptParts:
    """The question, answer cue and document wrapper of ``prompt_format`` (see the module docstring)."""
    if prompt_format == "chat":
        question = "\n\n" + f"{RETRIEVAL_QUESTION} {INSTRUCTION}"
        return _PromptParts(question, system_prompt=SYSTEM_PROMPT, chat_template=True)
    return _PromptParts(BOOK_QUESTION + RETRIEVAL_QUESTION, BOOK_ANSWER_PREFIX, BOOK_PREFIX, BOOK_SUFFIX)


def _check_grid(context_lengths: Sequence[int], depth_percents: Sequence[float], needle_tokens: int) -> None:
    """Raise ``ValueError`` for a depth outside [0, 100] or a length with no room for the buffer and needle."""
    for depth in depth_percents:
        if not 0 <= depth <= 100:
            raise ValueError(f"depth percent {depth} is outside [0, 100]")
    smallest = FINAL_CONTEXT_LENGTH_BUFFER + needle_tokens
    for length in context_lengths:
        if length <= smallest:
            raise ValueError(f"context length {length} is too short: it must exceed {smallest} tokens")


def _sample(
    tokenizer: PreTrainedTokenizerBase,
    parts: _PromptParts,
    document: list[int],
    with_needle: list[int],
    *,
    point: int,
    length: int,
    depth: float,
    labels: dict[str, Any],
) -> Sample:
    """The sample of one grid cell: ``with_needle`` (``document`` with the needle at token ``point``) decoded.

    ``labels`` are the metadata every cell shares (haystack name, prompt format).
    """
    context = parts.prefix + tokenizer.decode(with_needle, skip_special_tokens=True) + parts.suffix
    meta = {
        "benchmark": "niah",
        "context_length": int(length),
        "depth_percent": float(depth),
        **labels,
        "prompt_tokens": len(_encode(tokenizer, context + parts.question + parts.answer_prefix)),
        "context_tokens": len(with_needle),
        "needle_token": point,
        "needle_position": point / max(len(document), 1),
    }
    return Sample(
        id=f"niah/{length}/{depth:g}",
        task="niah",
        context=context,
        question=parts.question,
        answer_prefix=parts.answer_prefix,
        references=[NEEDLE.strip()],
        max_new_tokens=MAX_NEW_TOKENS,
        metric=METRIC,
        system_prompt=parts.system_prompt,
        chat_template=parts.chat_template,
        meta=meta,
    )


def generate(
    tokenizer: PreTrainedTokenizerBase,
    context_lengths: Sequence[int],
    depth_percents: Sequence[float],
    haystack: str | Path | None = None,
    *,
    prompt_format: PromptFormat = "chat",
) -> list[Sample]:
    """One sample per (context length, depth percent), lengths outermost.

    ``haystack`` is a :func:`~restkv.eval.benchmarks.shared.haystack.load_haystack` source (``None``: the
    bundled evaluation novel). ``meta`` holds ``context_length``, ``depth_percent``, the
    haystack name, ``prompt_tokens`` (context + question + answer prefix, no special tokens),
    ``context_tokens`` and the needle's token offset in the document (``needle_token``,
    ``needle_position`` as a fraction).
    """
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"prompt_format must be 'chat' or 'book', not {prompt_format!r}")
    if not context_lengths or not depth_percents:
        return []
    needle_ids = _encode(tokenizer, NEEDLE)
    _check_grid(context_lengths, depth_percents, len(needle_ids))
    room = FINAL_CONTEXT_LENGTH_BUFFER + len(needle_ids)  # tokens of each length not taken by the haystack
    tokens = _haystack_tokens(tokenizer, load_haystack(haystack), max(context_lengths) - room)
    ends = _SentenceEnds(tokenizer)
    parts = _prompt_parts(prompt_format)
    labels = {"haystack": haystack_name(haystack), "prompt_format": prompt_format}
    samples: list[Sample] = []
    for length in context_lengths:
        document = tokens[: length - room]
        for depth in depth_percents:
            with_needle, point = _insert(document, needle_ids, depth, ends)
            samples.append(
                _sample(tokenizer, parts, document, with_needle, point=point, length=length, depth=depth, labels=labels)
            )
    return samples


# --------------------------------------------------------------------------------------------
# The benchmark the runner instantiates (configs/bench/niah.yaml)
# --------------------------------------------------------------------------------------------


@dataclass
class NiahBenchmark:
    """The needle grid (context lengths x depths); writes ``heatmap.png`` into the run folder."""

    lengths: list[int] = field(default_factory=lambda: context_length_grid())
    depths: list[float] = field(default_factory=lambda: depth_percent_grid())
    haystack: str | None = None
    prompt_format: str = "book"
    name: str = "niah"

    def __post_init__(self) -> None:
        check_choice("bench", "prompt_format", self.prompt_format, PROMPT_FORMATS)
        check_haystack(self.haystack)

    def load_samples(self, tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
        return generate(tokenizer, self.lengths, self.depths, self.haystack, prompt_format=self.prompt_format)  # type: ignore[arg-type]

    def score(self, sample: Sample, prediction: str) -> float:
        return score_metric(sample.metric, prediction, sample.references)

    def report(self, records: list[dict[str, Any]], folder: Path) -> dict[str, Any]:
        return grid_report(records, folder, "Needle in a Haystack")
