"""Benchmark throughput of the run path: RULER samples per hour and decode ms per token against the bound.

What ``eval/run.py`` spends its time on, measured side by side in one process: for each context length,
policy and decode path (``eager``: the model's own loop; ``graph``: the step recorded once and replayed,
`restkv.decoding.static_decoder`), the same prompts are prefilled, evicted and answered by the harness's own
`answer`. Each
configuration first answers one untimed prompt (warm-up, and the recording for ``graph``). Reported per
row: mean prefill and decode seconds per sample, samples per hour, decode ms per token and its memory-
bandwidth bound (the weights plus the evicted cache, over the measured copy bandwidth), and the tokens of
every path compared with the eager path's. Then batched decoding (``decode_batch``, `restkv.decoding.rows`): the same
``--batch-samples`` prompts answered with 1, 8, 32 ... prompts per decode step, samples per hour over the whole
pass (prefills, one recording and decoding, wall clock), and whether the answers equal those of batch 1.

    python scripts/throughput.py --model-dir /tmp/llama-shape --lengths 8192 32768 --out results/gpu/throughput.json
    python scripts/throughput.py --dry-run          # the micro model on a CPU, toy sizes (checks the script)

``--model-dir`` is a folder with a model's ``config.json`` and a tokenizer: random weights are built on the
device (no download), as ``scripts/gpu_check.sh`` does for the Llama-3.1-8B shape.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from restkv import compress, get_policy
from restkv.devices import model_devices, pick_device, synchronize
from restkv.eval.benchmarks.ruler import RulerBenchmark
from restkv.eval.evaluation.base import Session
from restkv.eval.evaluation.batched import batched_answers
from restkv.eval.evaluation.decoding import answer, check_decode
from restkv.eval.evaluation.prompting import PromptTokens, tokenize
from restkv.eval.latency.bounds import bound_ms, measure_bandwidth
from restkv.eval.models.loading import eos_token_ids, load_model, load_tokenizer
from restkv.eval.models.spec import ModelSpec

TASKS = ["niah_single_1", "vt"]


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", default="models/micro-llama", help="config.json + tokenizer (random weights)")
    parser.add_argument("--random-init", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--policies", nargs="+", default=["snapkv", "restkv"])
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--paths", nargs="+", default=["eager", "graph"], help="decode paths (restkv.choices)")
    parser.add_argument("--samples", type=int, default=2, help="timed prompts per length (one more as warm-up)")
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 8, 32], help="decode_batch sizes to compare")
    parser.add_argument("--batch-lengths", type=int, nargs="*", default=[8192], help="lengths of the batched passes")
    parser.add_argument("--batch-samples", type=int, default=32, help="prompts of each batched pass")
    parser.add_argument("--batch-policy", default="restkv")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default="results/gpu/throughput.json")
    parser.add_argument("--dry-run", action="store_true", help="the micro model on a CPU at toy sizes")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.random_init, args.lengths, args.budget, args.samples = False, [1024], 64, 1
        args.device, args.dtype, args.paths = "cpu", "float32", ["eager", "static"]
        args.batches, args.batch_lengths, args.batch_samples = [1, 2], [1024], 3
    if args.samples < 1 or args.budget < 2 or min(args.lengths) < 256:
        parser.error("--samples must be >= 1, --budget >= 2 and every length >= 256")
    return args


def prompts(tokenizer: Any, length: int, count: int, max_context: int) -> list[tuple[PromptTokens, int]]:
    """``count`` RULER prompts of about ``length`` tokens (tasks alternating), with their answer lengths."""
    bench = RulerBenchmark(tasks=TASKS, lengths=[length], samples=-(-count // len(TASKS)), fit="exact", hub=False)
    samples = list(bench.load_samples(tokenizer))[:count]
    return [(tokenize(s, tokenizer, False, max_context), s.max_new_tokens) for s in samples]


def timed(model: Any, policy: str, budget: int, path: str, work: list[tuple[PromptTokens, int]], eos: set[int]):
    """Per prompt: prefill and decode seconds, decode steps and tokens (the first prompt is the untimed warm-up)."""
    rows = []
    with compress(model, get_policy(policy), budget) as compressor:
        for index, (prompt, max_new) in enumerate(work):
            reply = answer(model, prompt, compressor, "query_aware", max_new, eos, path)
            if index == 0:
                continue
            rows.append(
                {
                    "prefill_seconds": reply.prefill_seconds,
                    "decode_seconds": reply.decode_seconds,
                    "decode_steps": reply.decode_steps,
                    "tokens": reply.tokens,
                    "decode_path": reply.decode_path,
                }
            )
    return rows


def batched_pass(model: Any, policy: str, budget: int, rows: int, work: list[tuple[PromptTokens, int]], eos: set[int]):
    """Answers of ``work`` decoded ``rows`` prompts per step (recorded on CUDA), and the pass's wall seconds."""
    decode = "auto" if model.device.type == "cuda" else "static"
    with compress(model, get_policy(policy), budget) as compressor:
        session = Session(model, None, compressor, "query_aware", eos, decode)
        items = [(index, prompt, max_new) for index, (prompt, max_new) in enumerate(work)]
        synchronize(*model_devices(model))
        started = time.perf_counter()
        answers = [reply.tokens for _, reply, _ in batched_answers(session, items, rows, dict)]
        synchronize(*model_devices(model))
    return answers, time.perf_counter() - started


def summarize(rows: list[dict], step_bytes: float, gbps: float) -> dict[str, Any]:
    prefill = statistics.mean(r["prefill_seconds"] for r in rows)
    decode = statistics.mean(r["decode_seconds"] for r in rows)
    steps = sum(r["decode_steps"] for r in rows)
    per_token = 1e3 * sum(r["decode_seconds"] for r in rows) / max(steps, 1)
    bound = bound_ms(step_bytes, gbps)
    return {
        "samples": len(rows),
        "decode_path": rows[0]["decode_path"],
        "prefill_seconds_mean": round(prefill, 4),
        "decode_seconds_mean": round(decode, 4),
        "samples_per_hour": round(3600 / (prefill + decode), 1),
        "decode_ms_per_token": round(per_token, 3),
        "bound_ms_per_token": round(bound, 3),
        "decode_over_bound": round(per_token / bound, 3),
    }


def batched_rows(args: argparse.Namespace, model: Any, tokenizer: Any, eos: list[int], max_context: int) -> list:
    """One row per (prompt length, prompts per decode step): samples per hour, and whether the answers match the
    first setting's."""
    batched = []
    for length in args.batch_lengths:
        work = prompts(tokenizer, length, args.batch_samples, max_context)
        first: list | None = None
        for rows in args.batches:
            answers, seconds = batched_pass(model, args.batch_policy, args.budget, rows, work, eos)
            first = answers if first is None else first
            row = {
                "length": length,
                "policy": args.batch_policy,
                "budget": args.budget,
                "decode_batch": rows,
                "samples": len(work),
                "wall_seconds": round(seconds, 2),
                "samples_per_hour": round(3600 * len(work) / seconds, 1),
                "same_answers_as_first": answers == first,
            }
            batched.append(row)
            print(json.dumps(row), flush=True)
    return batched


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    device = pick_device(args.device)
    for path in args.paths:
        check_decode(path, device)
    spec = ModelSpec(name="throughput", path=args.model_dir, dtype=args.dtype, random_init=args.random_init)
    tokenizer = load_tokenizer(spec)
    model = load_model(spec, device)
    eos = eos_token_ids(model, tokenizer)
    bandwidth = measure_bandwidth(device, 1024 if device.type == "cuda" else 256, 5)
    config = model.config
    token_bytes = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * model.dtype.itemsize
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    results = []
    for length in args.lengths:
        work = prompts(tokenizer, length, args.samples + 1, spec.max_context)
        for policy in args.policies:
            tokens: dict[str, list] = {}
            for path in args.paths:
                started = time.perf_counter()
                rows = timed(model, policy, args.budget, path, work, eos)
                step_bytes = parameter_bytes + token_bytes * args.budget  # the evicted cache, read every step
                row = {"length": length, "policy": policy, "budget": args.budget, "path": path}
                row.update(summarize(rows, step_bytes, bandwidth["copy_gbps"]))
                row["wall_seconds"] = round(time.perf_counter() - started, 2)
                tokens[path] = [r["tokens"] for r in rows]
                row["same_tokens_as_eager"] = tokens[path] == tokens.get("eager", tokens[path])
                results.append(row)
                print(json.dumps(row), flush=True)
    batched = batched_rows(args, model, tokenizer, eos, spec.max_context)
    record = {
        "device": str(device),
        "torch": torch.__version__,
        "model_dir": args.model_dir,
        "dtype": args.dtype,
        "bandwidth": bandwidth,
        "rows": results,
        "batched": batched,
        "method": "means over the timed prompts (one untimed warm-up each); decode ms/token = decode seconds / decode "
        "steps; bound = (parameter bytes + budget x per-token cache bytes) / copy bandwidth",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"throughput: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
