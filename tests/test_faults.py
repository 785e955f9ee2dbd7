"""Faults a long run meets, on the tiny model: kills, a second writer, a config or weights edited between runs.

Each must end either in the same predictions an uninterrupted run gives, or in a refusal that
leaves the finished predictions untouched.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from restkv.eval.harness.identity import IdentityMismatch
from restkv.eval.harness.run_folder import PREDICTIONS, RunLockedError
from restkv.eval.harness.runner import RunSettings, run_benchmark
from restkv.eval.run import CONFIGS, other_overrides

REPO = Path(CONFIGS).parent
TIMINGS = ("prefill_seconds", "decode_seconds")
RUN = [
    "model=tiny-random-llama",
    "budget=64",
    "policy.window=8",
    "bench.tasks=[niah_single_1,niah_single_2]",
    "bench.lengths=[600]",
    "bench.fit=exact",  # 600 tokens are below the official fit's 500-word essay step
    "bench.samples=4",
]


def compose_run(out: Path, *overrides: str, config_dir: Path = Path(CONFIGS)):
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="config", overrides=[*RUN, f"out_dir={out}", *overrides])


def run_here(out: Path, *overrides: str, config_dir: Path = Path(CONFIGS)) -> dict:
    cfg = compose_run(out, *overrides, config_dir=config_dir)
    named = other_overrides([*RUN, *overrides])  # the folder eval/run.py would use for the same command
    return run_benchmark(cfg, RunSettings("ruler", "tiny-random-llama", "restkv", overrides=named, out_dir=out))


def predictions(out: Path) -> dict[str, dict]:
    """id -> record without its timings; fails on a duplicate id."""
    (path,) = out.rglob(PREDICTIONS)
    records: dict[str, dict] = {}
    for line in path.read_text().splitlines():
        record = {k: v for k, v in json.loads(line).items() if k not in TIMINGS}
        assert record["id"] not in records, f"{record['id']} written twice"
        records[record["id"]] = record
    return records


def start(out: Path, *overrides: str) -> subprocess.Popen:
    command = [sys.executable, str(REPO / "eval" / "run.py"), *RUN, f"out_dir={out}", *overrides]
    # output to files, not pipes: an unread pipe fills with progress bars and stalls the run
    log = (out.parent / f"{out.name}.log").open("a")
    return subprocess.Popen(command, stdout=log, stderr=log, cwd=out.parent)


def wait_for_lines(out: Path, count: int, process: subprocess.Popen, timeout: float = 180) -> int:
    """Wait until the run has written ``count`` finished lines (or has ended); returns how many it has."""
    deadline = time.time() + timeout
    lines = 0
    while time.time() < deadline and process.poll() is None:
        files = list(out.rglob(PREDICTIONS))
        lines = len(files[0].read_text().splitlines()) if files else 0
        if lines >= count:
            break
        time.sleep(0.02)
    return lines


@pytest.mark.slow
def test_killed_at_random_moments_ends_as_an_uninterrupted_run(tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    run_here(reference)
    out = tmp_path / "killed"
    out.mkdir()
    moments = random.Random(18)
    done = 0
    for _ in range(3):
        process = start(out)
        done = wait_for_lines(out, done + 1, process)
        time.sleep(moments.uniform(0, 0.4))  # somewhere inside the next sample, or writing it
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert done < 8, "the runs finished before they could be killed"
    finish = subprocess.run(
        [sys.executable, str(REPO / "eval" / "run.py"), *RUN, f"out_dir={out}"], capture_output=True, text=True
    )
    assert finish.returncode == 0, finish.stderr[-2000:]
    assert predictions(out) == predictions(reference)


def test_a_second_run_on_a_busy_folder_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "busy"
    out.mkdir()
    long = "bench.samples=50"  # long enough to still be running when the second run starts
    process = start(out, long)
    try:
        assert wait_for_lines(out, 1, process) >= 1
        with pytest.raises(RunLockedError, match=f"is in use by process {process.pid} on host"):
            run_here(out, long)
        assert process.poll() is None, "the first run ended before the second one was refused"
    finally:
        process.kill()
        process.wait()
    predictions(out)  # every id once: the refused run wrote nothing


def test_a_config_edited_between_runs_is_refused_or_gets_its_own_folder(tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    shutil.copytree(CONFIGS, configs)
    out = tmp_path / "out"
    run_here(out, "limit=2", config_dir=configs)
    (folder,) = {p.parent for p in out.rglob(PREDICTIONS)}
    before = (folder / PREDICTIONS).read_text()
    policy = configs / "policy" / "restkv.yaml"
    policy.write_text(policy.read_text() + "alpha: 0.5\n")  # edited between runs: not on the command line
    with pytest.raises(IdentityMismatch, match=r"another experiment[\s\S]*policy.alpha: 0.3 -> 0.5"):
        run_here(out, config_dir=configs)
    assert (folder / PREDICTIONS).read_text() == before
    run_here(out, "limit=2", "on_change=new_folder", config_dir=configs)
    sibling = folder.with_name(folder.name + "~2")
    assert len((sibling / PREDICTIONS).read_text().splitlines()) == 2
    assert (folder / PREDICTIONS).read_text() == before
    policy.write_text(policy.read_text().replace("alpha: 0.5\n", ""))
    run_here(out, config_dir=configs)  # the original config resumes its own folder
    assert len((folder / PREDICTIONS).read_text().splitlines()) == 8


def test_a_folder_written_before_new_knobs_existed_resumes_at_their_defaults(tmp_path: Path) -> None:
    """An identity without the knobs a newer restkv added (here: the head-wise allocation's, merging's,
    ThinK's, the layout and the quantization) is the same experiment when they are at their defaults,
    and another one otherwise."""
    out = tmp_path / "out"
    run_here(out, "limit=2")
    (identity_file,) = out.rglob("identity.json")
    saved = json.loads(identity_file.read_text())
    added = ("allocation", "floor", "allocation_normalize", "head_scores", "head_beta", "merge", "merge_start")
    for knob in (*added, "merge_seed", "think_ratio", "think_recent", "power"):
        del saved["config"]["policy"][knob]
    del saved["config"]["layout"]
    del saved["config"]["quantization"]
    identity_file.write_text(json.dumps(saved))
    run_here(out, "limit=4")  # resumes: two more predictions in the same folder
    assert len(predictions(out)) == 4
    # at another value the key makes another experiment (a command-line override gets its own folder anyway)
    from restkv.eval.harness.identity import with_added_defaults

    new = {"config": {"layout": "masked", "policy": {"floor": 0.2}}}
    filled = with_added_defaults(
        {"config": {"policy": {}}}, new, {("config", "layout"): "auto", ("config", "policy", "floor"): 0.2}
    )
    assert filled == {"config": {"policy": {"floor": 0.2}}}  # floor filled in (at its default), layout not


def test_a_folder_written_before_the_classes_moved_resumes(tmp_path: Path) -> None:
    """An identity naming the old places of the benchmark and strategy classes (``eval.benchmarks.ruler.
    RulerBenchmark``, ``eval.evaluation.Generate``; ``baselines.SnapKV`` ...: restkv < 0.2) is the same
    experiment; the old name of another class is not."""
    from restkv.eval.harness.identity import MOVED_TARGETS

    out = tmp_path / "out"
    run_here(out, "limit=2")
    (identity_file,) = out.rglob("identity.json")
    saved = json.loads(identity_file.read_text())
    old = {new: old for old, new in MOVED_TARGETS.items()}
    for group in ("bench", "evaluation"):
        saved["config"][group]["_target_"] = old[saved["config"][group]["_target_"]]
    assert saved["config"]["bench"]["_target_"] == "eval.benchmarks.ruler.RulerBenchmark"
    assert saved["config"]["evaluation"]["_target_"] == "eval.evaluation.Generate"
    identity_file.write_text(json.dumps(saved))
    run_here(out, "limit=4")  # resumes: two more predictions in the same folder
    assert len(predictions(out)) == 4
    saved["config"]["policy"]["_target_"] = "baselines.SnapKV"  # an old name of another class
    identity_file.write_text(json.dumps(saved))
    with pytest.raises(IdentityMismatch, match=r"policy._target_: 'restkv.baselines.SnapKV' -> 'restkv.ReSTKV'"):
        run_here(out, "limit=4")


def _local_model(folder: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    source = REPO / "models" / "tiny-random-llama"
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source)).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, folder / name)


def test_weights_changed_in_the_middle_are_refused(tmp_path: Path) -> None:
    model = tmp_path / "model"
    _local_model(model)
    out = tmp_path / "out"
    local = [f"model.path={model}", "model.random_init=false"]
    run_here(out, *local, "limit=2")
    (folder,) = {p.parent for p in out.rglob(PREDICTIONS)}
    before = (folder / PREDICTIONS).read_text()
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes(4096)  # same size, first and last MiB untouched
    weights.write_bytes(bytes(data))
    with pytest.raises(IdentityMismatch, match="predictions of other weights of this model"):
        run_here(out, *local)
    assert (folder / PREDICTIONS).read_text() == before
