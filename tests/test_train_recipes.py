"""The micro model's training recipes: tokenizer split, key-gap drills, densely supervised key questions.

Nothing is trained here; these check the data each recipe feeds the model.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Regex, pre_tokenizers
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from restkv.eval.benchmarks import micro, ruler
from restkv.eval.benchmarks.shared.haystack import TRAIN_HAYSTACK, load_haystack
from restkv.microtrain.batches import BatchSource, make_batch, weights_log
from restkv.microtrain.config import MAX_LENGTH
from restkv.microtrain.curriculum import State, begin_stage, stage_steps, task_weights
from restkv.microtrain.examples import NEEDLE_PATTERN, TaskData, dense_keys_example
from restkv.microtrain.model import sequence_loss
from restkv.microtrain.recipes import MICRO_MIXTURE, RECIPES, TASK_WEIGHTS, Stage
from restkv.microtrain.samples import RECALL_MAX_NEW_TOKENS, essay_window, make_sample, recall_sample, target_text
from restkv.microtrain.tokenizer import pre_tokenizer_pattern

FOLDER = Path(__file__).resolve().parents[1] / "models" / "micro-llama"


def _pieces(space_before_numbers: bool, text: str) -> list[str]:
    split = pre_tokenizers.Split(Regex(pre_tokenizer_pattern(space_before_numbers)), behavior="isolated")
    return [piece for piece, _ in split.pre_tokenize_str(text)]


def test_v1_splits_the_space_from_a_number_and_v2_keeps_it() -> None:
    text = "for lean-gold is: 6166416."
    assert _pieces(False, text)[-5:] == [" ", "616", "641", "6", "."]
    assert _pieces(True, text)[-4:] == [" 616", "641", "6", "."]
    uuid = " 3f1b2c4a-1234-4abc-8def-0123456789ab"
    assert _pieces(True, uuid) == [uuid]
    assert _pieces(False, uuid) == [" ", uuid[1:]]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(FOLDER)


@pytest.mark.parametrize(("task", "gap"), [("recall", ""), ("recall_gap1", ":"), ("recall_gap2", " is:")])
def test_v2_recall_drills_put_the_gap_between_key_and_value(tokenizer, task, gap) -> None:
    sample = recall_sample(tokenizer, 96, seed=3, task=task, gap=RECIPES["v2"].recall_gaps[task])
    key = sample.question.strip()
    assert key.endswith(gap) if gap else ":" not in key
    line = next(line for line in sample.context.splitlines() if line.startswith(key))
    assert line == f"{key} {sample.references[0]}"


def test_v1_recall_is_the_colon_drill(tokenizer) -> None:
    assert RECIPES["v1"].recall_gaps == {"recall": ":"}
    sample = make_sample("recall", tokenizer, 96 - RECALL_MAX_NEW_TOKENS, seed=3, recall_gaps=RECIPES["v1"].recall_gaps)
    assert sample.question.endswith(":")


def test_dense_key_questions_supervise_each_named_keys_value(tokenizer) -> None:
    essay = ruler.parse_essay(load_haystack(TRAIN_HAYSTACK))
    checked = 0
    for seed in range(12):
        example = dense_keys_example(tokenizer, 256, 1_000_000 + seed, essay_window(essay, random.Random(seed)))
        if example is None:
            continue
        text = tokenizer.decode(example.ids)
        pairs = dict(NEEDLE_PATTERN.findall(text.split("\nWhat is")[0]))
        spans = [*example.earlier_answers, (example.answer_start, len(example.ids) - 1)]
        assert len(spans) >= 2 or len(pairs) == 1
        for start, stop in spans:
            prefix = tokenizer.decode(example.ids[:start])
            key = re.search(r"magic \w+ for ([\w-]+) mentioned in the provided text is$", prefix).group(1)
            assert tokenizer.decode(example.ids[start:stop]) == f" {pairs[key]}."
            checked += 1
    assert checked >= 20


def test_v3_is_v2_then_the_micro_suite(tokenizer) -> None:
    v2, v3 = RECIPES["v2"], RECIPES["v3"]
    assert v3.stages[: len(v2.stages)] == v2.stages  # a v2 checkpoint resumes into v3's second phase
    assert (v3.space_before_numbers, v3.recall_gaps) == (v2.space_before_numbers, v2.recall_gaps)
    added = v3.stages[len(v2.stages) :]
    assert max(s.length for s in added) == MAX_LENGTH
    assert added[-1].final and added[-1].cosine
    data = TaskData(tokenizer, v3.recall_gaps)
    for task in micro.TASKS:
        assert task in MICRO_MIXTURE
        example = data.example(task, 512, 1_000_000 + 7)
        sample = make_sample(task, tokenizer, 512, 1_000_000 + 7, data.essay, v3.recall_gaps)
        answer = tokenizer.decode(example.ids[example.answer_start : -1])
        assert answer == target_text(sample)
        assert all(reference in answer for reference in sample.references)


def test_a_later_phases_final_stage_gets_its_own_length() -> None:
    """The final-stage length fixed for one phase must not carry over to the next phase's final stage."""
    stages = RECIPES["v3"].stages
    first_final = next(i for i, s in enumerate(stages) if s.final)
    state = State(stage=first_final, stage_step=10)
    begin_stage(stages, state, final_steps=123)
    assert stage_steps(stages, state) == 123
    last = len(stages) - 1
    state.stage, state.stage_step = last, 0  # what the end of a phase leaves
    assert stage_steps(stages, state) == stages[last].max_steps
    state.saved_seconds = 0.0
    begin_stage(stages, state)
    assert (state.final_stage, stage_steps(stages, state)) == (last, stages[last].max_steps)


def test_batches_made_ahead_by_workers_are_the_ones_made_in_process(tokenizer) -> None:
    """Across evaluations that change the adaptive mixture and a stage change, workers give the same batches."""
    stages = (
        Stage("tasks-256", 96, 3, 4, 2.0, 2, 0.1, tasks={"micro_single_1": 1.0, "passkey": 1.0}),
        Stage("tasks-512", 128, 2, 6, 2.0, 3, 0.1),  # the adaptive mixture, read from the log
    )
    data = TaskData(tokenizer, RECIPES["v3"].recall_gaps)
    source = BatchSource(data, stages, workers=2, ahead=3)
    state, rng, compared = State(), random.Random(0), 0
    try:
        while state.stage < len(stages):
            made_ahead = source.next(state)
            made_here = make_batch(data, stages, state)[:3]
            assert all(torch.equal(a, b) for a, b in zip(made_ahead, made_here, strict=True))
            compared += 1
            state.step += 1
            state.stage_step += 1
            stage = stages[state.stage]
            if state.stage_step % stage.eval_every == 0:  # an evaluation: new held-out rows, new weights
                for task in ("niah_single_1", "vt", "passkey"):
                    row = {"kind": "heldout", "task": task, "length": stage.length, "exact": rng.random()}
                    state.log.append(row)
            if state.stage_step == stage.max_steps:
                state.stage, state.stage_step = state.stage + 1, 0
    finally:
        source.close()
    assert compared == 10
    full = task_weights(stages, state, 128)
    assert task_weights(stages, State(stage=state.stage, log=weights_log(state.log)), 128) == full
    assert full != TASK_WEIGHTS  # the log did change the mixture


def test_bf16_autocast_gives_the_float32_loss_to_bfloat16_precision() -> None:
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    ids = torch.randint(3, 64, (2, 24))
    positions = torch.arange(24).repeat(2, 1)
    labels = torch.full_like(ids, -100)
    labels[:, 12:23] = ids[:, 13:]
    exact = sequence_loss(model, ids, positions, labels)
    autocast = sequence_loss(model, ids, positions, labels, precision="bf16")
    assert autocast.dtype == torch.float32 and autocast.item() != exact.item()
    assert autocast.item() == pytest.approx(exact.item(), rel=0.02)


def test_training_needs_none_of_longbenchs_metric_packages() -> None:
    """A bare GPU image has torch, transformers and tokenizers but not jieba or rouge-score."""
    modules = "scripts.train_micro_model, restkv.microtrain.cli, restkv.microtrain.loop"
    code = f"import sys, {modules}; print(sorted({{'jieba', 'rouge_score'}} & set(sys.modules)))"
    repo = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_no_module_of_the_training_package_reads_a_run_setting_from_a_global() -> None:
    """Recipes are frozen values and run settings are passed explicitly: nothing rewrites a module global."""
    package = Path(__file__).resolve().parents[1] / "microtrain"
    sources = {path.name: path.read_text() for path in package.glob("*.py")}
    offenders = [
        name for name, text in sources.items() for line in text.splitlines() if line.strip().startswith("global ")
    ]
    assert offenders == ["batches.py"]  # the batch worker's initializer, run in the worker process only
    assert all(len(text.splitlines()) < 500 for text in sources.values())
