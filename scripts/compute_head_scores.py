"""Compute HeadKV's head-importance file (retrieval-head scores) for a model.

    python scripts/compute_head_scores.py --model models/micro-llama --out models/micro-llama/head_scores.json
    python scripts/compute_head_scores.py --model meta-llama/Llama-3.1-8B-Instruct --lengths 4096 8192 \\
        --device cuda --dtype bfloat16 --out heads/llama-3.1-8b.json

Then ``python eval/run.py model=... policy=headkv policy.head_scores=<the file>``. What is measured
is `eval.retrieval_heads`'s docstring: teacher-forced copy-the-needle probes, one score per probe
for every (layer, query head).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eval.paths import local_path
from eval.retrieval_heads import build_probes, retrieval_scores, write_head_scores
from restkv.devices import DTYPES, pick_device, torch_dtype


def load(model: str, device: torch.device, dtype: torch.dtype):
    """Model (sdpa attention, eval mode) and tokenizer from a local folder or a hub id."""
    where = local_path(model) or model
    tokenizer = AutoTokenizer.from_pretrained(where)
    loaded = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, attn_implementation="sdpa")
    return loaded.to(device).eval(), tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="hub id or local folder")
    parser.add_argument("--out", required=True, help="where to write the head file (JSON)")
    parser.add_argument("--lengths", nargs="+", type=int, default=[1024, 2048], help="probe lengths in tokens")
    parser.add_argument("--depths", nargs="+", type=float, default=[0.1, 0.3, 0.5, 0.7, 0.9])
    parser.add_argument("--samples", type=int, default=2, help="probes per (length, depth)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--haystack", default=None, help="a bundled haystack name or a folder/file of text")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument(
        "--require-correct", action="store_true", help="count a copy only where the model predicts the token itself"
    )
    args = parser.parse_args(argv)
    try:
        device = pick_device(args.device, "--device")
        model, tokenizer = load(args.model, device, torch_dtype(args.dtype, "--dtype"))
        probes = build_probes(tokenizer, args.lengths, args.depths, args.samples, args.seed, args.haystack)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    scores = retrieval_scores(model, probes, require_correct=args.require_correct)
    path = write_head_scores(args.out, scores)
    means = sorted(((sum(v) / len(v), k) for k, v in scores.items()), reverse=True)
    print(f"{len(probes)} probes in {time.perf_counter() - start:.0f} s; wrote {path} ({len(scores)} heads)")
    print("top heads (layer-head: mean score): " + ", ".join(f"{k}: {m:.3f}" for m, k in means[:10]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
