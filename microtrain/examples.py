"""Token sequences for training and held-out monitoring: a prompt, its answer, and which tokens are supervised.

Every example depends on (task, length, seed) alone, so a resumed run, a batch worker and the
training process all make the same ones. The loss covers the answer tokens only (and EOS).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from restkv.eval.benchmarks import ruler
from restkv.eval.benchmarks.contract.sample import Sample
from restkv.eval.benchmarks.shared.haystack import TRAIN_HAYSTACK, load_haystack
from restkv.eval.evaluation.prompting import tokenize
from restkv.microtrain.config import HELDOUT_SEED_BASE
from restkv.microtrain.samples import essay_window, fitted_sample, make_sample, target_text


@dataclass
class Example:
    """One training or held-out sequence: ids, and the positions whose next token is supervised."""

    task: str
    ids: list[int]
    answer_start: int  # ids[answer_start:] is the answer (EOS included) predicted from the previous position
    earlier_answers: list[tuple[int, int]] = field(default_factory=list)  # more supervised [start, stop) spans

    @property
    def answer_len(self) -> int:
        """Tokens of the final answer, EOS included."""
        return len(self.ids) - self.answer_start


def encode(sample: Sample, tokenizer: PreTrainedTokenizerBase) -> Example:
    """The sample tokenized exactly as the evaluation tokenizes it, followed by the target and EOS."""
    prompt = tokenize(sample, tokenizer, chat=False, max_context=10**9)
    answer = tokenizer(target_text(sample), add_special_tokens=False)["input_ids"]
    ids = prompt.context + prompt.query + answer + [tokenizer.eos_token_id]
    return Example(sample.task, ids, prompt.length)


NEEDLE_PATTERN = re.compile(r"One of the special magic (?:numbers|uuids) for ([\w-]+) is: ([\w-]+)\.")
DENSE_HAYSTACKS = (
    ("needle", "words", "numbers"),
    ("needle", "uuids", "uuids"),
    ("essay", "words", "numbers"),
    ("noise", "words", "numbers"),
)
DENSE_QUESTIONS = 6


def _dense_keys_prompt(
    tokenizer: PreTrainedTokenizerBase, prompt_tokens: int, seed: int, essay: ruler.Essay, rng: random.Random
) -> Sample | None:
    """The RULER multi-key needle prompt a dense-keys example starts from (None if it cannot fit)."""
    haystack, key_type, value_type = rng.choice(DENSE_HAYSTACKS)
    keys = {"needle": 1, "essay": rng.randint(2, 8), "noise": rng.randint(2, 4)}[haystack]
    cfg = ruler.Niah(haystack, key_type, value_type, num_needle_k=keys)
    family = ruler.FAMILIES["niah"]
    build = ruler.niah_builder(cfg, f"dense_keys/{seed}", essay if haystack == "essay" else None)
    try:
        return fitted_sample(
            "dense_keys", build, tokenizer, prompt_tokens + family.max_new_tokens, seed, 0, family.max_new_tokens, keys
        )
    except (ValueError, ruler.TooShort):
        return None


def dense_keys_example(
    tokenizer: PreTrainedTokenizerBase, prompt_tokens: int, seed: int, essay: ruler.Essay
) -> Example | None:
    """Key matching, densely supervised: a RULER needle prompt with several keys, then questions on all.

    The prompt is a RULER multi-key needle prompt (needle, essay or noise haystack, 2-8 keys) in
    RULER's exact singular template; its answer is followed by up to :data:`DENSE_QUESTIONS` more
    questions, in the same template, on other keys of the context, each answer supervised. A
    single question teaches little about matching the key (single-needle tasks are solved without
    it); several per prompt multiply the signal. Training only.
    """
    rng = random.Random(f"dense_keys/{seed}")
    sample = _dense_keys_prompt(tokenizer, prompt_tokens, seed, essay, rng)
    if sample is None:
        return None
    pairs = dict(NEEDLE_PATTERN.findall(sample.context))
    asked = sample.meta["keys"][0]
    others = [k for k in pairs if k != asked]
    rng.shuffle(others)
    prompt = tokenize(sample, tokenizer, chat=False, max_context=10**9)
    ids = prompt.context + prompt.query
    spans = []
    for key in [asked, *others[:DENSE_QUESTIONS]]:
        if key != asked:
            text = (sample.question + sample.answer_prefix).replace(asked, key)
            ids += tokenizer(text, add_special_tokens=False)["input_ids"]
        answer = tokenizer(f" {pairs[key]}.", add_special_tokens=False)["input_ids"]
        spans.append((len(ids), len(ids) + len(answer)))
        ids += answer
    ids.append(tokenizer.eos_token_id)
    return Example("dense_keys", ids, spans[-1][0], earlier_answers=spans[:-1])


COPY_TASKS = ("copy_short", "copy")


def copy_example(task: str, length: int, seed: int, vocab_size: int) -> Example:
    """Induction data: random tokens, a span repeated, loss on the repeat (from its second token).

    ``copy_short``: ``S S`` with ``S`` of random length, in sequences of ``length`` tokens (the
    first induction stage uses 32: induction heads form there in a few hundred steps, at 256
    tokens they had not formed after 500). Tokens come from the whole vocabulary: heads grown on a
    1024-token alphabet did not copy the other tokens.
    ``copy``: ``A S B S`` over the whole vocabulary, ``A``, ``S``, ``B`` of random lengths, so that
    the repeat can only be found by content, at any distance.
    """
    rng = random.Random(f"{task}/{seed}")
    body = length - 1
    if task == "copy_short":
        span = rng.randint(4, max(4, body // 2))
        segment = [rng.randrange(3, vocab_size) for _ in range(span)]
        ids = [0, *segment, *segment]
        return Example(task, ids, len(ids) - span + 1)
    span = rng.randint(8, max(8, body // 3))
    filler = max(0, body - 2 * span)
    before = rng.randint(0, filler)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, vocab_size) for _ in range(n)]

    segment = tokens(span)
    ids = [0, *tokens(before), *segment, *tokens(filler - before), *segment]
    return Example(task, ids, len(ids) - span + 1)


class TaskData:
    """Training and held-out examples of every task at any prompt length, from seeds.

    ``recall_gaps`` are the recipe's recall drills (:attr:`restkv.microtrain.recipes.Recipe.recall_gaps`):
    the only part of a recipe that changes what an example of a given task is.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, recall_gaps: Mapping[str, str]) -> None:
        self.tokenizer = tokenizer
        self.recall_gaps = dict(recall_gaps)
        self.essay = ruler.parse_essay(load_haystack(TRAIN_HAYSTACK))
        self.vocab_size = len(tokenizer)
        self._heldout: dict[tuple[str, int, int], list[Example]] = {}

    def example(self, task: str, length: int, seed: int) -> Example | None:
        """An example of ``task`` with a prompt of about ``length`` tokens; None if it cannot fit."""
        if task in COPY_TASKS:
            return copy_example(task, length, seed, self.vocab_size)
        essay = essay_window(self.essay, random.Random(f"essay/{seed}"))
        if task == "dense_keys":
            return dense_keys_example(self.tokenizer, length, seed, essay)
        try:
            sample = make_sample(task, self.tokenizer, length, seed, essay, self.recall_gaps)
        except (ValueError, ruler.TooShort):
            return None
        return encode(sample, self.tokenizer)

    def heldout(self, task: str, length: int, count: int) -> list[Example]:
        """The held-out examples of ``task`` at ``length`` (seeds of neither training nor evaluation), cached."""
        key = (task, length, count)
        if key not in self._heldout:
            found = []
            for i in range(count):
                example = self.example(task, length, HELDOUT_SEED_BASE + 10 * length + i)
                if example is not None:
                    found.append(example)
            self._heldout[key] = found
        return self._heldout[key]
