"""Resumable checkpoints: model, optimizer, RNG states, the curriculum's :class:`State`, the batch scale.

The file's keys are those of every earlier checkpoint, so a run started before this package
resumes with it. Data depend only on (step, index), so a resumed run sees the same batches.
"""

from __future__ import annotations

import os
import random
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from restkv.microtrain.curriculum import State, begin_stage
from restkv.microtrain.options import RunOptions
from restkv.microtrain.recipes import Stage


def save_checkpoint(
    path: Path, model: LlamaForCausalLM, optimizer: torch.optim.Optimizer, state: State, batch_scale: int
) -> None:
    """Write the checkpoint atomically (a temporary file, then a rename: a kill never leaves half a file)."""
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "state": asdict(state),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            "batch_scale": batch_scale,
        },
        tmp,
    )
    os.replace(tmp, path)


def load_checkpoint(
    path: Path,
    model: LlamaForCausalLM,
    optimizer: torch.optim.Optimizer,
    stages: tuple[Stage, ...],
    options: RunOptions,
) -> State:
    """Restore ``model``, ``optimizer`` and the RNGs from ``path``; returns the run's state.

    A checkpoint of another batch scale is refused (its stages had other batches). Checkpoints
    from before phases existed get their final stage's owner inferred, and a final stage added
    to the recipe after the checkpoint was written begins with its own length.
    """
    saved = torch.load(path, weights_only=False, map_location=options.device)
    if saved.get("batch_scale", 1) != options.batch_scale:
        raise SystemExit(
            f"{path} was trained with --batch-scale {saved.get('batch_scale', 1)}, not {options.batch_scale}"
        )
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    state = State(**saved["state"])
    torch.set_rng_state(saved["torch_rng"].cpu())
    random.setstate(saved["python_rng"])
    print(f"resumed at step {state.step}, stage {stages[min(state.stage, len(stages) - 1)].name}", flush=True)
    if "final_stage" not in saved["state"] and state.final_steps:  # a checkpoint from before phases
        after_phase = state.stage > 0 and stages[state.stage - 1].final and state.stage_step == 0
        state.final_stage = -1 if after_phase else state.stage
    if state.stage < len(stages) and stages[state.stage].final and state.final_stage != state.stage:
        begin_stage(stages, state, options.final_steps)  # a later phase's final stage, added after this checkpoint
    return state
