"""Haystacks: the essay (words and sentence boundaries) and needles placed in it or among lines.

Sentence boundaries decide where needles go in essay haystacks. The official generator splits with
NLTK's punkt; ``sentences="punkt"`` does the same where NLTK and its punkt data are installed,
``"rules"`` is a rule-based splitter (abbreviations, initials, quotes), and ``"auto"`` picks punkt when
it can run. Both splitters run once over the whole essay (the official generator splits the first
``n`` words each time, which can differ in the last sentence only).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cache, lru_cache

SENTENCE_SPLITTERS = ("auto", "punkt", "rules")
DEPTHS: tuple[int, ...] = tuple(round(i * 100 / 39) for i in range(40))
"""Needle depths (percent) for essay haystacks: 40 evenly spaced values from 0 to 100."""

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


@lru_cache(maxsize=8)
def parse_essay(text: str, sentences: str = "rules") -> Essay:
    """``text`` as words and the indices of the words that end a sentence.

    ``sentences``: ``"rules"`` (the default: the micro suite and the training use it) or ``"punkt"``.
    """
    words = tuple(re.sub(r"\s+", " ", text).strip().split(" "))
    if not words or words == ("",):
        raise ValueError("the essay haystack is empty")
    if resolve_splitter(sentences) == "punkt":
        return Essay(words, _punkt_ends(words))
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


@cache
def _punkt() -> object | None:
    """NLTK's English punkt sentence tokenizer, or ``None`` when NLTK or its data is missing."""
    try:
        from nltk.tokenize import PunktTokenizer
    except ImportError:
        return None
    try:
        return PunktTokenizer("english")
    except (LookupError, OSError, ValueError):
        return None


def resolve_splitter(name: str) -> str:
    """``"punkt"`` or ``"rules"``: the splitter ``name`` means here (``auto``: punkt when it can run).

    ``punkt`` asked for explicitly but unavailable raises, naming what to install.
    """
    if name not in SENTENCE_SPLITTERS:
        raise ValueError(
            f"bench.sentences={name!r} is not a sentence splitter; allowed: {', '.join(SENTENCE_SPLITTERS)}"
        )
    if name == "rules":
        return "rules"
    if _punkt() is not None:
        return "punkt"
    if name == "punkt":
        raise RuntimeError(
            "bench.sentences=punkt needs NLTK with its punkt data: `pip install nltk` then "
            "`python -m nltk.downloader punkt_tab`; or bench.sentences=rules"
        )
    return "rules"


def _punkt_ends(words: tuple[str, ...]) -> tuple[int, ...]:
    tokenizer = _punkt()
    assert tokenizer is not None
    text = " ".join(words)
    word_at: dict[int, int] = {}
    offset = 0
    for i, word in enumerate(words):
        word_at[offset] = i
        offset += len(word) + 1
    starts = sorted({word_at[s] for s, _ in tokenizer.span_tokenize(text) if s in word_at} - {0})  # type: ignore[attr-defined]
    return (*(s - 1 for s in starts), len(words) - 1)


def essay_with_needles(
    essay: Essay,
    n: int,
    needles: list[str],
    rng: random.Random,
    official: bool = False,
    depths: list[float] | None = None,
) -> tuple[str, list[float]]:
    """The first ``n`` essay words with ``needles`` at sentence starts of random depths (RULER's placement).

    ``depths`` (percent, one per needle) fixes the depths instead of drawing them, for depth grids
    (the micro needle grid); ``rng`` is then not used.

    ``official``: join the pieces exactly as the official generator does, empty pieces included (a
    needle at depth 0 follows a space; two needles at one sentence are two spaces apart), and round
    ``int(sentences * (depth / 100))`` as it does. The default skips empty pieces (what the micro suite
    and the training use).
    """
    if depths is not None and len(depths) != len(needles):
        raise ValueError(f"depths={depths} must give one depth per needle ({len(needles)} needles)")
    chosen = sorted(depths) if depths is not None else sorted(rng.sample(DEPTHS, len(needles)))
    words, starts = essay_words_and_starts(essay, n)
    if official:
        sentence_index = [int(len(starts) * (d / 100)) for d in chosen]
    else:
        sentence_index = [int(len(starts) * d / 100) for d in chosen]
    cuts = [starts[k] if k < len(starts) else n for k in sentence_index]
    pieces: list[str] = []
    prev = 0
    for cut, needle in zip(cuts, needles, strict=True):
        if cut > prev or official:
            pieces.append(" ".join(words[prev:cut]))
        pieces.append(needle)
        prev = cut
    if prev < n or official:
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
