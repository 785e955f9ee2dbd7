"""Check, on this machine, every fast path the library takes by default against its eager path, on every layout.

    python scripts/check_fast_paths.py --out results/gpu/fast-paths.json   # a GPU: Llama-3.1-8B shape, 4 layers
    python scripts/check_fast_paths.py --dry-run                           # a toy shape on a CPU (the script only)

On CUDA ``decode=auto`` records the decode step (`restkv.decoding.static_decoder`), the ``auto`` varlen kernel is a
fused one and
ReST-KV's distances take the direct path; each is checked once per signature against the eager path and falls
back to it, saying why, where it fails or disagrees (`restkv.fastpath`). Here one random-weight prompt per case
goes through the harness's own `answer` (and batched rows through `batched_answers`) with ``decode=auto``, for
the dense compressed cache (SnapKV, ReST-KV), the full cache, the head-wise varlen cache (AdaKV, Ada-ReST-KV)
and the masked one, and with ``decode=eager``. A row passes when no fallback happened and the answer is the
eager one (or first parts from it at a near tie). Any fallback on a GPU is a finding: the run still answers
right, but slower; the reason printed names the piece to fix. Exits 1 when any row fails.
On a CPU nothing is recorded or fused, so the rows only check the script runs (every path is the eager one).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from restkv import compress, get_policy
from restkv.eval.evaluation.base import Session
from restkv.eval.evaluation.batched import batched_answers
from restkv.eval.evaluation.decoding import TIE_MARGIN, answer
from restkv.eval.evaluation.prompting import PromptTokens
from restkv.eval.latency.modeling import random_model
from restkv.eval.latency.settings import Settings, model_config
from restkv.fastpath import CHECKS

CASES = [  # (label, policy, layout)
    ("dense snapkv", "snapkv", "auto"),
    ("dense restkv", "restkv", "auto"),
    ("full cache", "full", "auto"),
    ("varlen adakv", "adakv", "auto"),
    ("varlen ada_restkv", "ada_restkv", "auto"),
    ("masked adakv", "adakv", "masked"),
]


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama-3.1-8b", help="configs/shapes/<shape>.json (random weights)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--budget", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=32, help="answer length (no EOS: random weights)")
    parser.add_argument("--rows", type=int, default=4, help="prompts of the batched check")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--dry-run", action="store_true", help="a toy shape on a CPU: checks the script only")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.shape, args.layers, args.context, args.budget, args.tokens = "tiny-llama", 2, 256, 64, 6
        args.rows, args.device, args.dtype = 3, "cpu", "float32"
    return args


def prompts(count: int, context: int, vocab: int, seed: int) -> list[PromptTokens]:
    generator = torch.Generator().manual_seed(seed)
    return [
        PromptTokens(context=torch.randint(3, vocab, (context - 8 * k,), generator=generator).tolist(), query=[5, 7, k])
        for k in range(count)
    ]


def one_case(model: Any, label: str, policy: str, layout: str, args: argparse.Namespace) -> dict[str, Any]:
    """``decode=auto`` against ``decode=eager`` on one prompt, then batched rows, for one policy and layout."""
    CHECKS.clear()
    prompt, *_ = prompts(1, args.context, model.config.vocab_size, 0)
    replies = {}
    for decode in ("eager", "auto"):
        with compress(model, get_policy(policy, window=8), args.budget, layout=layout) as compressor:
            replies[decode] = answer(model, prompt, compressor, "query_agnostic", args.tokens, set(), decode)
    one_prompt = CHECKS.drain()
    batch = prompts(args.rows, args.context, model.config.vocab_size, 1)
    with compress(model, get_policy(policy, window=8), args.budget, layout=layout) as compressor:
        session = Session(model, None, compressor, "query_agnostic", set(), "auto")
        work = [(i, p, args.tokens) for i, p in enumerate(batch)]
        batched = list(batched_answers(session, work, args.rows, dict))
    fallbacks = list(dict.fromkeys([*one_prompt, *(m for _, _, e in batched for m in e.get("fallbacks", []))]))
    same = replies["auto"].tokens == replies["eager"].tokens
    return {
        "case": label,
        "policy": policy,
        "layout": layout,
        "path": replies["auto"].decode_path,
        "batched_paths": sorted({reply.decode_path for _, reply, _ in batched}),
        "same_tokens_as_eager": same,
        "fallbacks": fallbacks,
        "checks": [{"kind": v.kind, "fast": v.fast, "ok": v.ok, "reason": v.reason} for v in CHECKS.verdicts.values()],
        "passed": not fallbacks,
    }


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    settings = Settings(name="fast-paths", shape=args.shape, layers=args.layers, dtype=args.dtype, device=args.device)
    device = settings.resolved_device()
    model = random_model(model_config(settings), settings.torch_dtype, device, 0)
    rows = [one_case(model, *case, args) for case in CASES]
    record = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": args.shape,
        "layers": args.layers,
        "dtype": args.dtype,
        "context": args.context,
        "budget": args.budget,
        "tokens": args.tokens,
        "tie_margin": TIE_MARGIN.get(settings.torch_dtype),
        "rows": rows,
    }
    for row in rows:
        flag = "ok  " if row["passed"] else "FAIL"
        print(
            f"{flag} {row['case']:<20} path={row['path']:<6} batched={','.join(row['batched_paths']) or '-':<6} "
            f"same tokens={row['same_tokens_as_eager']} {'; '.join(row['fallbacks'])}"
        )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0 if all(row["passed"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
