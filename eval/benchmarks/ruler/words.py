"""Where RULER's random words come from: key words, common-words pools, needle values.

Two vocabularies. ``wonderwords`` is the official generator's source: the adjective, noun and verb
lists shipped with the ``wonderwords`` package (keys ``adjective-noun``, the common-words pool the
union of the three lists). ``bundled`` is the project's own smaller lists in ``eval/benchmarks/data/words``: what
the micro model was trained on and what the generator used before it followed the official source.
For common-words prompts that need more distinct words than a pool holds, the official generator reads
RULER's ``english_words.json``; here that file when given, else the bundled ``english_words.txt``.
"""

from __future__ import annotations

import importlib.util
import json
import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from restkv.eval.benchmarks.contract.reads import note

WORDS_DIR = Path(__file__).resolve().parent.parent / "data" / "words"
VOCABULARIES = ("wonderwords", "bundled")
NEEDLE_KINDS = ("numbers", "words", "uuids")


@dataclass(frozen=True)
class Vocabulary:
    """Word lists for keys (``adjectives`` x ``nouns``) and the common-words pool."""

    name: str
    adjectives: tuple[str, ...]
    nouns: tuple[str, ...]
    common: tuple[str, ...]

    def key(self, rng: random.Random) -> str:
        """A random ``adjective-noun`` key."""
        return f"{rng.choice(self.adjectives)}-{rng.choice(self.nouns)}"


def _distinct_sorted(words: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted({w.strip() for w in words if w.strip()}))


@cache
def _bundled_list(name: str) -> tuple[str, ...]:
    return _distinct_sorted((WORDS_DIR / name).read_text(encoding="utf-8").splitlines())


@cache
def _wonderwords_list(name: str) -> tuple[str, ...]:
    spec = importlib.util.find_spec("wonderwords")  # located, not imported: its import reads every list
    try:
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError("the package is not installed")
        text = (Path(next(iter(spec.submodule_search_locations))) / "assets" / name).read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise RuntimeError(
            f"bench.words=wonderwords needs the `wonderwords` package's {name} ({exc}); "
            "`pip install wonderwords` or use bench.words=bundled"
        ) from None
    return _distinct_sorted(text.splitlines())


@cache
def vocabulary(name: str) -> Vocabulary:
    """The vocabulary called ``name`` (one of :data:`VOCABULARIES`)."""
    if name == "wonderwords":
        adjectives, nouns = _wonderwords_list("adjectivelist.txt"), _wonderwords_list("nounlist.txt")
        verbs = _wonderwords_list("verblist.txt")
    elif name == "bundled":
        adjectives, nouns = _bundled_list("adjectives.txt"), _bundled_list("nouns.txt")
        verbs = _bundled_list("verbs.txt")
    else:
        raise ValueError(f"unknown word source {name!r}; allowed: {', '.join(VOCABULARIES)}")
    return Vocabulary(name, adjectives, nouns, _distinct_sorted(adjectives + nouns + verbs))


BUNDLED_NAME = "bundled"


def key_words() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The bundled adjectives and nouns (the micro model's tokenizer and training use them)."""
    bundled = vocabulary(BUNDLED_NAME)
    return bundled.adjectives, bundled.nouns


def english_words(path: str | None = None) -> tuple[str, ...]:
    """The large pool for long common-words prompts: RULER's ``english_words.json`` at ``path``
    (a JSON object whose values are the words), else the bundled ``english_words.txt``."""
    note(path if path is not None else WORDS_DIR / "english_words.txt")  # on every call, whatever the cache
    return _english_words(path)


@cache
def _english_words(path: str | None) -> tuple[str, ...]:
    if path is None:
        return _bundled_list("english_words.txt")
    try:
        with open(path, encoding="utf-8") as f:
            loaded: Any = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"bench.english_words={path!r} is not a readable JSON file ({exc}); "
            "`python scripts/download_data.py ruler_words` fetches RULER's, or bench.english_words=null"
        ) from None
    if not isinstance(loaded, dict) or not all(isinstance(w, str) for w in loaded.values()):
        raise ValueError(f"bench.english_words={path!r} must be a JSON object of words (RULER's english_words.json)")
    return tuple(loaded.values())


def random_value(rng: random.Random, kind: str, words: Vocabulary | None = None) -> str:
    """A random needle key or value of ``kind`` (7-digit number, ``adjective-noun`` or UUID).

    ``words`` defaults to the bundled vocabulary, which the micro suite and the training use.
    """
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        return (words or vocabulary(BUNDLED_NAME)).key(rng)
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"unknown needle type {kind!r}; allowed: {', '.join(NEEDLE_KINDS)}")


def prefix_sample(rng: random.Random, population: Sequence[Any], k: int) -> list[Any]:
    """``k`` items without replacement, such that a larger ``k`` extends a smaller one's result."""
    pool = list(population)
    k = min(k, len(pool))
    for i in range(k):
        j = rng.randrange(i, len(pool))
        pool[i], pool[j] = pool[j], pool[i]
    return pool[:k]
