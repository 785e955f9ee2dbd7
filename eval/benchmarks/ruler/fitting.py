"""Fitting a prompt to a length: the exact search and the official generator's step-down rule.

A task builder is ``build(n) -> Draft``: the prompt with a haystack of ``n`` units (essay words, noise
lines, distractor needles, list words, documents). Budgets count the prompt's tokens (context,
question and answer prefix, no special tokens, no chat template); RULER also counts the answer, so
callers pass ``context_length - max_new_tokens``.

* :func:`fit_prompt` (``fit=exact``): per sample, the largest ``n`` whose prompt fits, so every
  prompt is within one unit of the budget.
* :func:`search_size` then :func:`step_down` (``fit=official``): the official generator's rule. One
  binary search per task and length finds a haystack size from a probe prompt; every sample starts
  there and drops a fixed step of units until it fits, so a sample whose random content is longer
  than the probe's can end up far below the budget. :func:`ramp_size` is the variant its
  frequent-words task uses (grow from a guess by a fixed step until the budget is reached).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from restkv.eval.benchmarks.contract.sample import Sample

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


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


Build = Callable[[int], Draft]
"""A sample's prompt for a haystack of ``n`` units."""
Count = Callable[[str], int]
"""Tokens of a text (no special tokens, no chat template)."""


class TokenCounter:
    """Counts a text's tokens as RULER does: plain tokenization, no special tokens, no chat template."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def __call__(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


@dataclass
class Fit:
    """A fitted prompt: its size ``n`` in haystack units, the draft, its tokens and the tokens per unit."""

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
    search = _ExactSearch(build, count, budget, n_min, n_max)
    if guess is None or slope is None:
        t0 = search.evaluate(n_min)
        if t0 > budget:
            raise TooShort(t0)
        n1 = min(n_max, max(2 * n_min, n_min + 16))
        if n1 == n_min:
            return Fit(n_min, search.seen[n_min][0], t0, 1.0)
        t1 = search.evaluate(n1)
        slope = max((t1 - t0) / (n1 - n_min), 1e-3)
        guess = n_min + int((budget - t0) / slope)
    search.slope = slope
    n = min(max(guess, n_min), n_max)
    for _ in range(200):
        search.record(n)
        if search.closed():
            break
        n = search.next_size()
    else:  # pragma: no cover - the bracket always closes well within 200 steps
        raise RuntimeError("length search did not converge")
    assert search.lo is not None
    draft, tokens = search.seen[search.lo]
    return Fit(search.lo, draft, tokens, search.slope)


class _ExactSearch:
    """The state of :func:`fit_prompt`'s bracketing search: sizes tried and the current bracket."""

    def __init__(self, build: Build, count: Count, budget: int, n_min: int, n_max: int) -> None:
        self.build, self.count, self.budget, self.n_min, self.n_max = build, count, budget, n_min, n_max
        self.seen: dict[int, tuple[Draft, int]] = {}
        self.history: list[tuple[int, int]] = []
        self.lo: int | None = None
        self.hi: int | None = None
        self.slope = 1.0
        self.stride = 1.0
        self.last_direction = 0
        self.steps = 0

    def evaluate(self, n: int) -> int:
        if n not in self.seen:
            draft = self.build(n)
            self.seen[n] = (draft, self.count(draft.prompt))
            self.history.append((n, self.seen[n][1]))
        return self.seen[n][1]

    def record(self, n: int) -> None:
        """Try ``n``: widen the bracket's side it falls on and refresh the slope."""
        if self.evaluate(n) <= self.budget:
            self.lo = n if self.lo is None else max(self.lo, n)
        else:
            self.hi = n if self.hi is None else min(self.hi, n)
        if len(self.history) >= 2:
            (na, ta), (nb, tb) = self.history[-2], self.history[-1]
            if na != nb and (tb - ta) / (nb - na) > 0:
                self.slope = (tb - ta) / (nb - na)

    def closed(self) -> bool:
        """Whether the largest fitting size is found; raises :class:`TooShort` when none fits."""
        lo, hi = self.lo, self.hi
        if lo is not None and (lo == self.n_max or (hi is not None and hi - lo <= 1)):
            return True
        if lo is None and hi == self.n_min:
            raise TooShort(self.seen[self.n_min][1])
        return False

    def next_size(self) -> int:
        lo, hi, budget = self.lo, self.hi, self.budget
        if lo is not None and hi is not None:
            self.steps += 1
            t_lo, t_hi = self.seen[lo][1], self.seen[hi][1]
            if self.steps % 3 == 0 or t_hi <= t_lo:
                n = (lo + hi) // 2
            else:
                n = lo + int((budget - t_lo) * (hi - lo) / (t_hi - t_lo))
            return min(max(n, lo + 1), hi - 1)
        if lo is not None:
            self.stride = self.stride * 2 if self.last_direction == 1 else 1.0
            self.last_direction = 1
            return min(self.n_max, lo + max(1, int(self.stride * (budget - self.seen[lo][1]) / self.slope) + 1))
        assert hi is not None
        self.stride = self.stride * 2 if self.last_direction == -1 else 1.0
        self.last_direction = -1
        return max(self.n_min, hi - max(1, math.ceil(self.stride * (self.seen[hi][1] - budget) / self.slope)))


class TooShort(Exception):
    """Nothing fits the budget; ``tokens`` is the smallest prompt tried."""

    def __init__(self, tokens: int) -> None:
        super().__init__(tokens)
        self.tokens = tokens


def _tokens(build: Build, count: Count, n: int) -> int:
    return count(build(n).prompt)


def search_size(
    build: Build, count: Count, budget: int, step: int, per_unit: float, length: int, upper_factor: float
) -> int:
    """The official generator's one search for a task's haystack size.

    The search runs over ``[step, upper]`` with ``upper = max(int(upper_factor * length / per_unit),
    2 * step)``, ``per_unit`` the tokens per unit of a probe prompt, and returns the largest fitting
    size found, or ``step`` when none fits (the samples then re-draw at that size).
    """
    lower, upper = step, max(int(upper_factor * length / max(per_unit, 1e-9)), 2 * step)
    best: int | None = None
    while lower <= upper:
        mid = (lower + upper) // 2
        if _tokens(build, count, mid) <= budget:
            best, lower = mid, mid + 1
        else:
            upper = mid - 1
    return best if best is not None else step


def ramp_size(build: Build, count: Count, budget: int, start: int, step: int) -> int:
    """The frequent-words variant: grow from ``start`` by ``step`` while the prompt is under the
    budget, then go back one step."""
    n = start
    while _tokens(build, count, n) < budget:
        n += step
    return n - step


def step_down(
    builds: Callable[[int], Build], count: Count, budget: int, start: int, step: int, n_min: int, retries: int = 1000
) -> Fit:
    """One sample at the official rule: ``start`` units, minus ``step`` until the prompt fits.

    ``builds(attempt)`` is the sample's builder for each attempt: like the official generator, every
    attempt draws new content. Once the size cannot drop another step (it is at most one step, or the
    next would go below ``n_min``) it stays and re-draws; after ``retries`` such draws
    :class:`TooShort` is raised (where the official generator would loop forever).
    """
    n, attempt, floor_draws = start, 0, 0
    while True:
        draft = builds(attempt)(n)
        tokens = count(draft.prompt)
        if tokens <= budget:
            return Fit(n, draft, tokens, tokens / max(n, 1))
        attempt += 1
        if n > step and n - step >= n_min:
            n -= step
        else:
            floor_draws += 1
            if floor_draws > retries:
                raise TooShort(tokens)
