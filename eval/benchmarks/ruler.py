"""RULER's 13 synthetic tasks, generated locally at any length measured in the model's tokens.

RULER (Hsieh et al., 2024, "RULER: What's the Real Context Size of Your Long-Context Language
Models?") builds every prompt for a target tokenizer and a target length. This module follows the
default configuration of the official generator (task list, per-task haystack, key and value types,
needle/value/query counts, the prompt templates, the answer prefixes, the generation lengths and
the metrics) and re-implements the sampling procedures; it shares no code with it.

Length budget
    RULER counts the answer inside the length: a prompt is accepted when
    ``prompt_tokens + max_new_tokens <= context_length`` (prompt tokenized without special tokens
    and without a chat template). We do the same, so every sample satisfies
    ``prompt_tokens <= context_length - max_new_tokens`` and is as long as possible within that
    budget: the haystack size (words of essay, noise sentences, distractor needles, list words,
    documents) is the largest whose prompt still fits, found per sample by a bracketing search on
    exact token counts (interpolation with a bisection safeguard). The fit of the previous sample
    seeds the next, so a typical sample costs two to four tokenizations. The shortfall below the
    budget is therefore at most one haystack unit (a word, a sentence, a needle, a document).

Context / question split
    RULER's prompt is ``template.format(context=..., query=...) + answer_prefix``. We cut the
    template at ``{context}``: ``Sample.context`` is everything up to the end of the haystack (the
    task preamble, and for ``vt``/``cwe`` RULER's in-context example, which precedes the
    preamble); ``Sample.question`` is the rest of the template starting with its separator (e.g.
    ``"\\nWhat is the special magic number for ...?"``); ``Sample.answer_prefix`` is RULER's answer
    prefix. ``context + question + answer_prefix`` is exactly RULER's prompt.

Sampling
    Every sample draws from its own ``random.Random`` seeded by ``(seed, task, index)``, so the same
    ``(task, tokenizer, context_length, seed)`` always gives the same samples and another seed gives
    other keys, values and positions. Needle depths follow RULER: essay haystacks insert each
    needle at a depth drawn without replacement from 40 evenly spaced percentages (0..100), at a
    sentence boundary; line-based haystacks (noise, distractor needles, variable chains) insert at
    positions drawn uniformly without replacement.

Deviations, all forced by running offline or by short contexts:

* Keys of type ``words`` are ``adjective-noun`` pairs as in RULER, but drawn from word lists
  bundled in ``eval/data/words`` (RULER uses the ``wonderwords`` lists); ``cwe`` draws from the
  bundled nouns/adjectives/verbs and, for long contexts that need more distinct words, from the
  bundled English word list (RULER: its ``english_words.json``).
* Sentence splitting of essay haystacks uses a rule-based splitter (RULER: NLTK punkt).
* Keys are distinct within a sample, and distractor needles never reuse a real key (RULER leaves
  such collisions to chance; with smaller word lists they would not be negligible).
* ``vt``'s in-context example is fitted to 500 tokens as in RULER, but to half the budget when
  that is smaller (contexts under about 1k tokens, where RULER's generator cannot fit ``vt``).
* Where RULER reshuffles with a fixed seed (needle order, word lists, documents), we shuffle with
  the sample's generator.
* A task whose smallest prompt does not fit the budget raises :class:`ValueError` (RULER loops).

The essay haystack is Paul Graham's essays in RULER; here it is whatever
:func:`eval.benchmarks.haystack.load_haystack` returns for ``RulerData.haystack`` (the bundled
evaluation novel by default), and ``meta["haystack"]`` records which.

``qa_1`` (SQuAD 2.0 dev) and ``qa_2`` (HotpotQA dev, distractor setting) read the official JSON
files (see :class:`RulerData`); sample ``i`` asks the ``i``-th answerable question, as RULER does,
and the seed changes the distractor documents and their order.
"""

from __future__ import annotations

import json
import math
import random
import re
import string
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eval.benchmarks.base import Sample
from eval.benchmarks.haystack import check_haystack, haystack_name, load_haystack
from eval.hub import hub_reachable
from eval.metrics import score as score_metric
from eval.paths import project_root

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

WORDS_DIR = Path(__file__).resolve().parent.parent / "data" / "words"

DEFAULT_SQUAD_PATH = Path("data/ruler/squad.json")
DEFAULT_HOTPOTQA_PATH = Path("data/ruler/hotpotqa.json")
_HOW_TO_GET_QA = "run `python scripts/download_data.py ruler_qa`"

# --------------------------------------------------------------------------------------------
# Templates (RULER scripts/data/synthetic/constants.py), reproduced exactly.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
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

# --------------------------------------------------------------------------------------------
# Task configuration (RULER scripts/synthetic.yaml, plus the generators' argument defaults).
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Niah:
    type_haystack: str  # "noise" | "essay" | "needle"
    type_needle_k: str  # "words" | "numbers" | "uuids"
    type_needle_v: str
    num_needle_k: int = 1
    num_needle_v: int = 1
    num_needle_q: int = 1
    family: str = "niah"


@dataclass(frozen=True)
class VariableTracking:
    num_chains: int = 1
    num_hops: int = 4
    type_haystack: str = "noise"
    icl_tokens: int = 500  # RULER fits its in-context example to 500 tokens
    family: str = "variable_tracking"


@dataclass(frozen=True)
class _CommonWords:
    freq_cw: int = 30
    freq_ucw: int = 3
    num_cw: int = 10
    num_fewshot: int = 1
    family: str = "common_words_extraction"


@dataclass(frozen=True)
class _FreqWords:
    alpha: float = 2.0
    coded_wordlen: int = 6
    family: str = "freq_words_extraction"


@dataclass(frozen=True)
class _QA:
    dataset: str  # "squad" | "hotpotqa"
    family: str = "qa"


_TaskConfig = Niah | VariableTracking | _CommonWords | _FreqWords | _QA

TASK_CONFIGS: dict[str, _TaskConfig] = {
    "niah_single_1": Niah("noise", "words", "numbers"),
    "niah_single_2": Niah("essay", "words", "numbers"),
    "niah_single_3": Niah("essay", "words", "uuids"),
    "niah_multikey_1": Niah("essay", "words", "numbers", num_needle_k=4),
    "niah_multikey_2": Niah("needle", "words", "numbers"),
    "niah_multikey_3": Niah("needle", "uuids", "uuids"),
    "niah_multivalue": Niah("essay", "words", "numbers", num_needle_v=4),
    "niah_multiquery": Niah("essay", "words", "numbers", num_needle_q=4),
    "vt": VariableTracking(num_chains=1, num_hops=4),
    "cwe": _CommonWords(freq_cw=30, freq_ucw=3, num_cw=10),
    "fwe": _FreqWords(alpha=2.0),
    "qa_1": _QA("squad"),
    "qa_2": _QA("hotpotqa"),
}

TASKS: tuple[str, ...] = tuple(TASK_CONFIGS)
OFFLINE_TASKS: tuple[str, ...] = tuple(t for t in TASKS if t not in ("qa_1", "qa_2"))
"""The 11 tasks that need no download: the default, and the set the ReST-KV authors ran."""

NOISE_SENTENCE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE_TEMPLATE = "One of the special magic {type_needle_v} for {key} is: {value}."
DOCUMENT_TEMPLATE = "Document {i}:\n{document}"
DEPTHS: tuple[int, ...] = tuple(round(i * 100 / 39) for i in range(40))
"""Needle depths (percent) for essay haystacks: 40 evenly spaced values from 0 to 100."""

# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


@dataclass
class RulerData:
    """Where the non-synthetic inputs come from.

    ``haystack``: essay haystack source for :func:`~eval.benchmarks.haystack.load_haystack`
    (a Paul Graham essays folder, a file, a bundled name; ``None`` = bundled evaluation text).
    ``squad`` / ``hotpotqa``: the official SQuAD 2.0 dev JSON (``dev-v2.0.json``) and HotpotQA
    dev distractor JSON (``hotpot_dev_distractor_v1.json``); ``None`` means
    ``data/ruler/squad.json`` / ``data/ruler/hotpotqa.json`` under the project root. Relative
    paths are taken as given (relative to the working directory).
    ``hub``: when a file is missing, try the Hugging Face hub through ``datasets`` (skipped when
    ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE`` is set).
    """

    haystack: str | Path | None = None
    squad: str | Path | None = None
    hotpotqa: str | Path | None = None
    hub: bool = True


@dataclass
class Draft:
    """One candidate prompt, before it becomes a :class:`Sample`."""

    context: str
    question: str
    answer_prefix: str
    references: list[str]
    depths: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt(self) -> str:
        return self.context + self.question + self.answer_prefix


def _split_template(template: str) -> tuple[str, str]:
    head, tail = template.split("{context}")
    return head, tail


@cache
def _word_list(name: str) -> tuple[str, ...]:
    text = (WORDS_DIR / name).read_text(encoding="utf-8")
    return tuple(sorted({w.strip() for w in text.splitlines() if w.strip()}))


def key_words() -> tuple[tuple[str, ...], tuple[str, ...]]:
    return _word_list("adjectives.txt"), _word_list("nouns.txt")


@lru_cache(maxsize=1)
def _common_words() -> tuple[str, ...]:
    words = set(_word_list("adjectives.txt")) | set(_word_list("nouns.txt")) | set(_word_list("verbs.txt"))
    return tuple(sorted(words))


def _prefix_sample(rng: random.Random, population: Sequence[Any], k: int) -> list[Any]:
    """``k`` items without replacement, such that a larger ``k`` extends a smaller one's result."""
    pool = list(population)
    k = min(k, len(pool))
    for i in range(k):
        j = rng.randrange(i, len(pool))
        pool[i], pool[j] = pool[j], pool[i]
    return pool[:k]


# --------------------------------------------------------------------------------------------
# Token counting and the length search
# --------------------------------------------------------------------------------------------


class TokenCounter:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def __call__(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


@dataclass
class Fit:
    n: int
    draft: Draft
    tokens: int
    slope: float

    def sample(
        self,
        id: str,
        task: str,
        max_new_tokens: int,
        metric: str,
        meta: dict[str, Any],
        chat_template: bool = True,
    ) -> Sample:
        """The fitted draft as a :class:`Sample`: ``meta`` plus the prompt's tokens, the needles' depths and the
        builder's extra fields (RULER's, the micro suite's and the training prompts' alike)."""
        draft = self.draft
        return Sample(
            id=id,
            task=task,
            context=draft.context,
            question=draft.question,
            answer_prefix=draft.answer_prefix,
            references=draft.references,
            max_new_tokens=max_new_tokens,
            metric=metric,
            chat_template=chat_template,
            meta={**meta, "prompt_tokens": self.tokens, "depths": draft.depths, **draft.extra},
        )


def fit_prompt(
    build: Callable[[int], Draft],
    count: Callable[[str], int],
    budget: int,
    n_min: int,
    n_max: int,
    guess: int | None = None,
    slope: float | None = None,
) -> Fit:
    """Largest ``n`` in ``[n_min, n_max]`` with ``count(build(n).prompt) <= budget``.

    Treats the token count as increasing in ``n`` (it is, up to tokenizer merges at the seams).
    Starts at ``guess`` and steps by the estimated tokens-per-unit ``slope`` until the budget is
    bracketed, then narrows the bracket by interpolation, bisecting every third step.
    """
    seen: dict[int, tuple[Draft, int]] = {}
    history: list[tuple[int, int]] = []

    def evaluate(n: int) -> int:
        if n not in seen:
            draft = build(n)
            seen[n] = (draft, count(draft.prompt))
            history.append((n, seen[n][1]))
        return seen[n][1]

    if guess is None or slope is None:
        t0 = evaluate(n_min)
        if t0 > budget:
            raise TooShort(t0)
        n1 = min(n_max, max(2 * n_min, n_min + 16))
        if n1 == n_min:
            return Fit(n_min, seen[n_min][0], t0, 1.0)
        t1 = evaluate(n1)
        slope = max((t1 - t0) / (n1 - n_min), 1e-3)
        guess = n_min + int((budget - t0) / slope)

    lo: int | None = None
    hi: int | None = None
    n = min(max(guess, n_min), n_max)
    stride = 1.0
    last_direction = 0
    steps = 0
    for _ in range(200):
        t = evaluate(n)
        if t <= budget:
            lo = n if lo is None else max(lo, n)
        else:
            hi = n if hi is None else min(hi, n)
        if len(history) >= 2:
            (na, ta), (nb, tb) = history[-2], history[-1]
            if na != nb and (tb - ta) / (nb - na) > 0:
                slope = (tb - ta) / (nb - na)
        if lo is not None and (lo == n_max or (hi is not None and hi - lo <= 1)):
            break
        if lo is None and hi == n_min:
            raise TooShort(seen[n_min][1])
        if lo is not None and hi is not None:
            steps += 1
            t_lo, t_hi = seen[lo][1], seen[hi][1]
            if steps % 3 == 0 or t_hi <= t_lo:
                n = (lo + hi) // 2
            else:
                n = lo + int((budget - t_lo) * (hi - lo) / (t_hi - t_lo))
            n = min(max(n, lo + 1), hi - 1)
        elif lo is not None:
            stride = stride * 2 if last_direction == 1 else 1.0
            last_direction = 1
            step = max(1, int(stride * (budget - seen[lo][1]) / slope) + 1)
            n = min(n_max, lo + step)
        else:
            assert hi is not None
            stride = stride * 2 if last_direction == -1 else 1.0
            last_direction = -1
            step = max(1, math.ceil(stride * (seen[hi][1] - budget) / slope))
            n = max(n_min, hi - step)
    else:  # pragma: no cover - the bracket always closes well within 200 steps
        raise RuntimeError("length search did not converge")
    assert lo is not None
    draft, tokens = seen[lo]
    return Fit(lo, draft, tokens, slope)


class TooShort(Exception):
    def __init__(self, tokens: int) -> None:
        super().__init__(tokens)
        self.tokens = tokens


# --------------------------------------------------------------------------------------------
# Essay haystack: words and sentence boundaries
# --------------------------------------------------------------------------------------------

_ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "st", "jr", "sr", "mt", "vs", "etc", "prof", "rev", "capt", "col", "gen"}
    | {"lt", "sgt", "hon", "co", "inc", "ltd", "esq", "messrs"}
)
_SENTENCE_END = re.compile(r"[.!?][\"'”’)\]]*$")
_SENTENCE_START = re.compile(r"^[\"'“‘(\[]*[A-Z0-9]")


def _ends_sentence(word: str, next_word: str) -> bool:
    if not _SENTENCE_END.search(word) or not _SENTENCE_START.match(next_word):
        return False
    core = word.lstrip("\"'“‘([").rstrip("\"'”’)]")
    if core.endswith("."):
        stem = core[:-1]
        if stem.lower() in _ABBREVIATIONS or re.fullmatch(r"[A-Z]", stem) or "." in stem:
            return False
    return True


@dataclass(frozen=True)
class Essay:
    words: tuple[str, ...]
    ends: tuple[int, ...]  # word indices after which a sentence ends (wrapping around at the end)


@lru_cache(maxsize=4)
def parse_essay(text: str) -> Essay:
    words = tuple(re.sub(r"\s+", " ", text).strip().split(" "))
    if not words or words == ("",):
        raise ValueError("the essay haystack is empty")
    size = len(words)
    ends = tuple(i for i in range(size) if _ends_sentence(words[i], words[(i + 1) % size]))
    return Essay(words, ends)


def essay_words_and_starts(essay: Essay, n: int) -> tuple[list[str], list[int]]:
    """The first ``n`` words (repeating the text if needed) and the sentence start indices."""
    size = len(essay.words)
    reps = -(-n // size) if n else 0
    words = list(essay.words * reps)[:n] if reps > 1 else list(essay.words[:n])
    starts = [0] if n else []
    for r in range(reps):
        base = r * size
        for e in essay.ends:
            s = base + e + 1
            if s >= n:
                break
            starts.append(s)
    return words, starts


# --------------------------------------------------------------------------------------------
# Task builders. Each returns ``build(n) -> Draft`` for one sample; the sample's random choices
# are re-drawn from the same seed on every call, so ``build`` is a pure function of ``n``.
# --------------------------------------------------------------------------------------------


def random_value(rng: random.Random, kind: str) -> str:
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        adjectives, nouns = key_words()
        return f"{rng.choice(adjectives)}-{rng.choice(nouns)}"
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"unknown needle type {kind!r}")


def essay_with_needles(essay: Essay, n: int, needles: list[str], rng: random.Random) -> tuple[str, list[float]]:
    """The first ``n`` essay words with ``needles`` at sentence starts of random depths (RULER's placement)."""
    chosen = sorted(rng.sample(DEPTHS, len(needles)))
    words, starts = essay_words_and_starts(essay, n)
    sentence_index = [int(len(starts) * d / 100) for d in chosen]
    cuts = [starts[k] if k < len(starts) else n for k in sentence_index]
    pieces: list[str] = []
    prev = 0
    for cut, needle in zip(cuts, needles, strict=True):
        if cut > prev:
            pieces.append(" ".join(words[prev:cut]))
        pieces.append(needle)
        prev = cut
    if prev < n:
        pieces.append(" ".join(words[prev:n]))
    return " ".join(pieces), [d / 100 for d in chosen]


def lines_with_needles(lines: list[str], needles: list[str], rng: random.Random) -> tuple[str, list[float]]:
    """``lines`` with ``needles`` inserted at random distinct positions, joined by newlines (RULER's placement)."""
    n = len(lines)
    lines = list(lines)
    positions = sorted(rng.sample(range(n), len(needles)), reverse=True)
    for position, needle in zip(positions, needles, strict=True):
        lines.insert(position, needle)
    return "\n".join(lines), sorted(p / n for p in positions)


def niah_builder(cfg: Niah, seed: str, essay: Essay | None) -> Callable[[int], Draft]:
    family = FAMILIES["niah"]
    num_k = max(cfg.num_needle_k, cfg.num_needle_q)
    template, answer_prefix, type_v = family.template, family.answer_prefix, cfg.type_needle_v
    if cfg.num_needle_q * cfg.num_needle_v == 1:
        # RULER's singular wording for a single expected answer.
        for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
            template = template.replace(old, new)
            answer_prefix = answer_prefix.replace(old, new)
        type_v = type_v[:-1]
    head, tail = _split_template(template)

    def build(n: int) -> Draft:
        rng = random.Random(seed)
        keys: list[str] = []
        values: list[list[str]] = []
        needles: list[str] = []
        for _ in range(num_k):
            key = random_value(rng, cfg.type_needle_k)
            while key in keys:
                key = random_value(rng, cfg.type_needle_k)
            keys.append(key)
            values.append([random_value(rng, cfg.type_needle_v) for _ in range(cfg.num_needle_v)])
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
            haystack, depths = essay_with_needles(essay, n, needles, rng)
        else:
            if cfg.type_haystack == "noise":
                lines = [NOISE_SENTENCE] * n
            elif cfg.type_haystack == "needle":
                lines = []
                for _ in range(n):
                    key = random_value(rng, cfg.type_needle_k)
                    while key in keys:
                        key = random_value(rng, cfg.type_needle_k)
                    value = random_value(rng, cfg.type_needle_v)
                    lines.append(NEEDLE_TEMPLATE.format(type_needle_v=cfg.type_needle_v, key=key, value=value))
            else:
                raise ValueError(f"unknown haystack type {cfg.type_haystack!r}")
            haystack, depths = lines_with_needles(lines, needles, rng)
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


def _vt_chains(
    rng: random.Random, num_chains: int, num_hops: int, name_len: int, value: str | None
) -> tuple[list[list[str]], list[list[str]]]:
    total = (num_hops + 1) * num_chains
    names: list[str] = []
    while len(names) < total:
        name = "".join(rng.choices(string.ascii_uppercase, k=name_len))
        if name not in names:
            names.append(name)
    all_vars, chains = [], []
    for c in range(num_chains):
        chain_vars = names[c * (num_hops + 1) : (c + 1) * (num_hops + 1)]
        start = value if value is not None else str(rng.randint(10000, 99998))
        chain = [f"VAR {chain_vars[0]} = {start}"]
        chain.extend(f"VAR {chain_vars[j + 1]} = VAR {chain_vars[j]} " for j in range(num_hops))
        all_vars.append(chain_vars)
        chains.append(chain)
    return all_vars, chains


def _vt_render(chains: list[list[str]], rng: random.Random, n: int) -> tuple[str, list[float]]:
    lines = [NOISE_SENTENCE] * n
    depths: list[float] = []
    for chain in chains:
        positions = sorted(rng.sample(range(len(lines)), len(chain)))
        for j, (position, line) in enumerate(zip(positions, chain, strict=True)):
            lines.insert(position + j, line)
            depths.append(position / max(n, 1))
    return "\n".join(lines).replace(". \n", ".\n"), depths


def vt_example(
    cfg: VariableTracking, seed: str, count: Callable[[str], int], budget: int
) -> Callable[[random.Random], str]:
    """RULER's in-context example: a complete short vt prompt with its answer.

    Fitted once per generation run; each sample then re-draws the variable names and the value
    (RULER's ``randomize_icl``).
    """
    family = FAMILIES["variable_tracking"]
    head, tail = _split_template(family.template)
    num_hops = min(10, cfg.num_hops)

    def render(n: int, names_rng: random.Random | None, layout_seed: str) -> str:
        value = "12345" if names_rng is None else str(names_rng.randint(10000, 99998))
        chain_rng = names_rng if names_rng is not None else random.Random(layout_seed + "-names")
        all_vars, chains = _vt_chains(chain_rng, cfg.num_chains, num_hops, 3, value)
        context, _ = _vt_render(chains, random.Random(layout_seed), n)
        fields = {"query": value, "num_v": num_hops + 1}
        prompt = head + context + tail.format(**fields) + family.answer_prefix.format(**fields)
        return prompt + " " + " ".join(all_vars[0]) + "\n"

    layout_seed = seed + "-icl"
    n_min = (num_hops + 1) * cfg.num_chains

    def build(n: int) -> Draft:
        return Draft(render(n, None, layout_seed), "", "", [])

    try:
        fit = fit_prompt(build, count, budget, n_min, 4 * budget + 16)
        n_icl = fit.n
    except TooShort:
        n_icl = n_min
    return lambda rng: render(n_icl, rng, layout_seed)


def vt_builder(cfg: VariableTracking, seed: str, example: Callable[[random.Random], str]) -> Callable[[int], Draft]:
    family = FAMILIES["variable_tracking"]
    head, tail = _split_template(family.template)

    def build(n: int) -> Draft:
        rng = random.Random(seed)
        icl = example(rng)
        all_vars, chains = _vt_chains(rng, cfg.num_chains, cfg.num_hops, 5, None)
        value = chains[0][0].split("=")[-1].strip()
        context, depths = _vt_render(chains, rng, n)
        fields = {"query": value, "num_v": cfg.num_hops + 1}
        return Draft(
            context=icl + "\n" + head + context,
            question=tail.format(**fields),
            answer_prefix=family.answer_prefix.format(**fields),
            references=list(all_vars[0]),
            depths=depths,
        )

    return build


def _numbered(words: Sequence[str]) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


def _cwe_builder(cfg: _CommonWords, seed: str, context_length: int) -> Callable[[int], Draft]:
    family = FAMILIES["common_words_extraction"]
    head, tail = _split_template(family.template)
    small = _common_words()
    large = _word_list("english_words.txt")
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
        pool = small if n <= len(small) else large
        context, answer = example(rng, _prefix_sample(rng, pool, n), main_cw, main_ucw)
        return Draft(
            context="\n".join(shots) + "\n" + head + context,
            question=tail,
            answer_prefix=family.answer_prefix,
            references=answer,
        )

    return build


def _zeta(s: float) -> float:
    """Riemann zeta for ``s > 1`` (partial sum plus Euler–Maclaurin tail)."""
    n = 64
    head = sum(k**-s for k in range(1, n))
    return head + n ** (1 - s) / (s - 1) + 0.5 * n**-s + s * n ** (-s - 1) / 12


def _fwe_builder(cfg: _FreqWords, seed: str, budget: int) -> Callable[[int], Draft]:
    family = FAMILIES["freq_words_extraction"]
    head, tail = _split_template(family.template)
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


# --------------------------------------------------------------------------------------------
# QA data (SQuAD 2.0 dev, HotpotQA dev distractor)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Question:
    query: str
    answers: list[str]
    gold: list[int]
    related: list[int]


@dataclass(frozen=True)
class _QAData:
    questions: list[_Question]
    docs: list[str]


def _squad_from_articles(articles: list[dict[str, Any]]) -> _QAData:
    docs = sorted({p["context"] for a in articles for p in a["paragraphs"]})
    index = {d: i for i, d in enumerate(docs)}
    questions = []
    for article in articles:
        article_docs = [index[p["context"]] for p in article["paragraphs"]]
        for paragraph in article["paragraphs"]:
            doc = index[paragraph["context"]]
            for qa in paragraph["qas"]:
                if qa.get("is_impossible", False):
                    continue
                questions.append(
                    _Question(
                        query=qa["question"],
                        answers=[a["text"] for a in qa["answers"]],
                        gold=[doc],
                        related=[d for d in article_docs if d != doc],
                    )
                )
    return _QAData(questions, docs)


def _hotpot_from_records(records: list[dict[str, Any]]) -> _QAData:
    def doc_text(title: str, sentences: list[str]) -> str:
        return f"{title}\n{''.join(sentences)}"

    docs = sorted({doc_text(t, s) for r in records for t, s in r["context"]})
    index = {d: i for i, d in enumerate(docs)}
    questions = [
        _Question(
            query=r["question"],
            answers=[r["answer"]],
            gold=[index[doc_text(t, s)] for t, s in r["context"]],
            related=[],
        )
        for r in records
    ]
    return _QAData(questions, docs)


def _hub_squad() -> _QAData:
    import datasets

    rows = datasets.load_dataset("rajpurkar/squad_v2", split="validation")
    articles: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        paragraphs = articles.setdefault(row["title"], {})
        paragraph = paragraphs.setdefault(row["context"], {"context": row["context"], "qas": []})
        texts = list(row["answers"]["text"])
        paragraph["qas"].append(
            {"question": row["question"], "answers": [{"text": t} for t in texts], "is_impossible": not texts}
        )
    return _squad_from_articles([{"paragraphs": list(p.values())} for p in articles.values()])


def _hub_hotpotqa() -> _QAData:
    import datasets

    rows = datasets.load_dataset("hotpotqa/hotpot_qa", "distractor", split="validation")
    records = [
        {
            "question": row["question"],
            "answer": row["answer"],
            "context": list(zip(row["context"]["title"], row["context"]["sentences"], strict=True)),
        }
        for row in rows
    ]
    return _hotpot_from_records(records)


_QA_CACHE: dict[tuple[str, str], _QAData] = {}


def load_qa(dataset: str, data: RulerData | None = None) -> _QAData:
    """Read SQuAD (``"squad"``) or HotpotQA (``"hotpotqa"``) as RULER does.

    Local official JSON first; then, if allowed and online, the hub; else FileNotFoundError.
    """
    data = data or RulerData()
    if dataset == "squad":
        given, default, reader, hub = data.squad, DEFAULT_SQUAD_PATH, _read_squad, _hub_squad
        official = "SQuAD 2.0 dev set (dev-v2.0.json)"
    elif dataset == "hotpotqa":
        given, default, reader, hub = data.hotpotqa, DEFAULT_HOTPOTQA_PATH, _read_hotpotqa, _hub_hotpotqa
        official = "HotpotQA dev distractor set (hotpot_dev_distractor_v1.json)"
    else:
        raise ValueError(f"unknown QA dataset {dataset!r}")
    path = Path(given) if given is not None else project_root() / default
    key = (dataset, str(path.resolve()))
    if key in _QA_CACHE:
        return _QA_CACHE[key]
    if path.is_file():
        loaded = reader(path)
    else:
        loaded = None
        if data.hub and hub_reachable():
            try:
                loaded = hub()
            except Exception:
                loaded = None
        if loaded is None:
            raise FileNotFoundError(
                f"RULER {dataset} needs the {official} at {path}; it is missing. To obtain it, "
                f"{_HOW_TO_GET_QA} (or pass its location in RulerData)."
            )
    _QA_CACHE[key] = loaded
    return loaded


def _read_squad(path: Path) -> _QAData:
    with open(path, encoding="utf-8") as f:
        return _squad_from_articles(json.load(f)["data"])


def _read_hotpotqa(path: Path) -> _QAData:
    with open(path, encoding="utf-8") as f:
        return _hotpot_from_records(json.load(f))


def _qa_builder(qa: _QAData, index: int, seed: str) -> Callable[[int], Draft]:
    family = FAMILIES["qa"]
    head, tail = _split_template(family.template)
    item = qa.questions[index % len(qa.questions)]
    total = len(qa.docs)
    excluded = set(item.gold) | set(item.related)

    def build(n: int) -> Draft:
        rng = random.Random(seed)
        related = list(item.related)
        rng.shuffle(related)
        if n >= total:
            chosen = (list(range(total)) * -(-n // total))[:n]
        elif n - len(item.gold) <= len(related):
            chosen = item.gold + related[: n - len(item.gold)]
        else:
            need = n - len(item.gold) - len(related)
            others = [d for d in _prefix_sample(rng, range(total), need + len(excluded)) if d not in excluded]
            chosen = item.gold + related + others[:need]
        rng.shuffle(chosen)
        context = "\n\n".join(DOCUMENT_TEMPLATE.format(i=i + 1, document=qa.docs[d]) for i, d in enumerate(chosen))
        depths = sorted({chosen.index(g) / len(chosen) for g in item.gold if g in chosen})
        return Draft(
            context=head + context,
            question=tail.format(query=item.query),
            answer_prefix=family.answer_prefix,
            references=list(item.answers),
            depths=depths,
        )

    return build


# --------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------


def max_new_tokens(task: str) -> int:
    """RULER's generation length for ``task``."""
    return FAMILIES[_config(task).family].max_new_tokens


def _config(task: str) -> _TaskConfig:
    if task not in TASK_CONFIGS:
        raise ValueError(f"unknown RULER task {task!r}; valid tasks: {', '.join(TASKS)}")
    return TASK_CONFIGS[task]


def generate(
    task: str,
    tokenizer: PreTrainedTokenizerBase,
    context_length: int,
    num_samples: int,
    seed: int,
    data: RulerData | None = None,
) -> list[Sample]:
    """Generate ``num_samples`` RULER samples of ``task`` at ``context_length`` tokens.

    Each prompt (``context + question + answer_prefix``, tokenized by ``tokenizer`` without
    special tokens or chat template) has at most ``context_length - max_new_tokens`` tokens and is
    the longest such prompt the task's haystack granularity allows (see the module docstring).
    """
    cfg = _config(task)
    data = data or RulerData()
    family = FAMILIES[cfg.family]
    budget = context_length - family.max_new_tokens
    if budget <= 0:
        raise ValueError(f"context_length {context_length} leaves no room for {task}'s prompt")
    count = TokenCounter(tokenizer)
    base_seed = f"ruler/{task}/{seed}"
    haystack_label: str
    qa: _QAData | None = None
    essay: Essay | None = None
    example: Callable[[random.Random], str] | None = None
    n_min, n_max = 1, 4 * budget + 16

    if isinstance(cfg, Niah):
        n_min = 0 if cfg.type_haystack == "essay" else max(cfg.num_needle_k, cfg.num_needle_q) * cfg.num_needle_v
        if cfg.type_haystack == "essay":
            essay = parse_essay(load_haystack(data.haystack))
            haystack_label = haystack_name(data.haystack)
        else:
            haystack_label = cfg.type_haystack
    elif isinstance(cfg, VariableTracking):
        haystack_label = "noise"
        n_min = (cfg.num_hops + 1) * cfg.num_chains
        icl_budget = min(cfg.icl_tokens, budget // 2)
        example = vt_example(cfg, base_seed, count, icl_budget)
    elif isinstance(cfg, _CommonWords):
        haystack_label = "words"
        n_min, n_max = cfg.num_cw, len(_word_list("english_words.txt"))
    elif isinstance(cfg, _FreqWords):
        haystack_label = "coded_words"
        n_min = 10
    else:
        qa = load_qa(cfg.dataset, data)
        haystack_label = cfg.dataset
        n_min = 1

    samples: list[Sample] = []
    guess: int | None = None
    slope: float | None = None
    for i in range(num_samples):
        sample_seed = f"{base_seed}/{i}"
        build: Callable[[int], Draft]
        if isinstance(cfg, Niah):
            build = niah_builder(cfg, sample_seed, essay)
        elif isinstance(cfg, VariableTracking):
            assert example is not None
            build = vt_builder(cfg, sample_seed, example)
        elif isinstance(cfg, _CommonWords):
            build = _cwe_builder(cfg, sample_seed, context_length)
        elif isinstance(cfg, _FreqWords):
            build = _fwe_builder(cfg, sample_seed, budget)
        else:
            assert qa is not None
            build = _qa_builder(qa, i, sample_seed)
            n_min = len(qa.questions[i % len(qa.questions)].gold)
        try:
            fit = fit_prompt(build, count, budget, n_min, n_max, guess, slope)
        except TooShort as exc:
            raise ValueError(
                f"RULER {task} cannot fit in context_length={context_length}: its smallest prompt has "
                f"{exc.tokens} tokens but the budget is {budget} ({context_length} minus "
                f"{family.max_new_tokens} tokens reserved for the answer)"
            ) from None
        guess, slope = fit.n, fit.slope
        meta = {
            "benchmark": "ruler",
            "context_length": context_length,
            "max_prompt_tokens": budget,
            "haystack": haystack_label,
            "haystack_units": fit.n,
            "seed": seed,
            "index": i,
        }
        samples.append(
            fit.sample(f"ruler/{task}/{context_length}/{seed}/{i}", task, family.max_new_tokens, family.metric, meta)
        )
    return samples


# --------------------------------------------------------------------------------------------
# The benchmark the runner instantiates (configs/bench/ruler.yaml)
# --------------------------------------------------------------------------------------------


@dataclass
class RulerBenchmark:
    """RULER tasks x context lengths, ``samples`` prompts each.

    The default tasks are the 11 that need no download (the authors' set); qa_1 and qa_2 need
    SQuAD / HotpotQA files. A requested task whose data cannot be had is skipped, and the reason is
    recorded in ``skipped`` (task -> reason) for the runner to report. The task score is averaged
    over lengths; ``metrics.json`` also gets the average per length (``lengths``), as RULER reports it.
    """

    tasks: list[str] = field(default_factory=lambda: list(OFFLINE_TASKS))
    lengths: list[int] = field(default_factory=lambda: [4096])
    samples: int = 100
    seed: int = 0
    haystack: str | None = None
    squad: str | None = None
    hotpotqa: str | None = None
    hub: bool = True
    name: str = "ruler"
    skipped: dict[str, str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        for task in self.tasks:
            _config(task)  # raises with the list of valid tasks
        check_grid(self.lengths, self.samples)
        check_haystack(self.haystack)

    def load_samples(self, tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
        data = RulerData(haystack=self.haystack, squad=self.squad, hotpotqa=self.hotpotqa, hub=self.hub)
        samples: list[Sample] = []
        self.skipped = {}
        for task in self.tasks:
            for length in self.lengths:
                try:
                    samples += generate(task, tokenizer, int(length), self.samples, self.seed, data)
                except FileNotFoundError as missing:
                    self.skipped[task] = str(missing)
                    print(f"skipping RULER {task}: {missing}", file=sys.stderr)
                    break
        return samples

    def score(self, sample: Sample, prediction: str) -> float:
        return score_metric(sample.metric, prediction, sample.references)

    def report(self, records: list[dict[str, Any]], folder: Path) -> dict[str, Any]:
        """Average over tasks at each length (RULER's headline numbers)."""
        return {"lengths": average_per_length(records)}


def check_grid(lengths: list[int], samples: int) -> None:
    """Raise a clear error for an empty or non-positive length list or a sample count below 1."""
    if not lengths or any(int(n) < 1 for n in lengths):
        raise ValueError(f"bench.lengths={lengths} must be a non-empty list of positive token counts")
    if samples < 1:
        raise ValueError(f"bench.samples={samples} must be >= 1")


def average_per_length(records: list[dict[str, Any]]) -> dict[str, float]:
    """Context length -> mean over tasks of the task's mean score, in percent (how RULER reports)."""
    by_length: dict[int, dict[str, list[float]]] = {}
    for record in records:
        length = int(record["meta"]["context_length"])
        by_length.setdefault(length, {}).setdefault(record["task"], []).append(record["score"])
    return {
        str(length): 100 * sum(sum(s) / len(s) for s in tasks.values()) / len(tasks)
        for length, tasks in sorted(by_length.items())
    }
