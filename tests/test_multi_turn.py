"""Several questions about one compressed context (``evaluation=multi_turn``) on the micro model.

Independent turns (``append_answers=false``) under the full cache must answer each question exactly as a
single-question, query-agnostic run of that question does; the micro suite's multi-key samples carry the other
keys as turns; the per-turn curve and the refusals.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from restkv import compress, get_policy
from restkv.eval.benchmarks.micro import MicroBenchmark
from restkv.eval.evaluation import Generate, MultiTurn, Session
from restkv.eval.evaluation.prompting import tokenize
from restkv.eval.models.loading import eos_token_ids

MICRO = Path(__file__).resolve().parents[1] / "models" / "micro-llama"


@pytest.fixture(scope="module")
def setting():
    model = AutoModelForCausalLM.from_pretrained(MICRO).eval()
    tokenizer = AutoTokenizer.from_pretrained(MICRO)
    bench = MicroBenchmark(tasks=["micro_multikey_1", "micro_single_1"], lengths=[1024], samples=2)
    return model, tokenizer, bench, bench.load_samples(tokenizer)


def session(model, tokenizer, compressor) -> Session:
    return Session(model, tokenizer, compressor, "query_agnostic", eos_token_ids(model, tokenizer))


def test_a_multi_key_sample_asks_its_other_keys_in_turn(setting) -> None:
    _, _, _, samples = setting
    sample = samples[0]
    turns = sample.meta["turns"]
    asked = sample.meta["keys"][0]
    assert len(turns) == 3 and all(asked not in t["question"] for t in turns)
    for turn in turns:
        key = turn["answer_prefix"].split()[-1]
        assert f"{key} {turn['references'][0]}." in sample.context  # the needle is in the context


def test_independent_turns_under_the_full_cache_are_single_questions(setting) -> None:
    model, tokenizer, bench, samples = setting
    sample = samples[0]
    prompt = tokenize(sample, tokenizer, chat=False, max_context=4096)
    with compress(model, get_policy("full"), 128) as compressor:
        outcome = MultiTurn(append_answers=False).evaluate(bench, session(model, tokenizer, compressor), sample, prompt)
        for turn, record in zip(MultiTurn().turns(bench, sample), outcome["turns"], strict=True):
            alone = tokenize(turn, tokenizer, chat=False, max_context=4096)
            single = Generate().evaluate(bench, session(model, tokenizer, compressor), turn, alone)
            assert record["prediction"] == single["prediction"]
    assert outcome["score"] == sum(t["score"] for t in outcome["turns"]) / 4 and outcome["score"] > 0.5


def test_a_conversation_keeps_the_answers_and_the_curve_is_per_turn(setting) -> None:
    model, tokenizer, bench, samples = setting
    sample = samples[1]
    prompt = tokenize(sample, tokenizer, chat=False, max_context=4096)
    evaluation = MultiTurn(append_answers=True, max_turns=3)
    with compress(model, get_policy("snapkv"), 96) as compressor:
        outcome = evaluation.evaluate(bench, session(model, tokenizer, compressor), sample, prompt)
    assert len(outcome["turns"]) == 3 and outcome["kept_tokens"] == 96
    records = [outcome, {"turns": [{"score": 1.0}]}]
    expected = [100 * (outcome["turns"][0]["score"] + 1) / 2, *(100 * t["score"] for t in outcome["turns"][1:])]
    assert evaluation.report(records)["turn_scores"] == [round(x, 2) for x in expected]


def test_a_sample_with_one_question_is_refused(setting) -> None:
    _, _, bench, samples = setting
    single = next(s for s in samples if s.task == "micro_single_1")
    assert "turns" not in single.meta
    with pytest.raises(ValueError, match=r"has one; use bench=micro"):
        MultiTurn().turns(bench, single)
    assert MultiTurn(max_turns=1).turns(bench, replace(single)) == [single]
    with pytest.raises(ValueError, match="max_turns"):
        MultiTurn(max_turns=0)


def test_a_run_records_every_turn(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir

    from restkv.eval.harness.runner import RunSettings, run_benchmark
    from restkv.eval.run import CONFIGS

    overrides = [
        "evaluation=multi_turn",
        "protocol=query_agnostic",
        "bench=micro",
        "bench.tasks=[micro_multikey_1]",
        "bench.lengths=[1024]",
        "bench.samples=2",
        "policy=full",
    ]
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=[*overrides, f"out_dir={tmp_path}"])
    run_benchmark(cfg, RunSettings("micro", "micro-llama", "full", overrides, tmp_path))
    (metrics,) = tmp_path.rglob("metrics.json")
    assert len(json.loads(metrics.read_text())["turn_scores"]) == 4
    (predictions,) = tmp_path.rglob("predictions.jsonl")
    assert all(len(json.loads(line)["turns"]) == 4 for line in predictions.read_text().splitlines())
    plots = load_script("plot_long_outputs")
    assert plots.main(["turns", "--runs", str(tmp_path), "--out", str(tmp_path / "figures")]) == 0
    assert (tmp_path / "figures" / "multi-turn.png").stat().st_size > 0
    assert plots.main(["lengths", "--runs", str(tmp_path), "--out", str(tmp_path / "figures")]) == 2  # no such run


def load_script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, MICRO.parents[1] / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
