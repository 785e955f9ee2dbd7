"""The one-command policy comparison and the results collector."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from restkv.eval.report.collect import format_grid, load_runs, pivot, select

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("bench", "task"), [("ruler", "niah_single_1"), ("micro", "micro_multivalue")])
def test_compare_policies_prints_tables_and_plots(tmp_path: Path, bench: str, task: str) -> None:
    command = [
        sys.executable,
        str(REPO / "scripts" / "compare_policies.py"),
        "--model",
        "tiny-random-llama",
        "--policies",
        "full",
        "streamingllm",
        "restkv",
        "--budgets",
        "64",
        "128",
        "--bench",
        bench,
        "--tasks",
        task,
        "--lengths",
        "600",
        "--samples",
        "1",
        "--fidelity-tokens",
        "3",
        "--out",
        str(tmp_path),
        "--quant-policy",
        "streamingllm",
        "--quant-bits",
        "16",
        "4",
        "--quant-group-size",
        "32",
        "--quant",
    ]
    out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert (
        f"accuracy (%) - tiny-random-llama, {bench} 600 tokens" in out
        and "greedy agreement" in out
        and "KL(full || evicted)" in out
    )
    assert (tmp_path / "compare" / "tiny-random-llama-accuracy.png").exists()
    progress = re.findall(r"^compare: run (\d+)/(\d+): ", out, re.M)
    assert [int(done) for done, _ in progress] == list(range(1, 18)) and {total for _, total in progress} == {"17"}
    assert "left)" in out  # an estimate of the time left once a run has finished
    intervals = out[out.index("with 95 % bootstrap intervals") : out.index("restkv minus each policy")]
    assert re.search(r"^streamingllm\s+[\d.]+ \[\s*[\d.]+,\s*[\d.]+\]", intervals, re.M), intervals
    paired = out[out.index("restkv minus each policy") :].splitlines()
    assert paired[3].split()[0] == "full" and paired[4].split()[0] == "streamingllm" and "[" in paired[4], paired[:5]
    quantized = out[out.index("with a quantized cache") :]
    assert "16-bit" in quantized and "4-bit" in quantized and "KiB stored" in quantized
    kib = {line.split()[0]: float(line.split()[1]) for line in quantized.splitlines() if line.startswith(("16-", "4-"))}
    assert kib["4-bit"] < kib["16-bit"] / 2, kib

    runs = load_runs(tmp_path)
    accuracy = select(runs, bench=bench)
    assert {(r.policy, r.budget) for r in accuracy} == {
        ("full", "64"),
        ("streamingllm", "64"),
        ("streamingllm", "128"),
        ("restkv", "64"),
        ("restkv", "128"),
    }
    assert all(r.variant for r in accuracy), "bench overrides are hashed into the folder name"
    policies, budgets, grid = pivot(select(runs, bench="fidelity"))
    assert sorted(policies) == ["restkv", "streamingllm"] and budgets == ["64", "128"]
    table = format_grid(policies, budgets, grid)
    assert table.splitlines()[0].split() == ["policy", "64", "128"]


def test_the_phase_table_pairs_decode_time_with_prefill_eviction(tmp_path: Path) -> None:
    out = quick_compare(
        tmp_path, "--policies", "snapkv", "--phases", "--phase-policies", "snapkv", "rkv", "--phase-interval", "4"
    )
    assert "eviction during decoding (interval 4) or at the prompt's end" in out
    assert re.search(r"^snapkv decode\s+\d", out, re.M) and re.search(r"^rkv prefill\s+\d", out, re.M)
    assert "decode-time minus prefill-only (points), paired" in out and "mean answer length" in out
    assert re.findall(r"compare: run \d+/(\d+)", out)[-1] == "5"  # 1 accuracy run + 2 policies x 2 phases
    # snapkv's prefill run is shared with the accuracy table; the decode-time runs have folders of their own
    assert len(list(tmp_path.rglob("predictions.jsonl"))) == 4


def test_the_turns_table_asks_several_questions_per_context(tmp_path: Path) -> None:
    out = quick_compare(
        tmp_path, "--policies", "restkv", "--turns", "--turn-policies", "full", "restkv", "--turn-samples", "1"
    )
    assert "several questions per compressed context (evaluation=multi_turn)" in out
    assert re.search(r"^\s+full @\s+64:(\s+\d+\.\d){4}$", out, re.M)  # four turns: the asked key and three more
    assert "restkv minus each policy" in out


def quick_compare(tmp_path: Path, *extra: str) -> str:
    """compare_policies on the tiny model, one passkey prompt of 600 tokens at budget 64, no fidelity runs."""
    command = [
        sys.executable,
        str(REPO / "scripts" / "compare_policies.py"),
        "--model",
        "tiny-random-llama",
        "--budgets",
        "64",
        "--bench",
        "micro",
        "--tasks",
        "passkey",
        "--lengths",
        "600",
        "--samples",
        "1",
        "--no-fidelity",
        "--out",
        str(tmp_path),
        *extra,
    ]
    return subprocess.run(command, capture_output=True, text=True, check=True, cwd=tmp_path).stdout
