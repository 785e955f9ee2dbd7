"""Frequent words extraction (``fwe``): coded words drawn with Zipf frequencies.

The model names the three most frequent coded words (the most frequent "word" is "...", noise).
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from restkv.eval.benchmarks.ruler.fitting import Build, Draft
from restkv.eval.benchmarks.ruler.plan import Job, Plan
from restkv.eval.benchmarks.ruler.templates import FAMILIES, split_template


@dataclass(frozen=True)
class FreqWords:
    """The fwe task's settings."""

    alpha: float = 2.0
    coded_wordlen: int = 6
    family: str = "freq_words_extraction"

    def plan(self, job: Job) -> Plan:
        """Coded words; the official sizing grows from ``budget // coded_wordlen`` in steps of
        ``budget // 32`` until the budget is reached, then goes back one step."""

        def builder(index: int, seed: str) -> tuple[Build, int]:
            return fwe_builder(self, seed, job.budget), 10

        step = max(job.budget // 32, 1)
        return Plan(
            "coded_words",
            builder,
            n_max=4 * job.budget + 16,
            step=step,
            probe=step,
            ramp_start=job.budget // self.coded_wordlen,
            redraw=False,  # the official generator keeps a sample's vocabulary and only shrinks the count
        )


def _zeta(s: float) -> float:
    """Riemann zeta for ``s > 1`` (partial sum plus Euler–Maclaurin tail)."""
    n = 64
    head = sum(k**-s for k in range(1, n))
    return head + n ** (1 - s) / (s - 1) + 0.5 * n**-s + s * n ** (-s - 1) / 12


def fwe_builder(cfg: FreqWords, seed: str, budget: int) -> Build:
    """``build(n)`` for one sample: about ``n`` coded words drawn with Zipf frequencies."""
    family = FAMILIES["freq_words_extraction"]
    head, tail = split_template(family.template)
    vocab_size = max(budget // 50, 5)  # RULER: (max_seq_length - tokens_to_generate) // 50
    zeta = _zeta(cfg.alpha)

    def build(n: int) -> Draft:
        rng = random.Random(seed)
        vocab_set: set[str] = set()
        while len(vocab_set) < vocab_size:
            vocab_set.add("".join(rng.choices(string.ascii_lowercase, k=cfg.coded_wordlen)))
        vocab = sorted(vocab_set)
        rng.shuffle(vocab)
        vocab[0] = "..."  # the most frequent "word" is noise
        words: list[str] = []
        for rank, word in enumerate(vocab, start=1):
            words.extend([word] * int(n * rank**-cfg.alpha / zeta))
        rng.shuffle(words)
        return Draft(
            context=head + " ".join(words),
            question=tail,
            answer_prefix=family.answer_prefix,
            references=vocab[1:4],
        )

    return build
