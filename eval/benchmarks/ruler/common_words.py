"""Common words extraction (``cwe``): a numbered list where ten words repeat often.

The model names the ten most common words. RULER shows one solved example first and uses lighter
repetition counts below 4,096 tokens.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from restkv.eval.benchmarks.ruler.fitting import Build, Draft
from restkv.eval.benchmarks.ruler.plan import Job, Plan
from restkv.eval.benchmarks.ruler.templates import FAMILIES, split_template
from restkv.eval.benchmarks.ruler.words import english_words, prefix_sample


@dataclass(frozen=True)
class CommonWords:
    """The cwe task's settings."""

    freq_cw: int = 30
    freq_ucw: int = 3
    num_cw: int = 10
    num_fewshot: int = 1
    family: str = "common_words_extraction"

    def plan(self, job: Job) -> Plan:
        """Distinct words (official step 10; the official search probes 4,096 words and bounds the
        size by twice the length over the tokens per word)."""
        small, path = job.words.common, job.data.english_words

        def large() -> Sequence[str]:  # read only when a prompt needs more words than `small` holds
            return english_words(path)

        def builder(index: int, seed: str) -> tuple[Build, int]:
            return cwe_builder(self, seed, job.context_length, small, large), self.num_cw

        sized = path if path is not None and Path(path).is_file() else None
        return Plan("words", builder, n_max=len(english_words(sized)), step=10, probe=4096, upper_factor=2.0)


def _numbered(words: Sequence[str]) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


def cwe_builder(
    cfg: CommonWords, seed: str, context_length: int, small: Sequence[str], large: Callable[[], Sequence[str]]
) -> Build:
    """``build(n)`` for one sample: a solved example, then a numbered list of ``n`` distinct words, ten of
    them repeated often. Words come from ``small`` while it holds ``n``, else from ``large()``."""
    family = FAMILIES["common_words_extraction"]
    head, tail = split_template(family.template)
    if context_length < 4096:  # RULER's lighter setting for short contexts
        shot_words, shot_cw, shot_ucw, main_cw, main_ucw = 20, 3, 1, 6, 1
    else:
        shot_words, shot_cw, shot_ucw, main_cw, main_ucw = 40, 10, 3, cfg.freq_cw, cfg.freq_ucw

    def example(rng: random.Random, chosen: list[str], cw: int, ucw: int) -> tuple[str, list[str]]:
        common, uncommon = chosen[: cfg.num_cw], chosen[cfg.num_cw :]
        listing = common * cw + uncommon * ucw
        rng.shuffle(listing)
        return _numbered(listing), common

    def build(n: int) -> Draft:
        rng = random.Random(seed)
        shots = []
        for _ in range(cfg.num_fewshot):
            shot_context, shot_answer = example(rng, rng.sample(small, shot_words), shot_cw, shot_ucw)
            shots.append(head + shot_context + tail + family.answer_prefix + " " + _numbered(shot_answer))
        pool = small if n <= len(small) else large()
        context, answer = example(rng, prefix_sample(rng, pool, n), main_cw, main_ucw)
        return Draft(
            context="\n".join(shots) + "\n" + head + context,
            question=tail,
            answer_prefix=family.answer_prefix,
            references=answer,
        )

    return build
