"""Fidelity: zero divergence without eviction, measurable divergence with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from restkv.eval.harness.runner import RunSettings, run_benchmark
from restkv.eval.run import CONFIGS


def run(tmp_path: Path, policy: str, budget: int) -> tuple[dict, list[dict]]:
    overrides = [
        f"out_dir={tmp_path}",
        "model=tiny-random-llama",
        "bench=fidelity",
        f"policy={policy}",
        f"budget={budget}",
        "evaluation.tokens=6",
        "bench.source.tasks=[niah_single_1,vt]",
        "bench.source.lengths=[1024]",
        "bench.source.samples=1",
    ]
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    summary = run_benchmark(cfg, RunSettings("fidelity", "tiny-random-llama", policy, out_dir=tmp_path))
    lines = tmp_path / "fidelity" / "tiny-random-llama" / policy / f"budget{budget}" / "predictions.jsonl"
    return summary, [json.loads(line) for line in lines.read_text().splitlines()]


def test_full_cache_has_no_divergence(tmp_path: Path) -> None:
    summary, records = run(tmp_path, "full", 128)
    assert summary["average"] == 100.0
    assert all(r["kl"] == pytest.approx(0.0, abs=1e-6) for r in records)


def test_eviction_diverges_and_is_reported(tmp_path: Path) -> None:
    summary, records = run(tmp_path, "streamingllm", 48)
    assert all(r["kl"] > 1e-6 for r in records)
    assert set(summary["kl"]) == {"niah_single_1", "vt"} and summary["kl_average"] > 0
    assert all(r["kept_tokens"] == 48 for r in records)
