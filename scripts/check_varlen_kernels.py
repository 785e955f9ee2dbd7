"""Check the fused varlen kernels (PyTorch's ``varlen_attn``, flash-attn's) against the reference path on a GPU.

    python scripts/check_varlen_kernels.py                       # a random-weight Llama-3.1-8B-shaped model, 2 layers
    python scripts/check_varlen_kernels.py --layers 32 --context 8192 --out results/gpu/varlen-kernels-check.json

The same prompt is prefilled and decoded under AdaKV's head-wise allocation (a variable-length cache),
once with ``varlen_kernel=reference`` and once with each fused kernel this machine can run (``torch``:
PyTorch's own, no extra package; ``flash``: the flash-attn package): the kept positions must be identical
(the decisions do not depend on the decode kernel) and the decode logits must agree within bfloat16
tolerance. Needs a CUDA GPU and at least one fused kernel; exits with a message saying what is missing.
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
from restkv.baselines import AdaKV
from restkv.eval.latency.modeling import random_model
from restkv.eval.latency.settings import Settings, model_config
from restkv.stages.allocation import HeadSelection
from restkv.storage.varlen import flash_available, torch_varlen


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
    parser.add_argument("--out", default="results/gpu/varlen-kernels-check.json")
    args = parser.parse_args()
    kernels = [k for k, ok in (("torch", torch_varlen() is not None), ("flash", flash_available())) if ok]
    if not torch.cuda.is_available() or not kernels:
        sys.exit(
            f"this check needs a CUDA GPU and a fused varlen kernel (CUDA available: {torch.cuda.is_available()}, "
            f"PyTorch varlen_attn: {torch_varlen() is not None}, flash_attn installed: {flash_available()}); "
            "nothing was run"
        )
    settings = Settings(name="varlen-kernels-check", shape=args.shape, layers=args.layers, dtype="bfloat16")
    config = model_config(settings)
    model = random_model(config, torch.bfloat16, torch.device("cuda"), seed=0)
    ids = torch.randint(0, config.vocab_size, (1, args.context), generator=torch.Generator().manual_seed(0)).cuda()
    start = time.perf_counter()
    kept_ref, logits_ref = run(model, ids, args.budget, args.steps, "reference")
    result: dict = {
        "shape": args.shape,
        "layers": args.layers,
        "context": args.context,
        "budget": args.budget,
        "steps": args.steps,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "kernels": {},
    }
    for kernel in kernels:
        kept, logits = run(model, ids, args.budget, args.steps, kernel)
        difference = (logits_ref - logits).abs()
        scale = logits_ref.abs().max().item()
        checked = {
            "same_kept_positions": same_positions(kept_ref, kept),
            "max_abs_logit_difference": difference.max().item(),
            "relative_difference": difference.max().item() / scale,
            "same_greedy_tokens": bool((logits_ref.argmax(-1) == logits.argmax(-1)).all()),
        }
        checked["passed"] = checked["same_kept_positions"] and checked["relative_difference"] < 2e-2
        result["kernels"][kernel] = checked
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["passed"] = all(k["passed"] for k in result["kernels"].values())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"written: {out}")
    sys.exit(0 if result["passed"] else 1)


if __name__ == "__main__":
    main()
