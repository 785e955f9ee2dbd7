"""Needle in a haystack: the eight niah tasks (single, multi-key, multi-value, multi-query).

Keys are hidden as "One of the special magic {values} for {key} is: {value}." in an essay, in
repeated noise sentences, or among distractor needles, and the model is asked for the values of one
or more keys.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from restkv.eval.benchmarks.ruler.fitting import Build, Draft
from restkv.eval.benchmarks.ruler.haystacks import Essay, essay_with_needles, lines_with_needles, parse_essay
from restkv.eval.benchmarks.ruler.plan import Job, Plan
from restkv.eval.benchmarks.ruler.templates import FAMILIES, NEEDLE_TEMPLATE, NOISE_SENTENCE, split_template
from restkv.eval.benchmarks.ruler.words import Vocabulary, random_value
from restkv.eval.benchmarks.shared.haystack import haystack_name, load_haystack

HAYSTACKS = ("noise", "essay", "needle")


@dataclass(frozen=True)
class Niah:
    """One niah task's settings (RULER's ``synthetic.yaml`` and the generator's defaults)."""

    type_haystack: str  # "noise" | "essay" | "needle"
    type_needle_k: str  # "words" | "numbers" | "uuids"
    type_needle_v: str
    num_needle_k: int = 1
    num_needle_v: int = 1
    num_needle_q: int = 1
    family: str = "niah"

    def plan(self, job: Job) -> Plan:
        """Essay haystacks count words (official step 500); noise and needle haystacks count lines
        (official step 25, 5 below 4,096 tokens)."""
        needles = max(self.num_needle_k, self.num_needle_q) * self.num_needle_v
        if self.type_haystack == "essay":
            essay = job.data.essay or parse_essay(load_haystack(job.data.haystack), job.sentences)
            label, step, n_min = haystack_name(job.data.haystack), 500, 0
        elif self.type_haystack in HAYSTACKS:
            essay, label, step, n_min = None, self.type_haystack, 5 if job.short else 25, needles
        else:
            raise ValueError(f"unknown haystack type {self.type_haystack!r}; allowed: {', '.join(HAYSTACKS)}")

        def builder(index: int, seed: str) -> tuple[Build, int]:
            return niah_builder(self, seed, essay, job.words, official=job.fit == "official"), n_min

        return Plan(label, builder, n_max=4 * job.budget + 16, step=step, probe=step)


def niah_builder(
    cfg: Niah, seed: str, essay: Essay | None, words: Vocabulary | None = None, official: bool = False
) -> Build:
    """``build(n)`` for one sample: the needles hidden in ``n`` essay words, noise lines or distractor needles.

    ``official``: essay pieces joined as the official generator joins them (see :func:`essay_with_needles`).
    """
    family = FAMILIES["niah"]
    num_k = max(cfg.num_needle_k, cfg.num_needle_q)
    template, answer_prefix, type_v = family.template, family.answer_prefix, cfg.type_needle_v
    if cfg.num_needle_q * cfg.num_needle_v == 1:
        # RULER's singular wording for a single expected answer.
        for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
            template = template.replace(old, new)
            answer_prefix = answer_prefix.replace(old, new)
        type_v = type_v[:-1]
    head, tail = split_template(template)

    def build(n: int) -> Draft:
        rng = random.Random(seed)
        keys: list[str] = []
        values: list[list[str]] = []
        needles: list[str] = []
        for _ in range(num_k):
            key = random_value(rng, cfg.type_needle_k, words)
            while key in keys:
                key = random_value(rng, cfg.type_needle_k, words)
            keys.append(key)
            values.append([random_value(rng, cfg.type_needle_v, words) for _ in range(cfg.num_needle_v)])
            needles.extend(
                NEEDLE_TEMPLATE.format(type_needle_v=cfg.type_needle_v, key=key, value=v) for v in values[-1]
            )
        rng.shuffle(needles)
        queried = rng.sample(range(num_k), cfg.num_needle_q)
        queries = [keys[i] for i in queried]
        answers = [v for i in queried for v in values[i]]
        query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]

        depths: list[float]
        if cfg.type_haystack == "essay":
            assert essay is not None
            haystack, depths = essay_with_needles(essay, n, needles, rng, official)
        else:
            haystack, depths = lines_with_needles(_lines(cfg, n, keys, rng, words), needles, rng)
        fields = {"type_needle_v": type_v, "query": query}
        return Draft(
            context=head.format(**fields) + haystack,
            question=tail.format(**fields),
            answer_prefix=answer_prefix.format(**fields),
            references=answers,
            depths=depths,
            extra={"keys": queries},
        )

    return build


def _lines(cfg: Niah, n: int, keys: list[str], rng: random.Random, words: Vocabulary | None) -> list[str]:
    """``n`` haystack lines: the noise sentence, or distractor needles whose keys are not real keys."""
    if cfg.type_haystack == "noise":
        return [NOISE_SENTENCE] * n
    if cfg.type_haystack != "needle":
        raise ValueError(f"unknown haystack type {cfg.type_haystack!r}; allowed: {', '.join(HAYSTACKS)}")
    lines = []
    for _ in range(n):
        key = random_value(rng, cfg.type_needle_k, words)
        while key in keys:
            key = random_value(rng, cfg.type_needle_k, words)
        value = random_value(rng, cfg.type_needle_v, words)
        lines.append(NEEDLE_TEMPLATE.format(type_needle_v=cfg.type_needle_v, key=key, value=value))
    return lines
