"""What a task family is handed (:class:`Job`) and what it hands back (:class:`Plan`).

Each family module (``niah``, ``variable_tracking``, ``common_words``, ``freq_words``, ``qa``) turns a
job into a plan: how to build one sample's prompt for a haystack of ``n`` units, the smallest and
largest ``n``, and the official generator's sizing constants for that task and length. The generator
(:mod:`.generator`) then fits every sample the same way whatever the family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from restkv.eval.benchmarks.ruler.fitting import Build, Count
from restkv.eval.benchmarks.ruler.haystacks import Essay
from restkv.eval.benchmarks.ruler.words import Vocabulary

FITS = ("official", "exact")


@dataclass
class RulerData:
    """Where the non-synthetic inputs come from.

    ``haystack``: essay haystack source for :func:`~restkv.eval.benchmarks.shared.haystack.load_haystack`
    (a Paul Graham essays folder, a file, a bundled name; ``None`` = bundled evaluation text).
    ``squad`` / ``hotpotqa``: the official SQuAD 2.0 dev JSON (``dev-v2.0.json``) and HotpotQA
    dev distractor JSON (``hotpot_dev_distractor_v1.json``); ``None`` means
    ``data/ruler/squad.json`` / ``data/ruler/hotpotqa.json`` under the project root. Relative
    paths are taken as given (relative to the working directory).
    ``hub``: when a file is missing, try the Hugging Face hub through ``datasets`` (skipped when
    ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE`` is set).
    ``english_words``: RULER's ``english_words.json`` for long common-words prompts (``None``: the
    bundled list).
    ``essay``: an already parsed essay to use as it is instead of ``haystack`` (the training draws
    windows of its own novel).
    """

    haystack: str | Path | None = None
    squad: str | Path | None = None
    hotpotqa: str | Path | None = None
    hub: bool = True
    english_words: str | None = None
    essay: Essay | None = None


@dataclass(frozen=True)
class Job:
    """One task at one length, as every family sees it."""

    task: str
    context_length: int
    budget: int  # prompt tokens allowed: context_length minus the family's generation length
    seed: str  # "ruler/<task>/<seed>"; samples add "/<index>"
    count: Count
    data: RulerData
    words: Vocabulary
    sentences: str  # "punkt" | "rules" (resolved)
    fit: str  # "official" | "exact"

    @property
    def short(self) -> bool:
        """The official generator's lighter setting below 4,096 tokens (smaller steps, shorter lists)."""
        return self.context_length < 4096


Builder = Callable[[int, str], tuple[Build, int]]
"""``(sample index, sample seed) -> (build, smallest n)``."""


@dataclass
class Plan:
    """How a family lays out one task at one length.

    ``step``: the official generator's decrement (and search lower bound) in haystack units.
    ``probe``: the size whose tokens per unit bound the official search (measured on ``probe_builder``'s
    prompt when set: vt's probe leaves its solved example out, as the official generator does);
    ``upper_factor`` scales the bound.
    ``ramp_start``: set where the official generator grows the size from a guess instead of searching
    (frequent words). ``redraw``: whether a sample that overflows draws new content with its smaller
    size (the official generator re-draws, except for frequent words, whose vocabulary stays).
    """

    haystack: str
    builder: Builder
    n_max: int
    step: int
    probe: int
    upper_factor: float = 3.0
    probe_builder: Builder | None = None
    redraw: bool = True
    ramp_start: int | None = None
