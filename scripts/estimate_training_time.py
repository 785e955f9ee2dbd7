"""How long a micro-model recipe would take on this machine, measured before committing to a run.

A GPU may be lent for minutes only, and a run cut by ``--max-hours`` loses its later phases, so
size the batch first. For each stage of the recipe (with ``--batch-scale``), this times a few
real training steps (forward, backward, optimizer) on that stage's batches, and the making of
those batches in one process; it prints the estimated seconds per step with ``--workers``
processes making batches ahead (the slower of the two, since they overlap), and the recipe's
total if every stage ran to its step cap (stages that pass their threshold end sooner; the
held-out evaluations, a few percent of a CPU run, are not counted).

    python scripts/estimate_training_time.py                                   # the CPU run, 2 threads
    python scripts/estimate_training_time.py --device cuda --precision bf16 --batch-scale 8 --workers 14
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from restkv.devices import synchronize
from restkv.microtrain.batches import Batch, make_batch
from restkv.microtrain.config import EXPORT_DIR
from restkv.microtrain.curriculum import State
from restkv.microtrain.examples import TaskData
from restkv.microtrain.model import build_model, make_optimizer, train_step
from restkv.microtrain.options import Precision
from restkv.microtrain.recipes import RECIPES, Stage, scaled_stages


def make_batches(data: TaskData, stages: tuple[Stage, ...], stage_index: int, count: int) -> tuple[list[Batch], float]:
    """``count`` batches of one stage (from steps far from any training seed) and the seconds each took."""
    state = State(stage=stage_index)
    batches = []
    start = time.perf_counter()
    for i in range(count):
        state.step = 10**7 + i
        ids, positions, labels, _ = make_batch(data, stages, state)
        batches.append((ids, positions, labels))
    return batches, (time.perf_counter() - start) / count


def time_steps(
    model: LlamaForCausalLM,
    optimizer: torch.optim.Optimizer,
    batches: list[Batch],
    device: torch.device,
    precision: Precision,
) -> float:
    """Seconds per training step (forward, backward, optimizer) over ``batches``, the first one a warm-up."""
    timings = []
    for ids, positions, labels in batches:
        ids, positions, labels = ids.to(device), positions.to(device), labels.to(device)
        synchronize(device)
        tick = time.perf_counter()
        train_step(model, optimizer, ids, positions, labels, precision)
        synchronize(device)
        timings.append(time.perf_counter() - tick)
    return sum(timings[1:]) / (len(timings) - 1)


def estimate(
    model: LlamaForCausalLM, optimizer: torch.optim.Optimizer, data: TaskData, args: argparse.Namespace, scale: int
) -> float:
    """Print each stage's timings at batch ``scale`` and return the recipe's seconds at every stage's step cap."""
    stages = scaled_stages(RECIPES[args.recipe], scale)
    print(f"recipe {args.recipe}, batch x{scale}, {args.device} {args.precision}, {args.workers} workers")
    print(f"{'stage':20s} {'length':>6s} {'batch':>5s} {'steps':>5s} {'step s':>8s} {'batch s':>8s} {'est s':>8s}")
    step_seconds: dict[tuple[int, int], float] = {}  # the model's cost depends on the shape alone
    total = 0.0
    for index, stage in enumerate(stages):
        batches, making = make_batches(data, stages, index, args.steps + 1)
        if (stage.length, stage.batch) not in step_seconds:
            step_seconds[stage.length, stage.batch] = time_steps(model, optimizer, batches, args.device, args.precision)
        compute = step_seconds[stage.length, stage.batch]
        per_step = max(compute, making / args.workers) if args.workers else compute + making
        total += stage.max_steps * per_step
        print(
            f"{stage.name:20s} {stage.length:6d} {stage.batch:5d} {stage.max_steps:5d} "
            f"{compute:8.3f} {making:8.3f} {stage.max_steps * per_step:8.0f}",
            flush=True,
        )
    print(f"total at every stage's step cap: {total:.0f} s ({total / 3600:.2f} h), evaluations not counted")
    return total


def parse_args() -> argparse.Namespace:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="v3", choices=["v2", "v3"], help="a recipe of the shipped tokenizer")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--batch-scale", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0, help="processes the run would give to making batches")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per stage (after one warm-up step)")
    parser.add_argument(
        "--fit-hours",
        type=float,
        default=None,
        help="halve --batch-scale until the estimate fits these hours; the last line names the scale (or 0: none)",
    )
    args = parser.parse_args()
    if args.steps < 1 or args.batch_scale < 1 or args.workers < 0:
        raise SystemExit("--steps and --batch-scale must be >= 1 and --workers >= 0")
    return args


def main() -> None:
    """Estimate at ``--batch-scale``, halving it with ``--fit-hours`` until the estimate fits."""
    args = parse_args()
    torch.set_num_threads(args.threads)
    recipe = RECIPES[args.recipe]
    args.device = torch.device(args.device)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(EXPORT_DIR)  # the shipped tokenizer
    data = TaskData(tokenizer, recipe.recall_gaps)
    model = build_model(tokenizer).to(args.device).train()
    optimizer = make_optimizer(model, recipe.stages[0].lr)
    scale = args.batch_scale
    while True:
        total = estimate(model, optimizer, data, args, scale)
        if args.fit_hours is None:
            return
        if total <= args.fit_hours * 3600:
            break
        if scale == 1:
            scale = 0
            break
        scale //= 2
    print(f"batch scale that fits {args.fit_hours} h: {scale}")


if __name__ == "__main__":
    main()
