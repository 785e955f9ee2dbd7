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
from tokenizers import Regex, pre_tokenizers
from transformers import AutoTokenizer

import scripts.train_micro_model as train
from eval.benchmarks.haystack import load_haystack

FOLDER = Path(__file__).resolve().parents[1] / "models" / "micro-llama"


def _pieces(space_before_numbers: bool, text: str) -> list[str]:
    split = pre_tokenizers.Split(Regex(train.pre_tokenizer_pattern(space_before_numbers)), behavior="isolated")
    return [piece for piece, _ in split.pre_tokenize_str(text)]


def test_v1_splits_the_space_from_a_number_and_v2_keeps_it() -> None:
    text = "for lean-gold is: 6166416."
    assert _pieces(False, text)[-5:] == [" ", "616", "641", "6", "."]
    assert _pieces(True, text)[-4:] == [" 616", "641", "6", "."]
    uuid = " 3f1b2c4a-1234-4abc-8def-0123456789ab"
    assert _pieces(True, uuid) == [uuid]
    assert _pieces(False, uuid) == [" ", uuid[1:]]


@pytest.fixture
def recipe_v2(monkeypatch):
    monkeypatch.setattr(train, "RECIPE", train.RECIPES["v2"])
    monkeypatch.setattr(train, "STAGES", train.RECIPES["v2"].stages)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(FOLDER)


@pytest.mark.parametrize(("task", "gap"), [("recall", ""), ("recall_gap1", ":"), ("recall_gap2", " is:")])
def test_v2_recall_drills_put_the_gap_between_key_and_value(recipe_v2, tokenizer, task, gap) -> None:
    sample = train.recall_sample(tokenizer, 96, seed=3, task=task)
    key = sample.question.strip()
    assert key.endswith(gap) if gap else ":" not in key
    line = next(line for line in sample.context.splitlines() if line.startswith(key))
    assert line == f"{key} {sample.references[0]}"


def test_v1_recall_is_the_colon_drill(tokenizer) -> None:
    assert train.RECIPES["v1"].recall_gaps == {"recall": ":"}
    sample = train.recall_sample(tokenizer, 96, seed=3)
    assert sample.question.endswith(":")


def test_dense_key_questions_supervise_each_named_keys_value(tokenizer) -> None:
    essay = train.ruler.parse_essay(load_haystack(train.TRAIN_HAYSTACK))
    checked = 0
    for seed in range(12):
        example = train.dense_keys_example(
            tokenizer, 256, 1_000_000 + seed, train.essay_window(essay, random.Random(seed))
        )
        if example is None:
            continue
        text = tokenizer.decode(example.ids)
        pairs = dict(train.NEEDLE_PATTERN.findall(text.split("\nWhat is")[0]))
        spans = [*example.earlier_answers, (example.answer_start, len(example.ids) - 1)]
        assert len(spans) >= 2 or len(pairs) == 1
        for start, stop in spans:
            prefix = tokenizer.decode(example.ids[:start])
            key = re.search(r"magic \w+ for ([\w-]+) mentioned in the provided text is$", prefix).group(1)
            assert tokenizer.decode(example.ids[start:stop]) == f" {pairs[key]}."
            checked += 1
    assert checked >= 20


def test_v3_is_v2_then_the_micro_suite(tokenizer, monkeypatch) -> None:
    v2, v3 = train.RECIPES["v2"], train.RECIPES["v3"]
    assert v3.stages[: len(v2.stages)] == v2.stages  # a v2 checkpoint resumes into v3's second phase
    assert (v3.space_before_numbers, v3.recall_gaps) == (v2.space_before_numbers, v2.recall_gaps)
    added = v3.stages[len(v2.stages) :]
    assert max(s.length for s in added) == train.MAX_LENGTH
    assert added[-1].final and added[-1].cosine
    monkeypatch.setattr(train, "RECIPE", v3)
    monkeypatch.setattr(train, "STAGES", v3.stages)
    data = train.TaskData(tokenizer)
    for task in train.micro.TASKS:
        assert task in train.MICRO_MIXTURE
        example = data.example(task, 512, 1_000_000 + 7)
        sample = train.make_sample(task, tokenizer, 512, 1_000_000 + 7, data.essay)
        answer = tokenizer.decode(example.ids[example.answer_start : -1])
        assert answer == train.target_text(sample)
        assert all(reference in answer for reference in sample.references)


def test_a_later_phases_final_stage_gets_its_own_length(monkeypatch) -> None:
    """The final-stage length fixed for one phase must not carry over to the next phase's final stage."""
    stages = train.RECIPES["v3"].stages
    monkeypatch.setattr(train, "STAGES", stages)
    first_final = next(i for i, s in enumerate(stages) if s.final)
    state = train.State(stage=first_final, stage_step=10)
    train.begin_stage(state, final_steps=123)
    assert train.stage_steps(state) == 123
    last = len(stages) - 1
    state.stage, state.stage_step = last, 0  # what the end of a phase leaves
    assert train.stage_steps(state) == stages[last].max_steps
    state.saved_seconds = 0.0
    train.begin_stage(state)
    assert (state.final_stage, train.stage_steps(state)) == (last, stages[last].max_steps)


def test_batches_made_ahead_by_workers_are_the_ones_made_in_process(tokenizer, monkeypatch) -> None:
    """Across evaluations that change the adaptive mixture and a stage change, workers give the same batches."""
    stages = (
        train.Stage("tasks-256", 96, 3, 4, 2.0, 2, 0.1, tasks={"micro_single_1": 1.0, "passkey": 1.0}),
        train.Stage("tasks-512", 128, 2, 6, 2.0, 3, 0.1),  # the adaptive mixture, read from the log
    )
    monkeypatch.setattr(train, "STAGES", stages)
    data = train.TaskData(tokenizer)
    source = train.BatchSource(data, workers=2, ahead=3)
    state, rng, compared = train.State(), random.Random(0), 0
    try:
        while state.stage < len(stages):
            made_ahead = source.next(state)
            made_here = train.make_batch(data, state)[:3]
            assert all(train.torch.equal(a, b) for a, b in zip(made_ahead, made_here, strict=True))
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
    full = train.task_weights(state, 128)
    assert train.task_weights(train.State(stage=state.stage, log=train._weights_log(state.log)), 128) == full
    assert full != train.TASK_WEIGHTS  # the log did change the mixture


def test_bf16_autocast_gives_the_float32_loss_to_bfloat16_precision(monkeypatch) -> None:
    torch = train.torch
    config = train.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = train.LlamaForCausalLM(config)
    ids = torch.randint(3, 64, (2, 24))
    positions = torch.arange(24).repeat(2, 1)
    labels = torch.full_like(ids, -100)
    labels[:, 12:23] = ids[:, 13:]
    exact = train.sequence_loss(model, ids, positions, labels)
    monkeypatch.setattr(train, "PRECISION", "bf16")
    autocast = train.sequence_loss(model, ids, positions, labels)
    assert autocast.dtype == torch.float32 and autocast.item() != exact.item()
    assert autocast.item() == pytest.approx(exact.item(), rel=0.02)


def test_training_needs_none_of_longbenchs_metric_packages() -> None:
    """A bare GPU image has torch, transformers and tokenizers but not jieba or rouge-score."""
    code = "import sys, scripts.train_micro_model; print(sorted({'jieba', 'rouge_score'} & set(sys.modules)))"
    repo = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
