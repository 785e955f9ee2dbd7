"""The micro model's training data are those the shipped model was trained on, byte for byte.

SHA-256 digests of, for each recipe (v1, v2, v3) and each of its stages, the batches of three
steps (ids, positions and labels tensors, with a held-out log that drives the adaptive mixture);
of the held-out examples of every task a recipe uses at 256 and 1024 tokens; of the shipped
tokenizer's output on a few strings; of the recipes themselves (stages, scaled stages, drills,
folders, model configuration, default mixture); of the model's initial weights; and of the
tokenizer's training corpus. The expected digests were recorded from the pre-refactor code (the
single-file ``scripts/train_micro_model.py``) at commit c18ee88a08af6a0f288ded1b79a5e1f18ed47b69,
with the same hashing as here. A second check trains recipe v3's tokenizer and compares it with
the shipped one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from restkv.microtrain.batches import make_batch
from restkv.microtrain.config import EXPORT_DIR, MODEL_CONFIG, REPO
from restkv.microtrain.curriculum import State
from restkv.microtrain.examples import Example, TaskData
from restkv.microtrain.model import build_model
from restkv.microtrain.recipes import RECIPES, TASK_WEIGHTS, Recipe, scaled_stages
from restkv.microtrain.tokenizer import tokenizer_corpus, train_tokenizer

RECORDED = {
    "tokenizer": "b48a6a9b81bdee64f671837a1e7e68ecae2bed2efeb1d85ce2448c56e2e0c485",
    "recipes": "f465bc3d9b2d0c26bca118c9b47b3f8aed46d9b7ba8702a08a5487f9b594a0eb",
    "init": "29907fc250fcd384389b84fbf1233e145bfbbc6774b1ccb51125a14e560ba9a4",
    "batches/v1": "4f2f1164000170fe01f358303cb630793bd30e0ecf1d91b17e23b4529797f260",
    "heldout/v1": "72164fd2749314c4bb9478d5b0d859771969943a0235a2031b9ef461d93e7c7c",
    "batches/v2": "a8a719ede4aa53df6df05ddc4d7eb1ef3ddebb1a601d91c0718939763db3823a",
    "heldout/v2": "43576f8ca4ca206a230982a4ce93e05e459bf7f4c2eac5ca767654ac607b0d1a",
    "batches/v3": "5fddb3ab7d0ce5d1fcccad6a525ee96610ef472ca3a67e2140c029432a7514fa",
    "heldout/v3": "b880141ddbd628fc52820d5faad87c19b7e99f817641a65f539f92d442141ea1",
    "tokenizer_corpus": "d4a02ee3ac3a4d8cc3cd8878436d0efa49c75bb2c6305e81de6def4837e8f71b",
}
STEPS = (0, 1, 2)  # step 1 replays an earlier length; steps 0 and 2 take the PoSE shift in several stages
STRINGS = (
    "One of the special magic numbers for lean-gold is: 6166416.",
    " 3f1b2c4a-1234-4abc-8def-0123456789ab VAR ABCDE = VAR EDCBA",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune",
)
LOG = [
    {"kind": "heldout", "task": "niah_single_1", "length": 512, "exact": 0.75},
    {"kind": "sweep", "task": "vt", "length": 256, "exact": 0.1},
    {"kind": "heldout", "task": "passkey", "length": 1024, "exact": 1.0},
    {"kind": "heldout", "task": "niah_multikey_2", "length": 2048, "exact": 0.0},
]
HELDOUT_LENGTHS = (256, 1024)
HELDOUT_COUNT = 2


def _tensor_bytes(t: torch.Tensor) -> bytes:
    return f"{t.dtype}{tuple(t.shape)}".encode() + t.contiguous().numpy().tobytes()


def _example_bytes(e: Example) -> bytes:
    return json.dumps([e.task, e.ids, e.answer_start, [list(s) for s in e.earlier_answers]]).encode()


def _recipe_tasks(recipe: Recipe) -> list[str]:
    names = dict.fromkeys(TASK_WEIGHTS)
    for stage in recipe.stages:
        names.update(dict.fromkeys(stage.tasks or {}))
        if stage.copy_task:
            names[stage.copy_task] = None
    return list(names)


def _recipes_digest() -> str:
    h = hashlib.sha256()
    for name, recipe in RECIPES.items():
        h.update(name.encode())
        h.update(json.dumps([asdict(s) for s in recipe.stages]).encode())
        h.update(json.dumps([asdict(s) for s in scaled_stages(recipe, 8)]).encode())
        h.update(json.dumps([recipe.space_before_numbers, recipe.recall_gaps]).encode())
        h.update(str(recipe.work_dir.relative_to(REPO)).encode())
    h.update(json.dumps([MODEL_CONFIG, TASK_WEIGHTS]).encode())
    return h.hexdigest()


def _batches_digest(data: TaskData, recipe: Recipe) -> str:
    h = hashlib.sha256()
    for index in range(len(recipe.stages)):
        for step in STEPS:
            state = State(step=step, stage=index, stage_step=step, log=[dict(r) for r in LOG])
            ids, positions, labels, _ = make_batch(data, recipe.stages, state)
            for t in (ids, positions, labels):
                h.update(_tensor_bytes(t))
    return h.hexdigest()


def _heldout_digest(data: TaskData, recipe: Recipe) -> str:
    h = hashlib.sha256()
    for task in _recipe_tasks(recipe):
        for length in HELDOUT_LENGTHS:
            for example in data.heldout(task, length, HELDOUT_COUNT):
                h.update(_example_bytes(example))
    return h.hexdigest()


def _data_digests(tokenizer: PreTrainedTokenizerFast) -> dict[str, str]:
    digests = {}
    h = hashlib.sha256()
    for s in STRINGS:
        h.update(json.dumps(tokenizer(s)["input_ids"]).encode())
    digests["tokenizer"] = h.hexdigest()
    digests["recipes"] = _recipes_digest()
    h = hashlib.sha256()
    for key, value in build_model(tokenizer).state_dict().items():
        h.update(key.encode() + _tensor_bytes(value))
    digests["init"] = h.hexdigest()
    for name, recipe in RECIPES.items():
        data = TaskData(tokenizer, recipe.recall_gaps)  # one run, one recipe: a fresh held-out cache
        digests[f"batches/{name}"] = _batches_digest(data, recipe)
        digests[f"heldout/{name}"] = _heldout_digest(data, recipe)
    return digests


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return tokenizer_corpus()


def test_training_batches_held_out_examples_and_recipes_are_the_recorded_ones(corpus) -> None:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(EXPORT_DIR)
    digests = _data_digests(tokenizer)
    h = hashlib.sha256()
    for text in corpus:
        h.update(hashlib.sha256(text.encode()).digest())
    digests["tokenizer_corpus"] = h.hexdigest()
    assert digests == RECORDED


@pytest.mark.slow
def test_recipe_v3_trains_the_shipped_tokenizer(corpus, tmp_path: Path) -> None:
    train_tokenizer(RECIPES["v3"].space_before_numbers, corpus).save_pretrained(tmp_path)
    trained = json.loads((tmp_path / "tokenizer.json").read_text())
    assert trained == json.loads((EXPORT_DIR / "tokenizer.json").read_text())
