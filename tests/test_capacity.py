"""The capacity benchmark (``mode: capacity``) on a tiny shape: budgets, the batch search, the record, table, plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from restkv.eval.harness.config_tree import CONFIGS
from restkv.eval.latency.capacity import Budget, budgets_for, largest_batch
from restkv.eval.latency.cli import run
from restkv.eval.latency.settings import Settings


def test_budgets_are_fractions_of_the_context_and_token_counts_below_it():
    assert budgets_for(4096, ["full", 0.5, 0.0625, 2048, 4096, 256]) == [
        Budget("full", None),
        Budget("50%", 2048),
        Budget("6.25%", 256),
        Budget("2048", 2048),
        Budget("256", 256),
    ]
    with pytest.raises(ValueError, match=r"capacity_budgets=.*each is full, a fraction"):
        Settings(name="x", shape="tiny-llama", mode="capacity", capacity_budgets=["full", 1.5])


@pytest.mark.parametrize(("limit", "most"), [(0, 64), (1, 64), (5, 64), (37, 64), (64, 64), (500, 64), (7, 7)])
def test_the_search_finds_the_largest_batch_that_fits(limit, most):
    asked = []

    def fits(rows: int) -> bool:
        asked.append(rows)
        return rows <= limit

    rows, tries = largest_batch(fits, most)
    assert rows == min(limit, most) and tries == len(asked) and max(asked) <= most
    assert tries <= 2 * (most.bit_length() + 1)


def test_a_cpu_run_needs_a_simulated_memory_budget(tmp_path):
    settings = Settings(name="x", shape="tiny-llama", mode="capacity", device="cpu", out_dir=str(tmp_path))
    with pytest.raises(ValueError, match="memory_cap_mib=null: on a CPU the capacity search needs a simulated"):
        run(settings)


def test_the_capacity_preset_composes():
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        for preset in ("capacity", "capacity-gpu"):
            cfg = compose(config_name="latency_main", overrides=[f"latency={preset}"])
            settings = Settings.from_config(cfg.latency, preset)
            assert settings.mode == "capacity" and settings.capacity_policies == ["snapkv", "restkv", "ada_restkv"]


def test_a_tiny_capacity_run_writes_its_record_table_and_plot(tmp_path: Path):
    settings = Settings(
        name="cap",
        shape="tiny-llama",
        mode="capacity",
        device="cpu",
        contexts=[256],
        out_dir=str(tmp_path),
        capacity_policies=["snapkv", "ada_restkv"],
        capacity_budgets=["full", 0.25, 64],
        capacity_max_batch=16,
        memory_cap_mib=2,
        decode_tokens=2,
        warmup=0,
        repeats=1,
        bandwidth_mib=8,
        bandwidth_repeats=1,
    )
    record = run(settings)
    assert json.loads((tmp_path / "cap.json").read_text())["entries"] == record["entries"]
    assert (tmp_path / "cap.png").stat().st_size > 0
    table = (tmp_path / "cap.md").read_text()
    assert "simulated" in table and sum(line.startswith("| 256 |") for line in table.splitlines()) == 5
    entries = {(e["policy"], e["budget"]): e for e in record["entries"]}
    assert set(entries) == {
        ("full", "full"),
        ("snapkv", "25%"),
        ("snapkv", "64"),
        ("ada_restkv", "25%"),
        ("ada_restkv", "64"),
    }
    cap, weights = record["memory_cap_bytes"], record["parameter_bytes_read_per_step"]
    for e in entries.values():  # the simulated search's arithmetic, checked from the entry's own numbers
        room = (cap - weights - e["prefill_headroom_bytes"]) // e["row_bytes"]
        assert e["batch"] == min(room, 16) >= 1
        assert e["tokens_per_second"] > 0 and e["ratio_to_bound"] > 0 and e["ttft_seconds"] > 0
        assert e["peak_memory_bytes"] <= cap and e["decode_path"] == "static"
    full = entries[("full", "full")]
    assert entries[("snapkv", "64")]["batch"] > full["batch"] and entries[("snapkv", "64")]["kept_tokens_mean"] == 64
    assert entries[("snapkv", "64")]["batch_vs_full"] == round(entries[("snapkv", "64")]["batch"] / full["batch"], 3)


def _bash_array(name: str) -> list[str]:
    """The words of ``name=(...)`` in scripts/gpu_check.sh, as bash splits them (quotes removed)."""
    import shlex

    script = (Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh").read_text()
    (line,) = [line for line in script.splitlines() if line.startswith(f"{name}=(")]
    return shlex.split(line[len(name) + 2 : line.rindex(")")])


def test_gpu_checks_capacity_and_fast_path_steps_compose_on_a_cpu():
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    assert subprocess.run(["bash", "-n", "scripts/gpu_check.sh"], cwd=root).returncode == 0
    import restkv.eval.latency.cli  # noqa: F401  (registers the primary config)

    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        for overrides in (["latency=capacity-gpu", *_bash_array("capacity_overrides")], _bash_array("capacity_dry")):
            cfg = compose(config_name="latency_main", overrides=[*overrides, "latency.name=capacity"])
            settings = Settings.from_config(cfg.latency, "capacity")
            assert settings.mode == "capacity" and settings.contexts in ([32768], [512])
    help_ = subprocess.run([sys.executable, "scripts/check_fast_paths.py", "--help"], cwd=root, capture_output=True)
    assert help_.returncode == 0 and b"--dry-run" in help_.stdout
