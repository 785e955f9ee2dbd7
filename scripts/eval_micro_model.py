"""Accuracy of ``models/micro-llama`` per task and length, with the full cache or under eviction.

Prompts are the micro suite's (``restkv.eval.benchmarks.micro.benchmark``, ``bench=micro``: RULER's tasks in
cued templates, plus passkey), RULER's (``restkv.eval.benchmarks.ruler.generate``: RULER's templates)
and the key-value retrieval prompt of the training (:mod:`restkv.microtrain.samples`), with the bundled
evaluation novel *Emma* as the essay haystack, all from evaluation seeds (small integers; training used
seeds >= 10**6 and the training novel). Each sample is answered greedily, as ``eval/run.py``
answers it (query-aware protocol, no chat template), and scored with RULER's
``string_match_all``. Reported per (policy, length, task):

* ``exact``: share of samples whose answer contains every reference;
* ``score``: RULER's score (mean over samples of the share of references found);
* ``token``: teacher-forced per-token accuracy of the trained answer (``target_text``) under the
  same cache: how many of its tokens are the argmax given the gold prefix;
* ``mid_exact``: ``exact`` over the samples whose needles all lie at depths 20-80 %.

    python scripts/eval_micro_model.py --lengths 4096 --samples 50
    python scripts/eval_micro_model.py --lengths 4096 --samples 25 --tasks niah_single_1,niah_multikey_2 \\
        --policies full,streamingllm,snapkv,restkv --budget 128
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from restkv import compress
from restkv.eval.benchmarks import micro, ruler
from restkv.eval.benchmarks.contract.sample import Sample
from restkv.eval.benchmarks.ruler.metrics import ruler_string_match_all
from restkv.eval.evaluation.decoding import answer, teacher_forced_logprobs
from restkv.eval.evaluation.prompting import tokenize
from restkv.eval.harness.config_tree import configured_policy
from restkv.microtrain.config import EXPORT_DIR
from restkv.microtrain.samples import EXTRA_TASKS, KV_MAX_NEW_TOKENS, kv_retrieval_sample, target_text
from restkv.microtrain.samples import TASKS as RULER_AND_EXTRA_TASKS
from restkv.policy import Policy

DEFAULT_MODEL = EXPORT_DIR
TASKS = (*micro.TASKS, *(t for t in RULER_AND_EXTRA_TASKS if t not in micro.TASK_CONFIGS))
"""The micro suite (``bench=micro``), then RULER's needle tasks and ``vt``, then key-value retrieval."""


def samples_for(
    task: str,
    tokenizer: PreTrainedTokenizerBase,
    length: int,
    count: int,
    seed: int,
    fit: str = "official",
    words: str = "wonderwords",
    sentences: str = "auto",
) -> list[Sample]:
    """``count`` evaluation samples of ``task`` at ``length`` tokens (prompt + answer room).

    ``fit``, ``words`` and ``sentences`` choose RULER's generator settings (the default: the official
    generator's; ``exact``, ``bundled`` and ``rules``: what the micro model was trained on and the
    earlier default).
    """
    if task in micro.TASK_CONFIGS:
        return micro.generate(task, tokenizer, length, count, seed)
    if task == "kv_retrieval":
        return [kv_retrieval_sample(tokenizer, length, seed, i) for i in range(count)]
    samples = ruler.generate(task, tokenizer, length, count, seed, fit=fit, words=words, sentences=sentences)
    for sample in samples:
        sample.chat_template = False
    return samples


def load(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (SDPA attention, evaluation mode) and tokenizer of a Hugging Face folder."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(device).eval()
    return model, tokenizer


def max_new_tokens(task: str) -> int:
    """The answer room of ``task``: the micro suite's, the key-value prompt's or RULER's."""
    if task in micro.TASK_CONFIGS:
        return micro.max_new_tokens(task)
    if task == "kv_retrieval":
        return KV_MAX_NEW_TOKENS
    return ruler.max_new_tokens(task)


@torch.no_grad()
def run_sample(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sample: Sample, policy: Policy, budget: int
) -> dict[str, Any]:
    """Greedy answer and teacher-forced token accuracy of one sample under ``policy``."""
    prompt = tokenize(sample, tokenizer, chat=False, max_context=10**9)
    eos = {tokenizer.eos_token_id}
    target = tokenizer(target_text(sample), add_special_tokens=False)["input_ids"]
    with compress(model, policy, budget) as compressor:
        reply = answer(model, prompt, compressor, "query_aware", sample.max_new_tokens, eos)
        logprobs = teacher_forced_logprobs(model, prompt, compressor, "query_aware", [target])[0]
    prediction = tokenizer.decode(reply.tokens, skip_special_tokens=True)
    score = ruler_string_match_all(prediction, sample.references)
    hits = (logprobs.argmax(-1) == torch.tensor(target, device=logprobs.device)).float()
    return {
        "id": sample.id,
        "task": sample.task,
        "prompt_tokens": prompt.length,
        "depths": sample.meta.get("depths", []),
        "prediction": prediction,
        "references": sample.references,
        "score": score,
        "exact": float(score == 1.0),
        "token": float(hits.mean()),
        "first_token": float(hits[0]),
        "seconds": round(reply.prefill_seconds + reply.decode_seconds, 3),
    }


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Means of one (policy, length, task) cell's records, and ``exact`` over its mid-depth samples."""

    def mean(values: list[float]) -> float | None:
        return round(sum(values) / len(values), 4) if values else None

    mid = [r for r in records if r["depths"] and all(0.2 <= d <= 0.8 for d in r["depths"])]
    return {
        "n": len(records),
        "exact": mean([r["exact"] for r in records]),
        "score": mean([r["score"] for r in records]),
        "token": mean([r["token"] for r in records]),
        "first_token": mean([r["first_token"] for r in records]),
        "mid_n": len(mid),
        "mid_exact": mean([r["exact"] for r in mid]),
    }


def main() -> None:
    """Evaluate every (length, task, policy) cell, print each, and write them with ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--lengths", default="4096", help="comma-separated context lengths (RULER's definition)")
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, from {', '.join(TASKS)}")
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0, help="evaluation seed (training used seeds >= 10**6)")
    parser.add_argument("--policies", default="full", help="comma-separated names from configs/policy")
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--ruler-fit", default="official", choices=ruler.FITS, help="RULER prompts' length fit")
    parser.add_argument("--ruler-words", default="wonderwords", choices=ruler.VOCABULARIES, help="RULER keys' words")
    parser.add_argument(
        "--ruler-sentences", default="auto", choices=ruler.SENTENCE_SPLITTERS, help="RULER essays' sentence splitter"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="torch device (e.g. cuda); the recorded scores are the CPU's")
    parser.add_argument("--out", default=None, help="JSON file for every record and the summary")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model, device=args.device)
    lengths = [int(x) for x in args.lengths.split(",")]
    tasks = args.tasks.split(",")
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise SystemExit(f"unknown task(s) {unknown}; known: {TASKS}")
    policies = {name: configured_policy(name) for name in args.policies.split(",")}  # unknown names fail first
    records: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for length in lengths:
        for task in tasks:
            samples = samples_for(
                task, tokenizer, length, args.samples, args.seed, args.ruler_fit, args.ruler_words, args.ruler_sentences
            )
            for name, policy in policies.items():
                start = time.time()
                rows = []
                for sample in samples:
                    row = run_sample(model, tokenizer, sample, policy, args.budget)
                    row.update(policy=name, length=length)
                    rows.append(row)
                records.extend(rows)
                result = summarize(rows)
                summary[f"{name}/{length}/{task}"] = result
                print(
                    f"{name:12s} {length:5d} {task:16s} n={result['n']:3d} exact={result['exact']:.3f} "
                    f"score={result['score']:.3f} token={result['token']:.3f} first={result['first_token']:.3f} "
                    f"mid_exact={result['mid_exact']} (n={result['mid_n']}) {time.time() - start:.0f}s",
                    flush=True,
                )
    config = {k: v for k, v in vars(args).items() if k != "out"}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"config": config, "summary": summary, "records": records}, indent=1))
    print(json.dumps(summary, indent=1))


__all__ = ["EXTRA_TASKS", "load", "max_new_tokens", "run_sample", "samples_for", "summarize"]

if __name__ == "__main__":
    main()
