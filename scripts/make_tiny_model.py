"""Write ``models/tiny-random-llama``: a Llama config and a small BPE tokenizer, no weights.

The harness builds this model with random weights (``random_init: true``), so it runs anywhere
offline: it checks the pipeline, not quality. The tokenizer is a 4096-token byte-level BPE
trained on the bundled *training* novel; digits are split one per token so numbers tokenise
predictably. Deterministic: rerunning rewrites the same files.

    python scripts/make_tiny_model.py
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from restkv.eval.benchmarks.haystack import TRAIN_HAYSTACK, load_haystack

REPO = Path(__file__).resolve().parents[1]

OUT = REPO / "models" / "tiny-random-llama"
SPECIAL = "<|endoftext|>"
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 4096,
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
    "eos_token_id": 0,
}


def train_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\d"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(load_haystack(TRAIN_HAYSTACK).split("\n\n"), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=SPECIAL, eos_token=SPECIAL, pad_token=SPECIAL, model_max_length=16384
    )


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(CONFIG["vocab_size"])
    tokenizer.save_pretrained(OUT)
    (OUT / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    print(f"wrote {OUT} (vocabulary {len(tokenizer)})")


if __name__ == "__main__":
    main()
