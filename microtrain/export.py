"""The Hugging Face folder of a trained model: config, bf16 safetensors, tokenizer, ``training_log.json``."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

from restkv.microtrain.config import MODEL_CONFIG
from restkv.microtrain.curriculum import State
from restkv.microtrain.options import RunOptions
from restkv.microtrain.recipes import TASK_WEIGHTS, Stage


def export(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    state: State,
    folder: Path,
    stages: tuple[Stage, ...],
    options: RunOptions,
) -> None:
    """Write ``folder``: the weights in bfloat16 (on the CPU), the tokenizer, and the run's recipe, settings and log."""
    folder.mkdir(parents=True, exist_ok=True)
    exported = LlamaForCausalLM(model.config)
    exported.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    exported.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    summary = {
        "model_config": MODEL_CONFIG,
        "stages": [asdict(s) for s in stages],
        "task_weights": TASK_WEIGHTS,
        "steps": state.step,
        "training_seconds": round(state.elapsed),
        "threads": torch.get_num_threads(),
        "batch_scale": options.batch_scale,
        "precision": options.precision,
        "device": str(next(model.parameters()).device),
        "log": state.log,
    }
    (folder / "training_log.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"exported {folder}", flush=True)
