"""A small byte-level BPE tokenizer trained in memory, for tests that need real token counts.

Trained on the start of the bundled *training* novel (never the evaluation one), so it needs no
download. Import the fixture into a test module with
``from _tokenizer import tokenizer_fixture  # noqa: F401`` and request ``tokenizer``.
"""

from __future__ import annotations

from functools import lru_cache

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from restkv.eval.benchmarks.shared.haystack import TRAIN_HAYSTACK, load_haystack

VOCAB_SIZE = 2000
TRAIN_CHARS = 300_000


@lru_cache(maxsize=1)
def build_tokenizer() -> PreTrainedTokenizerFast:
    """Train (once per process) and wrap a ~2000-token byte-level BPE tokenizer."""
    text = load_haystack(TRAIN_HAYSTACK)[:TRAIN_CHARS]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(text.split("\n\n"), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )


@pytest.fixture(scope="module", name="tokenizer")
def tokenizer_fixture() -> PreTrainedTokenizerFast:
    """The shared test tokenizer (module-scoped; built once per process)."""
    return build_tokenizer()
