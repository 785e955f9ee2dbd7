"""The model, its optimizer, the loss and one training step, in float32 or under bfloat16 autocast."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from restkv.microtrain.config import MODEL_CONFIG
from restkv.microtrain.options import Precision


def build_model(tokenizer: PreTrainedTokenizerBase) -> LlamaForCausalLM:
    """A freshly initialised micro Llama (seeded: every run starts from the same weights)."""
    config = LlamaConfig(
        **MODEL_CONFIG,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def make_optimizer(model: LlamaForCausalLM, lr: float) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices only; ``lr`` is the first stage's (the loop sets it every step)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.05}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def autocast(device: torch.device, precision: Precision) -> contextlib.AbstractContextManager:
    """bfloat16 autocast on ``device`` for ``bf16``; nothing for ``fp32``."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


def sequence_loss(
    model: LlamaForCausalLM,
    ids: torch.Tensor,
    positions: torch.Tensor,
    labels: torch.Tensor,
    precision: Precision = "fp32",
) -> torch.Tensor:
    """Cross-entropy on the supervised positions, averaged per sequence then over the batch.

    Only the supervised positions go through the output layer (a 4096-token batch would
    otherwise hold its full logits); the loss itself is always float32.
    """
    mask = labels != -100
    with autocast(ids.device, precision):
        hidden = model.model(input_ids=ids, position_ids=positions).last_hidden_state
        logits = model.lm_head(hidden[mask])
    losses = F.cross_entropy(logits.float(), labels[mask], reduction="none")
    rows = mask.nonzero()[:, 0]
    per_row = torch.zeros(ids.shape[0], device=ids.device).index_add_(0, rows, losses) / mask.sum(1).clamp(min=1)
    return per_row.mean()


def train_step(
    model: LlamaForCausalLM,
    optimizer: torch.optim.Optimizer,
    ids: torch.Tensor,
    positions: torch.Tensor,
    labels: torch.Tensor,
    precision: Precision = "fp32",
) -> torch.Tensor:
    """One optimizer step on a batch (gradients clipped to norm 1); returns the batch's loss."""
    loss = sequence_loss(model, ids, positions, labels, precision)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss
