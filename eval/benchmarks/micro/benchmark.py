"""The micro suite: RULER's retrieval and tracking tasks in templates a 3M-parameter model masters.

``models/micro-llama`` is trained on a CPU in under three hours. It learns to find a value that
directly follows its key (an induction head), but RULER's templates ask for more than that in one
step: several values of one key in context order (``niah_multivalue``), the values of four named
keys in the question's order (``niah_multiquery``), or the names a value was copied to, found
from the right-hand side of ``VAR B = VAR A`` (``vt``). The micro suite keeps each RULER task's
haystack, needles, key and value types and counts, and rewrites only the surface so that every
answer item is *cued*: the model writes the cue, then the value that follows the cue in the
context. Each item remains a retrieval through the whole KV cache, which is what eviction
policies are compared on; what the suite drops is the reordering and reverse lookup a tiny model
cannot learn in its budget.

Tasks (RULER counterpart: needle template / trained answer after the prefix's first cue):

* ``micro_single_1`` (``niah_single_1``, noise): ``{key} {value}.`` / `` {value}.``
* ``micro_single_2`` (``niah_single_2``, essay): the same.
* ``micro_multikey_1`` (``niah_multikey_1``, essay, 4 keys): the same, three distractor keys.
* ``micro_multikey_2`` (``niah_multikey_2``): the same, every haystack line a needle.
* ``micro_multivalue`` (``niah_multivalue``, one key, 4 values): ``{key} #i {value}.`` /
  `` v1, {key} #2 v2, {key} #3 v3, {key} #4 v4.``
* ``micro_multiquery`` (``niah_multiquery``, 4 keys asked as ``#1 {k1}, #2 {k2}, ...``):
  ``{key} {value}.`` / `` v1, #2 {k2} v2, #3 {k3} v3, #4 {k4} v4.``
* ``micro_vt`` (``vt``, one chain of 4 hops in noise): ``VAR {a} {b}.`` lines from the value to
  the fifth name, shuffled / `` A B C D E.`` (each name the cue of the next). A known weakness of
  this form for a model that retrieves by induction: the pair ``A B`` written in the answer also
  ends the line ``VAR A B.``, whose next token is a period, not ``C``. A colon-cued form
  (``VAR a: b.`` / `` A: B: C``, each cue once in the context) was tried on the shipped model in
  a short extra phase and reached only 10 % (its model card, "After v3"), so the form the model
  was trained on stays.
* ``passkey`` (Mohtashami & Jaggi 2023): the classic passkey prompt, unchanged.

Keys are RULER's ``adjective-noun`` words, values RULER's 7-digit numbers, essays the bundled
evaluation novel (or ``haystack``), prompts fitted to the model's own tokens exactly as RULER's
are (:func:`restkv.eval.benchmarks.ruler.fit_prompt`). The answer prefix ends with the first cue (the key, or
the chain's value); the references are the values (names for ``micro_vt``), scored with RULER's
``string_match_all``. UUID needles (``niah_single_3``, ``niah_multikey_3``) are left out: copying
a 17-token UUID is a capacity test, not a retrieval one.
"""

from __future__ import annotations

import itertools
import random
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from restkv.eval.benchmarks import ruler
from restkv.eval.benchmarks.contract.base import Sample
from restkv.eval.benchmarks.contract.metrics import score as score_metric
from restkv.eval.benchmarks.shared.haystack import check_haystack, haystack_name, load_haystack

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

METRIC = "string_match_all"
NOISE_SENTENCE = ruler.NOISE_SENTENCE
QUERIES = 4  # keys asked in micro_multiquery, values per key in micro_multivalue (RULER's counts)


@dataclass(frozen=True)
class _Task:
    haystack: str  # "noise", "essay", "needle" (every line a needle) or "passkey" (its own noise)
    kind: str  # "single", "multivalue", "multiquery", "vt", "passkey"
    keys: int = 1  # keys with needles in the context
    max_new_tokens: int = 32


TASK_CONFIGS: dict[str, _Task] = {
    "micro_single_1": _Task("noise", "single"),
    "micro_single_2": _Task("essay", "single"),
    "micro_multikey_1": _Task("essay", "single", keys=4),
    "micro_multikey_2": _Task("needle", "single"),
    "micro_multivalue": _Task("essay", "multivalue", max_new_tokens=96),
    "micro_multiquery": _Task("essay", "multiquery", keys=QUERIES, max_new_tokens=96),
    "micro_vt": _Task("noise", "vt", max_new_tokens=40),
    "passkey": _Task("passkey", "passkey", max_new_tokens=16),
}
TASKS: tuple[str, ...] = tuple(TASK_CONFIGS)

VT_HOPS = 4  # RULER's vt: one chain of 5 names
VT_NAME_LENGTH = 5

PASSKEY_PREAMBLE = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
PASSKEY_NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION = "\nWhat is the pass key?"
PASSKEY_ANSWER_PREFIX = " The pass key is"


def _config(task: str) -> _Task:
    if task not in TASK_CONFIGS:
        raise ValueError(f"unknown micro task {task!r}; valid tasks: {', '.join(TASKS)}")
    return TASK_CONFIGS[task]


def max_new_tokens(task: str) -> int:
    """Tokens the answer of ``task`` may take."""
    return _config(task).max_new_tokens


def _distinct_keys(rng: random.Random, count: int) -> list[str]:
    keys: list[str] = []
    while len(keys) < count:
        key = ruler.random_value(rng, "words")
        if key not in keys:
            keys.append(key)
    return keys


def _vt_names(rng: random.Random, count: int) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choices(string.ascii_uppercase, k=VT_NAME_LENGTH))
        if name not in names:
            names.append(name)
    return names


def _listing(items: list[str]) -> str:
    return " " + ", ".join(items) + "."


def target_text(task: str, cues: list[str], references: list[str]) -> str:
    """The answer after the answer prefix (which ends with the first cue), as the model is trained to give it.

    Every item but the first starts with its cue: ``{key} {value}`` items separated by commas; in
    ``micro_vt`` each name is the cue of the next. Greedy outputs in this format score 1 with
    ``string_match_all`` exactly when every value is right.
    """
    kind = _config(task).kind
    if kind == "vt":
        return " " + " ".join(references) + "."
    if kind == "passkey" or len(references) == 1:
        return f" {references[0]}."
    items = [references[0]] + [f"{cue} {value}" for cue, value in zip(cues[1:], references[1:], strict=True)]
    return _listing(items)


@dataclass(frozen=True)
class _Plan:
    """A sample's random choices, drawn once from its seed: what goes where, whatever the length."""

    needles: list[str]  # needle lines (shuffled when placed)
    question: str
    answer_prefix: str
    references: list[str]
    cues: list[str]  # the cue before each reference in the trained answer
    keys: list[str]


def _plan(task: str, rng: random.Random) -> _Plan:
    cfg = _config(task)
    if cfg.kind == "single":
        keys = _distinct_keys(rng, cfg.keys)
        values = [ruler.random_value(rng, "numbers") for _ in keys]
        pick = rng.randrange(len(keys))
        needles = [f"{k} {v}." for k, v in zip(keys, values, strict=True)]
        key = keys[pick]
        return _Plan(needles, f"\nWhat is the number for {key}?", f"\nAnswer: {key}", [values[pick]], [key], [key])
    if cfg.kind == "multivalue":
        (key,) = _distinct_keys(rng, 1)
        values = [ruler.random_value(rng, "numbers") for _ in range(QUERIES)]
        cues = [f"{key} #{i + 1}" for i in range(QUERIES)]
        needles = [f"{cue} {v}." for cue, v in zip(cues, values, strict=True)]
        question = f"\nWhat are the {QUERIES} numbers for {key}?"
        return _Plan(needles, question, f"\nAnswer: {cues[0]}", values, cues, [key])
    if cfg.kind == "multiquery":
        keys = _distinct_keys(rng, cfg.keys)
        values = [ruler.random_value(rng, "numbers") for _ in keys]
        needles = [f"{k} {v}." for k, v in zip(keys, values, strict=True)]
        order = list(range(len(keys)))
        rng.shuffle(order)
        asked = [keys[i] for i in order]
        cues = [f"#{n + 1} {k}" for n, k in enumerate(asked)]
        question = f"\nWhat are the numbers for {', '.join(cues)}?"
        return _Plan(needles, question, f"\nAnswer: {cues[0]}", [values[i] for i in order], cues, asked)
    if cfg.kind == "vt":
        value = str(rng.randint(10000, 99998))
        names = _vt_names(rng, VT_HOPS + 1)
        chain = [value, *names]
        needles = [f"VAR {a} {b}." for a, b in itertools.pairwise(chain)]
        question = f"\nFollow the VAR lines from {value}: which {len(names)} names does the chain pass through?"
        return _Plan(needles, question, f"\nAnswer: {value}", names, [value, *names[:-1]], [value])
    raise ValueError(f"micro task {task} has no needle plan")


def turns_of(cfg: _Task, plan: _Plan) -> dict[str, Any]:
    """Further questions about the same context (``evaluation=multi_turn``): each other key of a multi-key task."""
    if cfg.kind != "single" or cfg.keys < 2:
        return {}
    pairs = [needle.rstrip(".").rsplit(" ", 1) for needle in plan.needles]
    others = [(key, value) for key, value in pairs if key != plan.keys[0]]
    turns = [
        {"question": f"\nWhat is the number for {key}?", "answer_prefix": f"\nAnswer: {key}", "references": [value]}
        for key, value in others
    ]
    return {"turns": turns}


def passkey_sample(tokenizer: PreTrainedTokenizerBase, context_length: int, seed: int, index: int = 0) -> Sample:
    """The classic passkey prompt (Mohtashami & Jaggi 2023): a 5-digit key in repeated noise.

    Like RULER's prompts, it plus the answer's room fits ``context_length`` tokens; the needle sits
    at a uniformly drawn sentence boundary.
    """
    return sample("passkey", tokenizer, context_length, seed, index)


def _passkey_builder(seed: str) -> Callable[[int], ruler.Draft]:
    key = str(random.Random(seed).randint(10000, 99999))
    depth = random.Random(seed + "/depth").random()

    def build(n: int) -> ruler.Draft:
        at = round(depth * n)
        pieces = [PASSKEY_NOISE] * at + [PASSKEY_NEEDLE.format(key=key)] + [PASSKEY_NOISE] * (n - at)
        return ruler.Draft(
            context=PASSKEY_PREAMBLE + " " + " ".join(pieces),
            question=PASSKEY_QUESTION,
            answer_prefix=PASSKEY_ANSWER_PREFIX,
            references=[key],
            depths=[at / max(n, 1)],
        )

    return build


def _builder(
    task: str, seed: str, essay: ruler.Essay | None, depth: float | None = None
) -> Callable[[int], ruler.Draft]:
    """``build(n)``: the prompt with ``n`` haystack units (words or lines), placed as RULER places needles.

    ``depth`` (percent) puts a single-needle essay task's needle at that depth instead of a drawn one.
    """
    cfg = _config(task)
    if depth is not None and (cfg.haystack != "essay" or cfg.kind != "single" or cfg.keys != 1):
        raise ValueError(f"a fixed needle depth needs a one-needle essay task (micro_single_2), not {task!r}")

    def build(n: int) -> ruler.Draft:
        rng = random.Random(seed)
        plan = _plan(task, rng)
        needles = list(plan.needles)
        rng.shuffle(needles)
        if cfg.haystack == "essay":
            assert essay is not None
            fixed = None if depth is None else [float(depth)]
            context, depths = ruler.essay_with_needles(essay, n, needles, rng, depths=fixed)
        else:
            if cfg.haystack == "needle":
                taken = set(plan.keys)
                lines = []
                for _ in range(n):
                    key = ruler.random_value(rng, "words")
                    while key in taken:
                        key = ruler.random_value(rng, "words")
                    lines.append(f"{key} {ruler.random_value(rng, 'numbers')}.")
            else:
                lines = [NOISE_SENTENCE] * n
            context, depths = ruler.lines_with_needles(lines, needles, rng)
        return ruler.Draft(
            context=context,
            question=plan.question,
            answer_prefix=plan.answer_prefix,
            references=plan.references,
            depths=depths,
            extra={"keys": plan.keys, "cues": plan.cues, **turns_of(cfg, plan)},
        )

    return build


def sample(
    task: str,
    tokenizer: PreTrainedTokenizerBase,
    context_length: int,
    seed: int,
    index: int = 0,
    essay: ruler.Essay | None = None,
    depth: float | None = None,
) -> Sample:
    """Prompt ``index`` of ``task`` from ``seed``: the longest that leaves the answer room in ``context_length``.

    ``essay`` (a ``ruler.Essay``) is the essay haystack (default: the bundled evaluation novel);
    training passes windows of its own novel. ``depth`` (percent) fixes ``micro_single_2``'s needle
    depth (the micro needle grid); its samples get their own ids.
    """
    cfg = _config(task)
    budget = context_length - cfg.max_new_tokens
    if budget <= 0:
        raise ValueError(f"context_length {context_length} leaves no room for {task}'s prompt")
    if task == "passkey":
        if depth is not None:
            raise ValueError("a fixed needle depth needs a one-needle essay task (micro_single_2), not 'passkey'")
        build, n_min = _passkey_builder(f"passkey/{seed}/{index}"), 0
    else:
        if cfg.haystack == "essay" and essay is None:
            essay = ruler.parse_essay(load_haystack(None))
        sample_seed = f"micro/{task}/{seed}/{index}"
        build = _builder(task, sample_seed, essay, depth)
        n_min = 0 if cfg.haystack == "essay" else len(_plan(task, random.Random(sample_seed)).needles)
    try:
        fit = ruler.fit_prompt(build, ruler.TokenCounter(tokenizer), budget, n_min, 4 * budget + 16)
    except ruler.TooShort as exc:
        raise ValueError(
            f"micro task {task} cannot fit in context_length={context_length}: its smallest prompt has "
            f"{exc.tokens} tokens but the budget is {budget} ({cfg.max_new_tokens} reserved for the answer)"
        ) from None
    meta = {
        "benchmark": "micro",
        "context_length": context_length,
        "max_prompt_tokens": budget,
        "haystack_units": fit.n,
        "seed": seed,
        "index": index,
    }
    sample_id = f"micro/{task}/{context_length}/{seed}/{index}"
    if depth is not None:
        meta["depth_percent"] = float(depth)
        sample_id = f"micro/{task}/{context_length}/depth{float(depth):g}/{seed}/{index}"
    return fit.sample(sample_id, task, cfg.max_new_tokens, METRIC, meta, chat_template=False)


def generate(
    task: str,
    tokenizer: PreTrainedTokenizerBase,
    context_length: int,
    num_samples: int,
    seed: int,
    haystack: str | Path | None = None,
) -> list[Sample]:
    """``num_samples`` prompts of ``task`` at ``context_length`` tokens (prompt plus answer room)."""
    essay = ruler.parse_essay(load_haystack(haystack)) if _config(task).haystack == "essay" else None
    samples = [sample(task, tokenizer, context_length, seed, i, essay) for i in range(num_samples)]
    for s in samples:
        s.meta["haystack"] = haystack_name(haystack) if essay is not None else _config(task).haystack
    return samples


def trained_answer(sample: Sample) -> str:
    """:func:`target_text` of a generated sample."""
    return target_text(sample.task, list(sample.meta.get("cues", [])), list(sample.references))


@dataclass
class MicroBenchmark:
    """The micro suite's tasks x context lengths, ``samples`` prompts each (``configs/bench/micro.yaml``)."""

    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    lengths: list[int] = field(default_factory=lambda: [2048])
    samples: int = 20
    seed: int = 0
    haystack: str | None = None
    name: str = "micro"

    def __post_init__(self) -> None:
        for task in self.tasks:
            _config(task)  # raises with the list of valid tasks
        ruler.check_grid(self.lengths, self.samples)
        check_haystack(self.haystack)

    def load_samples(self, tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
        return [
            s
            for task in self.tasks
            for length in self.lengths
            for s in generate(task, tokenizer, int(length), self.samples, self.seed, self.haystack)
        ]

    def score(self, sample: Sample, prediction: str) -> float:
        return score_metric(sample.metric, prediction, sample.references)

    def report(self, records: list[dict[str, Any]], folder: Path) -> dict[str, Any]:
        """Average over tasks at each length, as RULER reports it."""
        return {"lengths": ruler.average_per_length(records)}
