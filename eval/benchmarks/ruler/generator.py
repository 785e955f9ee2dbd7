"""Generating RULER samples for a tokenizer and a length: plan the task, size the haystack, sample.

Every prompt (``context + question + answer_prefix``, tokenized without special tokens or chat
template) fits ``context_length - max_new_tokens`` tokens, as RULER counts the answer inside the
length. ``fit="official"`` sizes haystacks by the official generator's rule (one search per task and
length, then each sample steps down by a fixed number of units); ``fit="exact"`` makes every prompt
as long as the budget allows. Every sample draws from its own ``random.Random`` seeded by ``(seed,
task, index)``, so a sample does not depend on how many others are generated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from restkv.eval.benchmarks.contract.sample import Sample
from restkv.eval.benchmarks.ruler.fitting import (
    Build,
    Fit,
    TokenCounter,
    TooShort,
    fit_prompt,
    ramp_size,
    search_size,
    step_down,
)
from restkv.eval.benchmarks.ruler.haystacks import resolve_splitter
from restkv.eval.benchmarks.ruler.plan import FITS, Job, Plan, RulerData
from restkv.eval.benchmarks.ruler.tasks import task_config
from restkv.eval.benchmarks.ruler.templates import FAMILIES
from restkv.eval.benchmarks.ruler.words import VOCABULARIES, vocabulary

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def check_settings(fit: str, words: str, sentences: str) -> str:
    """Refuse an unknown ``fit``, ``words`` or ``sentences`` (naming what is allowed); the splitter that will run."""
    for knob, value, allowed in (("fit", fit, FITS), ("words", words, VOCABULARIES)):
        if value not in allowed:
            raise ValueError(f"bench.{knob}={value!r} is not allowed; allowed: {', '.join(allowed)}")
    return resolve_splitter(sentences)


def official_start(plan: Plan, job: Job) -> int:
    """The haystack size every sample starts from under ``fit="official"``."""
    build, _ = plan.builder(0, f"{job.seed}/search")
    if plan.ramp_start is not None:
        return ramp_size(build, job.count, job.budget, plan.ramp_start, plan.step)
    probe = build if plan.probe_builder is None else plan.probe_builder(0, f"{job.seed}/search")[0]
    per_unit = job.count(probe(plan.probe).prompt) / plan.probe
    return search_size(build, job.count, job.budget, plan.step, per_unit, job.context_length, plan.upper_factor)


def generate(
    task: str,
    tokenizer: PreTrainedTokenizerBase,
    context_length: int,
    num_samples: int,
    seed: int,
    data: RulerData | None = None,
    *,
    fit: str = "official",
    words: str = "wonderwords",
    sentences: str = "auto",
) -> list[Sample]:
    """``num_samples`` RULER samples of ``task`` at ``context_length`` tokens.

    ``words``: ``"wonderwords"`` (the official source) or ``"bundled"``; ``sentences``: the essay
    splitter, ``"auto"`` | ``"punkt"`` | ``"rules"`` (see :mod:`.haystacks`).
    """
    cfg = task_config(task)
    splitter = check_settings(fit, words, sentences)
    family = FAMILIES[cfg.family]
    budget = context_length - family.max_new_tokens
    if budget <= 0:
        raise ValueError(f"context_length {context_length} leaves no room for {task}'s prompt")
    job = Job(
        task=task,
        context_length=context_length,
        budget=budget,
        seed=f"ruler/{task}/{seed}",
        count=TokenCounter(tokenizer),
        data=data or RulerData(),
        words=vocabulary(words),
        sentences=splitter,
        fit=fit,
    )
    plan = cfg.plan(job)
    try:
        fits = _fit_all(plan, job, num_samples)
    except TooShort as exc:
        raise _too_short(job, plan, family.max_new_tokens, exc.tokens) from None
    return [_sample(job, plan, fitted, seed, i) for i, fitted in enumerate(fits)]


def _sample(job: Job, plan: Plan, fitted: Fit, seed: int, index: int) -> Sample:
    family = FAMILIES[task_config(job.task).family]
    meta = {
        "benchmark": "ruler",
        "context_length": job.context_length,
        "max_prompt_tokens": job.budget,
        "haystack": plan.haystack,
        "haystack_units": fitted.n,
        "seed": seed,
        "index": index,
    }
    sample_id = f"ruler/{job.task}/{job.context_length}/{seed}/{index}"
    return fitted.sample(sample_id, job.task, family.max_new_tokens, family.metric, meta)


def _too_short(job: Job, plan: Plan, max_new_tokens: int, tokens: int) -> ValueError:
    """The error for a task that does not fit; under the official rule it says whether exact filling would."""
    longer = -(-(tokens + max_new_tokens) // 1024) * 1024  # the next multiple of 1024 that holds it
    hint = f"; a longer bench.lengths fits (e.g. [{longer}])"
    if job.fit == "official":
        build, n_min = plan.builder(0, f"{job.seed}/0")
        try:
            fit_prompt(build, job.count, job.budget, n_min, plan.n_max)
            hint = (
                f"; fit=official never drops below {plan.step} haystack units: bench.fit=exact fits this task, a "
                f"longer bench.lengths (e.g. [{longer}]) fits it with the official rule"
            )
        except TooShort:
            hint = f"; bench.fit=exact does not fit either{hint}"
    return ValueError(
        f"RULER {job.task} cannot fit in context_length={job.context_length}: its smallest prompt has "
        f"{tokens} tokens but the budget is {job.budget} ({job.context_length} minus {max_new_tokens} tokens "
        f"reserved for the answer){hint}"
    )


def _fit_all(plan: Plan, job: Job, num_samples: int) -> list[Fit]:
    start = official_start(plan, job) if job.fit == "official" else None
    fits: list[Fit] = []
    guess: int | None = None
    slope: float | None = None
    for i in range(num_samples):
        seed = f"{job.seed}/{i}"
        build, n_min = plan.builder(i, seed)
        if start is not None:
            builds = _attempts(plan, i, seed, build)
            fitted = step_down(builds, job.count, job.budget, start, plan.step, n_min)
        else:
            fitted = fit_prompt(build, job.count, job.budget, n_min, plan.n_max, guess, slope)
            guess, slope = fitted.n, fitted.slope
        fits.append(fitted)
    return fits


def _attempts(plan: Plan, index: int, seed: str, first: Build) -> Callable[[int], Build]:
    """Sample ``index``'s builder per attempt: its own seed first, then ``<seed>/retry<k>``."""

    def builds(attempt: int) -> Build:
        return first if attempt == 0 or not plan.redraw else plan.builder(index, f"{seed}/retry{attempt}")[0]

    return builds
