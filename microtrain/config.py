"""Fixed facts of the micro model: where it lives, its special tokens and sizes, its seed ranges, its shape.

These are constants of every recipe (no run rewrites them); what differs between recipes is in
:mod:`restkv.microtrain.recipes`, what differs between runs in :mod:`restkv.microtrain.options`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WORK_DIR = REPO / "outputs" / "micro_model"
"""Recipe v1's checkpoint folder; the other recipes' sit next to it (``micro_model_v2``, ``micro_model_v3``)."""
EXPORT_DIR = REPO / "models" / "micro-llama"
"""The shipped model (and its tokenizer, the one recipe v3 trains)."""
CHECKPOINT = "checkpoint.pt"

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
VOCAB_SIZE = 8192
MAX_LENGTH = 4096
TRAIN_SEED_BASE = 1_000_000  # training prompts use seeds >= this; evaluation uses small seeds
HELDOUT_SEED_BASE = 100_000  # held-out monitoring prompts (training novel): 100_000 + 10 * length + i

MODEL_CONFIG: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 192,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": MAX_LENGTH,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "initializer_range": 0.02,
}
"""The Llama configuration (RoPE, GQA 6 query / 2 key-value heads, tied embeddings, ~3.1M parameters)."""
