"""``scripts/train_micro_model.py``'s command line: its flags, turned into a :class:`RunOptions`."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from restkv.microtrain.config import EXPORT_DIR
from restkv.microtrain.loop import train
from restkv.microtrain.options import RunOptions
from restkv.microtrain.recipes import RECIPES


def _run_flags(parser: argparse.ArgumentParser) -> None:
    """Where and how the run trains: checkpoint handling, device, threads, precision, workers."""
    parser.add_argument("--resume", action="store_true", help="continue from the recipe's checkpoint")
    parser.add_argument("--export-only", action="store_true", help="export the checkpoint to models/micro-llama")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--device", default="cpu", help="torch device (e.g. cuda); the recorded run used the CPU, in float32"
    )
    parser.add_argument(
        "--max-hours",
        type=float,
        default=3.0,
        help="training hours after which the current phase's final stage ends early and later phases are skipped",
    )
    parser.add_argument(
        "--batch-scale",
        type=int,
        default=1,
        help="multiply every stage's batch (e.g. 8 on a GPU: more data per step, same curriculum)",
    )
    parser.add_argument(
        "--workers", type=int, default=0, help="processes that make batches ahead (0: in the training process)"
    )
    parser.add_argument(
        "--precision", default="fp32", choices=["fp32", "bf16"], help="bf16: bfloat16 autocast (for GPUs)"
    )


def _recipe_flags(parser: argparse.ArgumentParser) -> None:
    """What is trained and for how long: the recipe, the final stage's length, the folders, smoke mode."""
    parser.add_argument(
        "--stop-at-step",
        type=int,
        default=None,
        help="end the final stage at this step (reproduces a run whose final stage was cut by --max-hours)",
    )
    parser.add_argument(
        "--final-steps",
        type=int,
        default=None,
        help="steps of the final stage, its cosine decay included (default: its cap plus the time earlier "
        "stages left unused); on --resume it also resizes a final stage already under way",
    )
    parser.add_argument("--save-every", type=float, default=300.0, help="seconds between checkpoints")
    parser.add_argument(
        "--recipe", default="v3", choices=sorted(RECIPES), help="v3: the shipped model; v1, v2: see the model card"
    )
    parser.add_argument("--work-dir", default=None, help="checkpoint and tokenizer folder (default: per recipe)")
    parser.add_argument("--export-dir", default=str(EXPORT_DIR), help="where the trained model is written")
    parser.add_argument("--smoke", action="store_true", help="a few steps per stage, to check the pipeline")


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The training script's parser; ``description`` is its ``--help`` text (the script's docstring)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    _run_flags(parser)
    _recipe_flags(parser)
    return parser


def options_from_args(args: argparse.Namespace) -> RunOptions:
    """The parsed flags as a :class:`RunOptions` (each field is the flag of its name; bad values end the program)."""
    values = {f.name: getattr(args, f.name) for f in fields(RunOptions)}
    values.update(work_dir=Path(args.work_dir) if args.work_dir else None, export_dir=Path(args.export_dir))
    try:
        return RunOptions(**values)
    except ValueError as error:
        raise SystemExit(str(error)) from None


def main(argv: list[str] | None = None, description: str | None = None) -> None:
    """Parse ``argv`` (default: the command line) and train."""
    train(options_from_args(build_parser(description).parse_args(argv)))
