"""The tidy run table and every paper artifact, built from small run folders written here."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from restkv.eval.report.artifacts import NAMES, build_report, make_all
from restkv.eval.report.collect import load_runs
from restkv.eval.report.table import interval, run_table, sample_frame

REPO = Path(__file__).resolve().parents[1]
TASKS = ("micro_single_2", "passkey")
QUALITY = {"full": 0.95, "restkv": 0.8, "snapkv": 0.7, "random": 0.2, "ablation/recon_ema": 0.75, "adakv": 0.78}


def write_run(root: Path, bench: str, policy: str, budget: int, quality: float, **options) -> Path:
    """A finished run folder as eval/run.py writes it: predictions, metrics, resolved config."""
    variant = options.get("variant", "")
    folder = root / bench / "micro-llama" / policy / (f"budget{budget}" + (f"-{variant}" if variant else ""))
    folder.mkdir(parents=True)
    rng = random.Random(f"{policy}/{budget}/{variant}")
    records = []
    lengths, depths = options.get("lengths", (1024, 2048)), options.get("depths", (None,))
    for task in options.get("tasks", TASKS):
        for length in lengths:
            for depth in depths:
                for index in range(options.get("samples", 6)):
                    meta = {"context_length": length, **({"depth_percent": depth} if depth is not None else {})}
                    score = float(rng.random() < quality * (1.0 if length == lengths[0] else 0.8))
                    sample_id = f"{task}/{length}/{depth}/{index}"
                    records.append(
                        {
                            "id": sample_id,
                            "task": task,
                            "score": score,
                            "prefill_seconds": 0.1,
                            "decode_seconds": 0.02,
                            "cache_allocated_bytes": 1000 * budget,
                            "meta": meta,
                        }
                    )
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    tasks = {
        t: 100 * float(np.mean([r["score"] for r in records if r["task"] == t])) for t in options.get("tasks", TASKS)
    }
    metrics = {
        "average": float(np.mean(list(tasks.values()))),
        "tasks": tasks,
        "bench": bench,
        "model": "micro-llama",
        "policy": policy,
        "budget": str(budget),
        "protocol": "query_aware",
        **options.get("metrics", {}),
    }
    (folder / "metrics.json").write_text(json.dumps(metrics))
    config = {
        "policy": {"_target_": "x", **options.get("knobs", {})},
        "quantization": options.get("quant", {"backend": "none"}),
        **options.get("config", {}),
    }
    if policy == "adakv":
        config["policy"]["allocation"] = "adakv"
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder


def latency_record(root: Path) -> None:
    prefill = [
        {
            "context": c,
            "policy": p,
            "budget": None if p == "full" else 64,
            "seconds_median": 0.1 * c / 256,
            "peak_memory_bytes": (3 if p == "full" else 2) * c * 1000,
            "peak_memory_delta_bytes": c * 1000,
        }
        for c in (256, 512)
        for p in ("full", "snapkv", "restkv")
    ]
    decode = [
        {
            "context": c,
            "label": p,
            "cache": "dynamic",
            "budget": None,
            "ms_per_token_median": (2 if p == "full" else 1) * c / 100,
            "bound_ms": 1.0,
            "peak_memory_bytes": None,
        }
        for c in (256, 512)
        for p in ("full", "restkv")
    ]
    record = {
        "settings": {"name": "tiny"},
        "machine": {"device": "cpu"},
        "memory_method": "peak RSS",
        "model": {"shape": "tiny-llama", "dtype": "float32"},
        "prefill": prefill,
        "decode": decode,
    }
    (root / "efficiency").mkdir(parents=True)
    (root / "efficiency" / "tiny.json").write_text(json.dumps(record))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    for policy, quality in QUALITY.items():
        for budget in (64, 128):
            if policy.startswith("ablation") or policy == "random":
                if budget == 128:
                    write_run(root, "micro", policy, budget, quality)
                continue
            write_run(root, "micro", policy, budget, quality)
    write_run(root, "micro", "restkv", 128, 0.7, variant="q1", quant={"backend": "hqq", "nbits": 4})
    for i, alpha in enumerate((0.1, 0.6)):
        write_run(root, "micro", "restkv", 128, 0.6 + 0.1 * i, variant=f"a{i}", knobs={"alpha": alpha})
    for policy in ("full", "snapkv", "restkv"):
        write_run(
            root,
            "niah_micro",
            policy,
            64,
            QUALITY[policy],
            tasks=("micro_single_2",),
            lengths=(512, 1024),
            depths=(0.0, 50.0, 100.0),
            samples=2,
        )
    latency_record(root)
    return root


def test_the_tidy_table_has_every_run_task_length_and_average(runs: Path) -> None:
    table = run_table(runs, resamples=200)
    assert {
        "model",
        "bench",
        "task",
        "length",
        "policy",
        "budget",
        "allocation",
        "knobs",
        "protocol",
        "score",
        "score_low",
        "score_high",
        "samples",
        "prefill_seconds",
        "decode_seconds",
        "peak_memory_bytes",
    } <= set(table)
    runs_found = load_runs(runs)
    assert len(runs_found) == len(set(table.folder)) == 16
    headline = table[(table.task == "average") & (table.length == "all")]
    assert len(headline) == 16
    for run in runs_found:  # the headline equals the benchmark's own average, and its interval holds it
        row = headline[headline.folder == str(run.folder)].iloc[0]
        assert row.score == pytest.approx(run.average)
        assert row.score_low <= row.score <= row.score_high
    assert set(table[table.policy == "adakv"].allocation) == {"adakv"}
    assert set(table[table.variant == "a0"].knobs) == {"alpha=0.1"}
    assert set(table[table.variant == "q1"].quantization) == {"hqq-4bit"}
    by_length = table[
        (table.task == "average") & (table.policy == "full") & (table.budget == "64") & (table.bench == "micro")
    ]
    assert set(by_length.length) == {"1024", "2048", "all"}


def test_the_interval_of_an_average_resamples_within_tasks() -> None:
    scores = np.array([1.0] * 10 + [0.0] * 10)  # task a all right, task b all wrong: no spread within tasks
    low, high = interval(scores, np.array(["a"] * 10 + ["b"] * 10), resamples=300)
    assert low == high == pytest.approx(50.0)


def test_make_figures_all_draws_every_artifact_and_lists_missing_runs(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "figures"
    command = [sys.executable, str(REPO / "scripts" / "make_figures.py"), "all", "--runs", str(runs), "--out", str(out)]
    printed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    for name in NAMES:
        if name == "multi-turn":  # the fixture has no multi-turn run: see the test below
            continue
        assert f"{name}: {out}" in printed, f"{name} drew nothing:\n{printed}"
    pngs = sorted(out.glob("*.png"))
    for png in pngs:
        assert png.stat().st_size > 10_000, png
        assert png.with_suffix(".pdf").stat().st_size > 1_000, png
    assert (out / "runs.csv").stat().st_size > 0 and (out / "runs.md").read_text().startswith("| model |")
    assert pd.read_csv(out / "runs.csv").shape[0] > 16
    assert "python eval/run.py experiment=longbench_llama3" in printed  # the paper's own runs are missing here
    assert "niah_micro/micro-llama" not in printed.split("missing runs")[1]
    # one per-task and one by-length table per (bench, model), the knob and quantized runs as labelled rows
    tables = sorted(p.name for p in out.glob("tasks-*.md"))
    assert tables == ["tasks-micro-micro-llama.md", "tasks-niah_micro-micro-llama.md"]
    lines = (out / "lengths-micro-micro-llama.md").read_text().splitlines()
    rows = [line.split(" | ")[0].lstrip("| ") for line in lines]
    rows = [row for row in rows if "@" in row or row == "full"]
    assert rows[0] == "full" and rows.count("full") == 1  # the full cache once, first, whatever budgets it ran at
    restkv = [row for row in rows if row.startswith("restkv")]
    assert restkv == [
        "restkv @ 64",
        "restkv @ 128",
        "restkv (hqq-4bit) @ 128",
        "restkv (alpha=0.1) @ 128",
        "restkv (alpha=0.6) @ 128",
    ]
    assert (out / "lengths-micro-micro-llama-curves-budget64.png").exists()
    paired = (out / "paired-micro-micro-llama.md").read_text()
    assert "n=24" in paired and "| policy | 64 | 128 |" in paired and "snapkv" in paired and "[" in paired


def test_long_output_and_multi_turn_figures_are_report_artifacts(tmp_path: Path) -> None:
    """The figures ``plot_long_outputs.py`` draws are artifacts of the report, read from what the runner wrote."""
    root = tmp_path / "runs"
    turns = {"evaluation": {"_target_": "restkv.eval.evaluation.MultiTurn", "append_answers": True}}
    write_run(root, "micro", "restkv", 64, 0.7, config=turns, metrics={"turn_scores": [80.0, 60.0]})
    write_run(root, "micro", "snapkv", 64, 0.7, metrics={"answer_length": 12.5})
    report = build_report(root, tmp_path / "figures")
    written, _ = make_all(report, only=("long-outputs", "multi-turn"))
    assert [p.name for p in written["long-outputs"]] == ["long-outputs-lengths.png", "long-outputs-lengths.pdf"]
    assert [p.name for p in written["multi-turn"]] == ["multi-turn.png", "multi-turn.pdf"]
    assert [run.answer_length for run in report.runs if run.policy == "snapkv"] == [12.5]
    empty = tmp_path / "empty"
    write_run(empty, "micro", "snapkv", 64, 0.7)
    assert make_all(build_report(empty, tmp_path / "none"), only=("multi-turn",))[0]["multi-turn"] == []


def test_make_figures_table_prints_headline_rows(runs: Path, tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(REPO / "scripts" / "make_figures.py"),
        "table",
        "--runs",
        str(runs),
        "--out",
        str(tmp_path),
    ]
    printed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    assert printed.startswith("| model | bench | policy |") and "score_low" in printed
    assert printed.count("| micro-llama |") == 16
    assert (tmp_path / "runs.csv").exists()


def test_bad_input_is_named(tmp_path: Path) -> None:
    command = [sys.executable, str(REPO / "scripts" / "make_figures.py"), "all", "--runs", str(tmp_path / "nope")]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 2 and "no such folder" in done.stderr
    command[2] = "heatmaps"
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 2 and "unknown heatmaps" in done.stderr
    with pytest.raises(ValueError, match="unknown artifact"):
        make_all(build_report(tmp_path, tmp_path / "f"), ("nope",))


def test_a_sample_recorded_twice_with_two_scores_is_left_out_and_said_so(tmp_path: Path) -> None:
    """The runner refuses a folder whose sample has two results; the report uses neither, and says why (it took
    the last line before, beside a metrics.json computed from the first)."""
    folder = write_run(tmp_path, "micro", "snapkv", 64, 0.0, samples=1, lengths=(1024,), tasks=("passkey",))
    line = json.loads((folder / "predictions.jsonl").read_text())
    with (folder / "predictions.jsonl").open("a") as log:
        log.write(json.dumps({**line, "score": 1.0}) + "\n")
        log.write(json.dumps(line) + "\n")  # an identical repeat alone would be fine
    notes: list[str] = []
    assert sample_frame(load_runs(tmp_path, notes)).empty
    assert len(notes) == 1 and "has two different results, at lines 1 and 2" in notes[0]


def test_runs_without_predictions_are_drawn_with_the_papers_numbers(tmp_path: Path) -> None:
    """Metrics-only run folders (older runs) still make the LongBench curve, next to the paper's values."""
    for policy, scores in {"full": (40, 40), "snapkv": (30, 35), "restkv": (33, 37)}.items():
        for budget, score in zip((128, 512), scores, strict=True):
            folder = tmp_path / "longbench" / "llama-3.1-8b-instruct" / policy / f"budget{budget}"
            folder.mkdir(parents=True)
            tasks = {"qasper": score, "hotpotqa": score}
            (folder / "metrics.json").write_text(
                json.dumps({"average": score, "tasks": tasks, "samples": {"qasper": 5, "hotpotqa": 5}})
            )
    report = build_report(tmp_path, tmp_path / "figures")
    written, missing = make_all(report, ("budgets", "tasks"))
    assert [p.name for p in written["budgets"]] == [
        "budgets-longbench-llama-3.1-8b-instruct.png",
        "budgets-longbench-llama-3.1-8b-instruct.pdf",
    ]
    assert written["budgets"][0].stat().st_size > 20_000
    table = (tmp_path / "figures" / "tasks-longbench-llama-3.1-8b-instruct.md").read_text()
    assert "restkv @ 512" in table and "37.0" in table and "not in the sources" in table
    assert [(name, n.bench, n.model) for name, n in missing] == [
        ("budgets", "longbench", "llama-2-7b-chat"),
        ("budgets", "longbench", "mistral-7b-instruct-v0.3"),
        ("budgets", "micro", "micro-llama"),
        ("tasks", "infinitebench", "llama-3.1-8b-instruct"),
        ("tasks", "micro", "micro-llama"),
    ]
