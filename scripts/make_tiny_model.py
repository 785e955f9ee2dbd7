"""Write ``models/tiny-random-llama``: a Llama config and the micro model's tokenizer, no weights.

The harness builds this model with random weights (``random_init: true``), so it runs anywhere offline: it checks
the pipeline, not quality. It shares the tokenizer of ``models/micro-llama`` (trained by
``scripts/train_micro_model.py``), so its prompts are the micro model's and fit the quick-check lengths of every
benchmark (RULER at 1,024 tokens included). Deterministic: rerunning rewrites the same files.

    python scripts/make_tiny_model.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

OUT = REPO / "models" / "tiny-random-llama"
TOKENIZER = REPO / "models" / "micro-llama"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 8192,  # the micro model's tokenizer
    "hidden_size": 64,
    "intermediate_size": 172,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 16384,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER / name, OUT / name)
    (OUT / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    print(f"wrote {OUT} (the tokenizer of {TOKENIZER.relative_to(REPO)}, vocabulary {CONFIG['vocab_size']})")


if __name__ == "__main__":
    main()
