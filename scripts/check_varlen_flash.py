"""Check flash-attn's varlen kernel against the reference varlen path on a GPU, and record the result.

    python scripts/check_varlen_flash.py                         # a random-weight Llama-3.1-8B-shaped model, 2 layers
    python scripts/check_varlen_flash.py --layers 32 --context 8192 --out results/summaries/varlen-flash-check.json

The same prompt is prefilled and decoded twice under AdaKV's head-wise allocation (a variable-length
cache), once with ``varlen_kernel=reference`` and once with ``varlen_kernel=flash``: the kept
positions must be identical (the decisions do not depend on the decode kernel) and the decode
logits must agree within bfloat16 tolerance. Needs a CUDA GPU and the ``flash_attn`` package; exits
with a message saying which is missing otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from restkv import compress
from restkv.allocation import HeadSelection
from restkv.baselines import AdaKV
from restkv.eval.latency.modeling import random_model
from restkv.eval.latency.settings import Settings, model_config
from restkv.varlen import flash_available


def run(model, ids: torch.Tensor, budget: int, steps: int, kernel: str) -> tuple[list, torch.Tensor]:
    """(kept positions per layer, decode logits [steps, vocab]) under AdaKV with ``kernel``."""
    cache = DynamicCache(config=model.config)
    logits = []
    with torch.no_grad(), compress(model, AdaKV(), budget, decode_reserve=steps, varlen_kernel=kernel) as compressor:
        last = model(ids, cache=cache, logits_to_keep=1).logits[0, -1]
        token = last.argmax().view(1, 1)
        for step in range(steps):
            position = torch.tensor([[ids.shape[1] + step]], device=ids.device)
            last = model(token, cache=cache, position_ids=position, logits_to_keep=1).logits[0, -1]
            logits.append(last.float())
            token = last.argmax().view(1, 1)  # both runs decode the same tokens only if they agree
    return list(compressor.record.indices), torch.stack(logits)


def same_positions(a: list, b: list) -> bool:
    def flat(selection: object) -> torch.Tensor:
        return selection.positions if isinstance(selection, HeadSelection) else torch.as_tensor(selection)

    return all(torch.equal(flat(x).cpu(), flat(y).cpu()) for x, y in zip(a, b, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="llama-3.1-8b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", default="results/summaries/varlen-flash-check.json")
    args = parser.parse_args()
    if not torch.cuda.is_available() or not flash_available():
        sys.exit(
            f"this check needs a CUDA GPU and flash_attn (CUDA available: {torch.cuda.is_available()}, "
            f"flash_attn installed: {flash_available()}); nothing was run"
        )
    settings = Settings(name="varlen-flash-check", shape=args.shape, layers=args.layers, dtype="bfloat16")
    config = model_config(settings)
    model = random_model(config, torch.bfloat16, torch.device("cuda"), seed=0)
    ids = torch.randint(0, config.vocab_size, (1, args.context), generator=torch.Generator().manual_seed(0)).cuda()
    start = time.perf_counter()
    kept_ref, logits_ref = run(model, ids, args.budget, args.steps, "reference")
    kept_flash, logits_flash = run(model, ids, args.budget, args.steps, "flash")
    difference = (logits_ref - logits_flash).abs()
    scale = logits_ref.abs().max().item()
    result = {
        "shape": args.shape,
        "layers": args.layers,
        "context": args.context,
        "budget": args.budget,
        "steps": args.steps,
        "device": torch.cuda.get_device_name(),
        "same_kept_positions": same_positions(kept_ref, kept_flash),
        "max_abs_logit_difference": difference.max().item(),
        "max_logit": scale,
        "relative_difference": difference.max().item() / scale,
        "same_greedy_tokens": bool((logits_ref.argmax(-1) == logits_flash.argmax(-1)).all()),
        "seconds": round(time.perf_counter() - start, 1),
    }
    result["passed"] = result["same_kept_positions"] and result["relative_difference"] < 2e-2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"written: {out}")
    sys.exit(0 if result["passed"] else 1)


if __name__ == "__main__":
    main()
