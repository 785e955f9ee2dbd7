"""The Hydra runner end to end on the tiny random model: folders, files, resume, protocols."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from restkv.eval.harness.run_folder import PREDICTIONS, overrides_hash, run_folder
from restkv.eval.harness.runner import RunSettings, run_benchmark
from restkv.eval.run import CONFIGS, other_overrides


def config(tmp_path: Path, *overrides: str):
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=[f"out_dir={tmp_path}", "model=tiny-random-llama", *overrides])
    OmegaConf.set_struct(cfg, False)
    cfg.bench = OmegaConf.create({"_target_": "_fake_bench.FakeBench", "count": 6})
    return cfg


def settings(tmp_path: Path, policy: str = "restkv", extra: list[str] | None = None) -> RunSettings:
    return RunSettings(bench="fake", model="tiny-random-llama", policy=policy, overrides=extra or [], out_dir=tmp_path)


def read_lines(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / PREDICTIONS).read_text().splitlines()]


@pytest.mark.parametrize("protocol", ["query_aware", "query_agnostic"])
def test_run_writes_predictions_metrics_and_config(tmp_path: Path, protocol: str, capsys) -> None:
    cfg = config(tmp_path, "budget=64", f"protocol={protocol}", "policy.window=8")
    summary = run_benchmark(cfg, settings(tmp_path))
    folder = tmp_path / "fake" / "tiny-random-llama" / "restkv" / "budget64"
    records = read_lines(folder)
    assert [r["id"] for r in records] == [f"fake-{i}" for i in range(6)]
    for record in records:
        assert record["kept_tokens"] == 64
        assert record["context_length"] > 200
        assert set(record) >= {"id", "task", "prediction", "references", "score", "prefill_seconds", "decode_seconds"}
    metrics = json.loads((folder / "metrics.json").read_text())
    assert set(metrics["tasks"]) == {"even", "odd"} and metrics["samples"] == {"even": 3, "odd": 3}
    assert metrics["average"] == summary["average"]
    assert (folder / "config.yaml").exists()
    out = capsys.readouterr().out
    assert "average" in out and f"results: {folder}" in out


def test_resume_skips_finished_samples_and_redoes_a_cut_line(tmp_path: Path, capsys) -> None:
    cfg = config(tmp_path, "budget=64", "policy.window=8", "limit=4")
    run_benchmark(cfg, settings(tmp_path))
    folder = tmp_path / "fake" / "tiny-random-llama" / "restkv" / "budget64"
    path = folder / PREDICTIONS
    lines = path.read_text().splitlines()
    assert len(lines) == 4
    first_three = [json.loads(line) for line in lines[:3]]
    path.write_text("\n".join(lines[:3]) + "\n" + lines[3][: len(lines[3]) // 2])  # killed mid-write
    cfg.limit = None
    run_benchmark(cfg, settings(tmp_path))
    err = capsys.readouterr().err
    assert "unreadable result line" in err and "predictions.jsonl:4" in err
    records = read_lines(folder)
    assert [r["id"] for r in records] == [f"fake-{i}" for i in range(6)]
    assert records[:3] == first_three  # untouched, not recomputed
    # exact content (not stripped: the cut can end on a space, depending on the timings' digits)
    assert (folder / "predictions.corrupt.jsonl").read_text() == lines[3][: len(lines[3]) // 2] + "\n"


def test_resume_refuses_predictions_of_other_weights(tmp_path: Path) -> None:
    cfg = config(tmp_path, "budget=64", "policy.window=8", "limit=2")
    run_benchmark(cfg, settings(tmp_path))
    folder = tmp_path / "fake" / "tiny-random-llama" / "restkv" / "budget64"
    before = (folder / PREDICTIONS).read_text()
    cfg.model.seed = 1  # other random weights under the same model name: as if retrained in place
    cfg.limit = None
    with pytest.raises(RuntimeError, match="other weights of this model"):
        run_benchmark(cfg, settings(tmp_path))
    assert (folder / PREDICTIONS).read_text() == before  # nothing lost, nothing mixed in
    cfg.model.seed = 0
    run_benchmark(cfg, settings(tmp_path))  # the original weights resume as before
    assert len(read_lines(folder)) == 6


def test_weights_fingerprint_follows_the_weight_files(tmp_path: Path) -> None:
    from restkv.eval.models.fingerprint import weights_fingerprint
    from restkv.eval.models.spec import ModelSpec

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(bytes(3 << 20))
    spec = ModelSpec(name="m", path=str(folder))
    first = weights_fingerprint(spec)
    (folder / "README.md").write_text("a model card edit")
    assert weights_fingerprint(spec) == first
    (folder / "model.safetensors").write_bytes(bytes(3 << 20)[:-1] + b"\x01")  # last byte retrained
    assert weights_fingerprint(spec) not in (None, first)
    assert weights_fingerprint(ModelSpec(name="hub", path="meta-llama/Llama-3.1-8B-Instruct")) is None


def test_budget_above_prompt_runs_uncompressed(tmp_path: Path) -> None:
    cfg = config(tmp_path, "budget=5000", "policy.window=8")
    run_benchmark(cfg, settings(tmp_path))
    records = read_lines(tmp_path / "fake" / "tiny-random-llama" / "restkv" / "budget5000")
    assert all(r["kept_tokens"] == r["context_length"] for r in records)


def test_other_overrides_get_their_own_folder() -> None:
    extra = other_overrides(["policy=restkv", "budget=64", "policy.alpha=0.5", "bench.seed=3", "limit=2"])
    assert extra == ["policy.alpha=0.5", "bench.seed=3"]
    folder = run_folder(Path("r"), "ruler", "m", "restkv", "64", extra)
    assert folder == Path("r/ruler/m/restkv") / f"budget64-{overrides_hash(extra)}"
    assert overrides_hash(["b=1", "a=2"]) == overrides_hash(["a=2", "b=1"])


def test_bad_protocol_is_rejected(tmp_path: Path) -> None:
    cfg = config(tmp_path, "protocol=sideways")
    with pytest.raises(ValueError, match="protocol='sideways' is not allowed; choose one of: query_aware"):
        run_benchmark(cfg, settings(tmp_path))


def test_ruler_and_niah_benchmarks_run_through_the_runner(tmp_path: Path, capsys) -> None:
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        ruler_cfg = compose(
            config_name="config",
            overrides=[
                f"out_dir={tmp_path}",
                "model=tiny-random-llama",
                "bench=ruler",
                "bench.tasks=[niah_single_1,vt,qa_1]",
                "bench.lengths=[1024]",
                "bench.samples=1",
                "budget=256",
                "bench.hub=false",
                "allow_skips=true",
            ],
        )
        niah_cfg = compose(
            config_name="config",
            overrides=[
                f"out_dir={tmp_path}",
                "model=tiny-random-llama",
                "bench=niah",
                "bench.lengths=[600,900]",
                "bench.depths=[0,100]",
                "budget=256",
            ],
        )
    ruler = run_benchmark(ruler_cfg, RunSettings("ruler", "tiny-random-llama", "restkv", out_dir=tmp_path))
    assert set(ruler["tasks"]) == {"niah_single_1", "vt"} and list(ruler["lengths"]) == ["1024"]
    assert "skipping RULER qa_1" in capsys.readouterr().err
    niah = run_benchmark(niah_cfg, RunSettings("niah", "tiny-random-llama", "restkv", out_dir=tmp_path))
    assert niah["samples"] == {"niah": 4}
    assert (tmp_path / "niah" / "tiny-random-llama" / "restkv" / "budget256" / "heatmap.png").stat().st_size > 1000


def test_killed_run_resumes_without_losing_finished_samples(tmp_path: Path) -> None:
    """A real `eval/run.py` process is killed mid-run (SIGKILL), then the same command finishes it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    repo = Path(CONFIGS).parent
    command = [
        sys.executable,
        str(repo / "eval" / "run.py"),
        f"out_dir={tmp_path}",
        "model=tiny-random-llama",
        "budget=64",
        "policy.window=8",
        "bench.tasks=[niah_single_1,niah_single_2]",
        "bench.lengths=[600]",
        "bench.fit=exact",  # 600 tokens are below the official fit's 500-word essay step
        "bench.samples=3",
        "bench.hub=false",
    ]
    log = tmp_path / "ruler" / "tiny-random-llama" / "restkv"
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    deadline = time.time() + 120
    lines: list[str] = []
    while time.time() < deadline and len(lines) < 2:
        files = list(log.rglob(PREDICTIONS))
        lines = files[0].read_text().splitlines() if files else []
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    (path,) = log.rglob(PREDICTIONS)
    before = [line for line in path.read_text().splitlines() if line.endswith("}")]
    assert 2 <= len(before) < 6, "the run was not killed halfway"
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, check=True)
    assert f"{len(before)} of 6 samples already done" in done.stdout
    after = path.read_text().splitlines()
    assert len(after) == 6 and after[: len(before)] == before
