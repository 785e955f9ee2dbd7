"""Compute HeadKV's head-importance file (retrieval-head scores) for a model.

    python scripts/compute_head_scores.py --model models/micro-llama --out models/micro-llama/head_scores.json
    python scripts/compute_head_scores.py --model meta-llama/Llama-3.1-8B-Instruct --lengths 4096 8192 \\
        --device cuda --dtype bfloat16 --out heads/llama-3.1-8b.json

Then ``python eval/run.py model=... policy=headkv policy.head_scores=<the file>``. What is measured
is `restkv.eval.probes.retrieval_heads`'s docstring: teacher-forced copy-the-needle probes, one score per probe
for every (layer, query head). The model is loaded by the project's loader (`restkv.eval.models.loading`, sdpa
attention); every setting is checked, and a wrong one named, before the weights are loaded.
"""

from __future__ import annotations

import argparse
import sys
import time

from restkv.devices import DTYPES, pick_device
from restkv.eval.models.loading import load_model, load_tokenizer, resolve
from restkv.eval.models.spec import ModelSpec, check_model
from restkv.eval.probes.retrieval_heads import build_probes, check_probe_settings, retrieval_scores, write_head_scores
from restkv.integrate import SUPPORTED_MODELS


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see ``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="hub id (owner/name) or local model folder")
    parser.add_argument("--out", required=True, help="where to write the head file (JSON)")
    parser.add_argument(
        "--lengths", nargs="+", type=int, default=[1024, 2048], help="probe lengths in tokens (default: 1024 2048)"
    )
    parser.add_argument(
        "--depths",
        nargs="+",
        type=float,
        default=[0.1, 0.3, 0.5, 0.7, 0.9],
        help="needle depths, fractions of the haystack in [0, 1] (default: 0.1 0.3 0.5 0.7 0.9)",
    )
    parser.add_argument("--samples", type=int, default=2, help="probes per (length, depth) (default: 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the haystack cuts and needles (default: 0)")
    parser.add_argument("--haystack", default=None, help="a bundled haystack name, or a folder/file of text")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="weights' dtype (default: float32)")
    parser.add_argument(
        "--require-correct",
        action="store_true",
        help="count a copy only where the model's own top-1 prediction is the answer token (the paper's condition)",
    )
    return parser.parse_args(argv)


def model_spec(args: argparse.Namespace) -> ModelSpec:
    """The model setting, checked (a local folder's files, or a hub id's spelling) without loading weights."""
    spec = ModelSpec(name="head-scores", path=args.model, dtype=args.dtype, attn_implementation="sdpa")
    try:
        check_model(spec)
    except ValueError as error:
        raise ValueError(str(error).replace("model.path=", "--model=")) from error
    return spec


def check_architecture(spec: ModelSpec, lengths: list[int], depths: list[float], samples: int) -> None:
    """Refuse a model restkv's integration cannot run, and lengths past its positions, from its config alone."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(resolve(spec.path))
    except OSError as error:
        raise ValueError(f"--model={spec.path!r}: its config could not be read ({error})") from error
    architectures = getattr(config, "architectures", None) or []
    if architectures and not set(architectures) & set(SUPPORTED_MODELS):
        raise ValueError(
            f"--model={spec.path!r} is a {', '.join(architectures)}; supported: {', '.join(SUPPORTED_MODELS)}"
        )
    check_probe_settings(lengths, depths, samples, getattr(config, "max_position_embeddings", None))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check_probe_settings(args.lengths, args.depths, args.samples)
        device = pick_device(args.device, "--device")
        spec = model_spec(args)
        check_architecture(spec, args.lengths, args.depths, args.samples)
        tokenizer = load_tokenizer(spec)
        probes = build_probes(tokenizer, args.lengths, args.depths, args.samples, args.seed, args.haystack)
        model = load_model(spec, device)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # transformers' word for a hub id it cannot fetch or a folder it cannot read
        print(f"error: --model={args.model!r} could not be loaded: {error}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    scores = retrieval_scores(model, probes, require_correct=args.require_correct)
    seconds = time.perf_counter() - start
    path = write_head_scores(args.out, scores)
    means = sorted(((sum(v) / len(v), k) for k, v in scores.items()), key=lambda item: (-item[0], item[1]))
    print(f"{len(probes)} probes in {seconds:.0f} s; wrote {path} ({len(scores)} heads, one score per probe each)")
    print("top heads (layer-head: mean score): " + ", ".join(f"{k}: {m:.3f}" for m, k in means[:10]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
