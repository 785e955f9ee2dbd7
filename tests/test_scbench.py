"""SCBench's own files (``microsoft/SCBench``, ``data/scbench_<task>.jsonl``): a record is one context with its
questions as turns; read from fixtures shaped like the hub's files, asked in turn by ``evaluation=multi_turn``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from restkv.eval.benchmarks.scbench import SCBenchBenchmark

FIXTURES = Path(__file__).parent / "fixtures" / "scbench"


def test_a_record_is_a_context_with_its_questions_as_turns() -> None:
    bench = SCBenchBenchmark(tasks=["kv", "mf", "qa_eng"], data_dir=str(FIXTURES))
    kv, mf, qa = bench.load_samples(None)
    assert kv.id == "scbench_kv-0" and kv.context.startswith("Extract the value corresponding to the specified key")
    assert kv.references == ["e5f6a7b8-2222-4222-8222-222222222222"] and len(kv.meta["turns"]) == 1
    assert (
        mf.context.endswith("17 4 99 23 8 61")
        and mf.references == ["99"]
        and mf.meta["turns"][0]["references"] == ["4"]
    )
    assert [t["references"] for t in qa.meta["turns"]] == [["Tuesday"], ["bread"]] and qa.max_new_tokens == 40
    assert bench.score(kv, "the value is e5f6a7b8-2222-4222-8222-222222222222.") == 1.0
    assert bench.score(qa, "Mara") == 1.0 and bench.score(qa, "nobody") == 0.0


def test_bad_settings_and_missing_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="allowed tasks are kv, prefix_suffix"):
        SCBenchBenchmark(tasks=["repoqa"])
    with pytest.raises(FileNotFoundError, match=r"download_data\.py scbench"):
        SCBenchBenchmark(tasks=["kv"], data_dir=str(tmp_path)).check_data()


def test_its_turns_are_asked_on_one_compressed_cache(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir

    from restkv.eval.harness.runner import RunSettings, run_benchmark
    from restkv.eval.run import CONFIGS

    overrides = [
        "evaluation=multi_turn",
        "protocol=query_agnostic",
        "bench=scbench",
        f"bench.data_dir={FIXTURES}",
        "bench.tasks=[qa_eng]",
        "bench.max_new_tokens_cap=4",
        "model=tiny-random-llama",
        "budget=12",
        "policy.window=4",
    ]
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=[*overrides, f"out_dir={tmp_path}"])
    run_benchmark(cfg, RunSettings("scbench", "tiny-random-llama", "restkv", overrides, tmp_path))
    (predictions,) = tmp_path.rglob("predictions.jsonl")
    (record,) = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert len(record["turns"]) == 3 and record["kept_tokens"] == 12
