"""The micro model's tokenizer: a byte-level BPE (8192 tokens) trained on the training novel and task text.

Numbers are pre-split into groups of up to three digits (a 7-digit needle value is 3 tokens), a
UUID is one pre-token (BPE merges hex pairs and triples: ~17 tokens), a word keeps its leading
space (as GPT-2). BOS is prepended by the tokenizer; every answer ends with EOS. Training is
deterministic: recipe v3's tokenizer is the shipped one, byte for byte.
"""

from __future__ import annotations

import random
import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from restkv.eval.benchmarks import ruler
from restkv.eval.benchmarks.shared.haystack import TRAIN_HAYSTACK, load_haystack
from restkv.microtrain.config import BOS, EOS, MAX_LENGTH, PAD, TRAIN_SEED_BASE, VOCAB_SIZE
from restkv.microtrain.samples import TASKS, essay_window, make_sample, target_text


def pre_tokenizer_pattern(space_before_numbers: bool) -> str:
    """The pre-tokenizer split: a UUID is one pre-token, numbers in groups of at most three digits.

    ``space_before_numbers``: the space before a number joins its first group (``" 616"``, as in
    GPT-2 and Llama); otherwise it is a token of its own, and every value then follows the same
    bare-space token, so that no value can be found from the token before it (recipe v1).
    """
    space = " ?" if space_before_numbers else ""
    return (
        rf"{space}[0-9a-f]{{8}}(?:-[0-9a-f]{{4}}){{3}}-[0-9a-f]{{12}}"  # a UUID
        r"|'(?:[sdmt]|ll|ve|re)"  # contractions
        r"| ?\p{L}+"  # words, with their leading space
        rf"|{space}\p{{N}}{{1,3}}"  # numbers, in groups of up to three digits
        r"| ?[^\s\p{L}\p{N}]+"  # punctuation
        r"|\s+(?!\S)|\s+"
    )


class _CharCounter:
    """A stand-in tokenizer (4 characters a token) to generate text before the BPE exists."""

    def __call__(self, text: str, add_special_tokens: bool = False, verbose: bool = False) -> dict[str, list[int]]:
        """Token ids the length RULER's fitting needs: one per 4 characters."""
        return {"input_ids": [0] * (len(text) // 4)}


def _task_texts(essay: ruler.Essay, rng: random.Random) -> list[str]:
    """300 prompts (and answers) of every task at about 512 stand-in tokens, from seeds no run uses."""
    fake = _CharCounter()
    texts = []
    for i in range(300):
        for task in TASKS:
            seed = TRAIN_SEED_BASE - 1 - i  # seeds of neither training nor evaluation
            sample = make_sample(task, fake, 512, seed, essay_window(essay, rng))  # type: ignore[arg-type]
            texts.append(sample.context + sample.question + sample.answer_prefix + target_text(sample))
    return texts


def _vocabulary_texts(rng: random.Random) -> list[str]:
    """Text that makes digit groups, RULER's key words and variable names whole tokens."""
    # every group of 1-3 digits, so that each becomes a token
    groups = [f"{i:03d}" for i in range(1000)] + [f"{i:02d}" for i in range(100)] + [str(i) for i in range(10)]
    texts = [" ".join(groups) for _ in range(20)]
    # key words (RULER's adjective-noun keys) as whole tokens; uppercase variable names in pairs
    adjectives, nouns = ruler.key_words()
    for _ in range(20):
        texts.append(" ".join(f"{a}-{rng.choice(nouns)}" for a in adjectives))
        texts.append(" ".join(f"{rng.choice(adjectives)}-{n}" for n in nouns))
        texts.append(" ".join(f"for {w}" for w in (*adjectives, *nouns)))
    for _ in range(300):
        names = ("".join(rng.choices(string.ascii_uppercase, k=5)) for _ in range(100))
        texts.append("\n".join(f"VAR {name} = VAR {name[::-1]}" for name in names))
    return texts


def tokenizer_corpus() -> list[str]:
    """Training text for the BPE: the training novel plus generated prompts and answers (one RNG, in this order)."""
    novel = load_haystack(TRAIN_HAYSTACK)
    texts = [p for p in novel.split("\n\n") if p.strip()]
    rng = random.Random(12345)
    texts += _task_texts(ruler.parse_essay(novel), rng)
    texts += _vocabulary_texts(rng)
    return texts


def train_tokenizer(space_before_numbers: bool, corpus: list[str] | None = None) -> PreTrainedTokenizerFast:
    """A BPE trained on ``corpus`` (default: :func:`tokenizer_corpus`) with the recipe's number split."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pre_tokenizer_pattern(space_before_numbers)), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(tokenizer_corpus() if corpus is None else corpus, trainer=trainer)
    bos_id = backend.token_to_id(BOS)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )


def load_or_train_tokenizer(folder: Path, space_before_numbers: bool) -> PreTrainedTokenizerFast:
    """The tokenizer saved in ``folder``, trained and saved there first if there is none (a run trains it once)."""
    if (folder / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(folder)
    tokenizer = train_tokenizer(space_before_numbers)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    return PreTrainedTokenizerFast.from_pretrained(folder)
