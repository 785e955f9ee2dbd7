"""The prompts the micro model is trained and evaluated on, and the answer it is taught for each.

RULER's needle tasks and variable tracking come from RULER's own builders
(:mod:`restkv.eval.benchmarks.ruler`), the micro suite's cued tasks and passkey from
:mod:`restkv.eval.benchmarks.micro.benchmark`; key-value (JSON) retrieval and the recall drills are defined here.
Every sample is fitted to its length by RULER's search, so all tasks share one notion of length.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Mapping

from transformers import PreTrainedTokenizerBase

from restkv.eval.benchmarks import micro, ruler
from restkv.eval.benchmarks.contract.sample import Sample
from restkv.eval.benchmarks.micro.benchmark import passkey_sample

PASSKEY_MAX_NEW_TOKENS = micro.max_new_tokens("passkey")

KV_PREAMBLE = "Extract the value corresponding to the specified key in the JSON object below.\n\nJSON data:\n"
KV_QUESTION = '\n\nKey: "{key}"\nCorresponding value:'
KV_MAX_NEW_TOKENS = 64

EXTRA_TASKS = ("passkey", "kv_retrieval")
"""The tasks not in RULER: passkey retrieval (:mod:`restkv.eval.benchmarks.micro.benchmark`) and key-value (JSON)
retrieval."""

RECALL_MAX_NEW_TOKENS = 16

RULER_TASKS = tuple(t for t in ruler.TASKS if t.startswith("niah_") or t == "vt")
"""RULER's needle tasks and variable tracking (the retrieval and tracking tasks; no aggregation, no QA)."""
TASKS = (*RULER_TASKS, *EXTRA_TASKS)
"""Every task the model is trained and evaluated on (plus ``copy``, training only)."""


def random_uuid(rng: random.Random) -> str:
    """A version-4 UUID from ``rng`` (not from the OS), so that prompts depend on their seed alone."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def fitted_sample(
    task: str,
    build: Callable[[int], ruler.Draft],
    tokenizer: PreTrainedTokenizerBase,
    context_length: int,
    seed: int,
    index: int,
    max_new_tokens: int,
    min_items: int,
    metric: str = "string_match_all",
) -> Sample:
    """The longest prompt ``build`` makes (RULER's fitting) that leaves ``max_new_tokens`` of ``context_length``."""
    budget = context_length - max_new_tokens
    fit = ruler.fit_prompt(build, ruler.TokenCounter(tokenizer), budget, min_items, 4 * budget + 16)
    meta = {"context_length": context_length, "seed": seed}
    sample_id = f"{task}/{context_length}/{seed}/{index}"
    return fit.sample(sample_id, task, max_new_tokens, metric, meta, chat_template=False)


def kv_retrieval_sample(tokenizer: PreTrainedTokenizerBase, context_length: int, seed: int, index: int = 0) -> Sample:
    """Key-value retrieval (Liu et al. 2023, "Lost in the Middle"): a JSON object of UUID pairs."""
    sample_seed = f"kv_retrieval/{seed}/{index}"

    def build(n: int) -> ruler.Draft:
        rng = random.Random(sample_seed)
        pairs = [(random_uuid(rng), random_uuid(rng)) for _ in range(max(n, 1))]
        pick = rng.randrange(len(pairs))
        body = ",\n ".join(f'"{k}": "{v}"' for k, v in pairs)
        return ruler.Draft(
            context=KV_PREAMBLE + "{" + body + "}",
            question=KV_QUESTION.format(key=pairs[pick][0]),
            answer_prefix="",
            references=[pairs[pick][1]],
            depths=[pick / len(pairs)],
        )

    return fitted_sample("kv_retrieval", build, tokenizer, context_length, seed, index, KV_MAX_NEW_TOKENS, min_items=1)


def recall_sample(
    tokenizer: PreTrainedTokenizerBase,
    context_length: int,
    seed: int,
    index: int = 0,
    task: str = "recall",
    *,
    gap: str,
) -> Sample:
    """A training-only drill: lines ``key<gap> value`` (RULER's word keys and 7-digit values), then ``key<gap>``.

    ``gap`` is the recipe's text between a key and its value for this drill
    (:attr:`restkv.microtrain.recipes.Recipe.recall_gaps`): with none, an induction head finds the value
    from the key alone; each token of gap must be bridged.
    """
    sample_seed = f"recall/{seed}/{index}"

    def build(n: int) -> ruler.Draft:
        rng = random.Random(sample_seed)
        keys: list[str] = []
        while len(keys) < max(n, 1):
            key = ruler.random_value(rng, "words")
            if key not in keys:
                keys.append(key)
        values = [ruler.random_value(rng, "numbers") for _ in keys]
        pick = rng.randrange(len(keys))
        return ruler.Draft(
            context="\n".join(f"{k}{gap} {v}" for k, v in zip(keys, values, strict=True)),
            question=f"\n{keys[pick]}{gap}",
            answer_prefix="",
            references=[values[pick]],
            depths=[pick / len(keys)],
        )

    return fitted_sample(task, build, tokenizer, context_length, seed, index, RECALL_MAX_NEW_TOKENS, min_items=1)


def essay_window(essay: ruler.Essay, rng: random.Random, words: int = 6000) -> ruler.Essay:
    """A ``ruler.Essay`` of ``words`` words starting at a random sentence start of ``essay``.

    Training essays are random windows of the training novel, so that a haystack is rarely seen twice.
    """
    size = len(essay.words)
    starts = [e + 1 for e in essay.ends if e + 1 + words <= size]
    start = rng.choice(starts) if starts else 0
    stop = min(size, start + words)
    ends = tuple(e - start for e in essay.ends if start <= e < stop - 1)
    return ruler.Essay(essay.words[start:stop], ends)


def ruler_sample(
    task: str,
    tokenizer: PreTrainedTokenizerBase,
    context_length: int,
    seed: int,
    essay: ruler.Essay | None = None,
    index: int = 0,
) -> Sample:
    """One RULER sample, built as :func:`restkv.eval.benchmarks.ruler.generate` builds it with ``fit="exact"``,
    ``words="bundled"`` and ``sentences="rules"`` (what the micro model was trained on).

    The only difference: essay haystacks come from ``essay`` (a ``ruler.Essay``), so that
    training can use random windows of the training novel.
    """
    if task not in RULER_TASKS:
        raise ValueError(f"task {task} is not trained")
    cfg = ruler.task_config(task)
    family = ruler.FAMILIES[cfg.family]
    job = ruler.Job(
        task=task,
        context_length=context_length,
        budget=context_length - family.max_new_tokens,
        seed=f"ruler/{task}/{seed}",
        count=ruler.TokenCounter(tokenizer),
        data=ruler.RulerData(essay=essay),
        words=ruler.vocabulary("bundled"),
        sentences="rules",
        fit="exact",
    )
    build, n_min = cfg.plan(job).builder(index, f"{job.seed}/{index}")
    return fitted_sample(
        task, build, tokenizer, context_length, seed, index, family.max_new_tokens, n_min, family.metric
    )


def make_sample(
    task: str,
    tokenizer: PreTrainedTokenizerBase,
    prompt_tokens: int,
    seed: int,
    essay: ruler.Essay | None = None,
    recall_gaps: Mapping[str, str] | None = None,
) -> Sample:
    """A sample of ``task`` whose prompt has about ``prompt_tokens`` tokens (answer room excluded).

    ``recall_gaps`` are the recipe's recall drills (drill name -> gap); other tasks do not need them.
    """
    if task == "passkey":
        return passkey_sample(tokenizer, prompt_tokens + PASSKEY_MAX_NEW_TOKENS, seed)
    if task == "kv_retrieval":
        return kv_retrieval_sample(tokenizer, prompt_tokens + KV_MAX_NEW_TOKENS, seed)
    if recall_gaps and task in recall_gaps:
        return recall_sample(tokenizer, prompt_tokens + RECALL_MAX_NEW_TOKENS, seed, task=task, gap=recall_gaps[task])
    if task in micro.TASK_CONFIGS:
        return micro.sample(task, tokenizer, prompt_tokens + micro.max_new_tokens(task), seed, essay=essay)
    family = ruler.FAMILIES[ruler.TASK_CONFIGS[task].family]
    return ruler_sample(task, tokenizer, prompt_tokens + family.max_new_tokens, seed, essay)


def target_text(sample: Sample) -> str:
    """The answer the model is taught to give after the answer prefix (EOS follows).

    Several values: in the order of the question's keys (multi-query) or of their appearance in
    the context; ``"v1, v2, v3, and v4."``. Variable tracking: the chain's names in order,
    space-separated, as RULER's in-context example answers.
    """
    if sample.task in micro.TASK_CONFIGS and sample.task != "passkey":
        return micro.trained_answer(sample)
    refs = list(sample.references)
    if sample.task == "vt":
        return " ".join(refs)
    if sample.task != "niah_multiquery":
        refs.sort(key=lambda r: sample.context.find(r))
    if len(refs) == 1:
        return f" {refs[0]}."
    return " " + ", ".join(refs[:-1]) + ", and " + refs[-1] + "."
