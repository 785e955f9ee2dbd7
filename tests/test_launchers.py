"""Sweeps on Hydra's launchers: joblib cells in parallel with a GPU slot each, a killed sweep resumed
without redoing finished cells or samples, and the slurm launcher writing the same run folders."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from restkv.eval.harness import gpu_slots
from restkv.eval.harness.run_folder import METRICS, PREDICTIONS
from restkv.eval.harness.runner import folder_of
from restkv.eval.run import CONFIGS, run_settings
from restkv.select import Budget

pytest.importorskip(
    "hydra_plugins.hydra_joblib_launcher", reason='hydra/launcher=joblib needs pip install -e ".[launchers]"'
)

ROOT = Path(__file__).resolve().parents[1]
CHEAP = ["bench=micro", "bench.samples=1", "bench.tasks=[passkey]", "bench.lengths=[512]"]
SWEEP = ["policy=snapkv,restkv", "budget=64,128,256"]
JOBLIB = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]


def sweep_command(out_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-W", "ignore", str(ROOT / "eval" / "run.py"), "-m", *JOBLIB, *extra, f"out_dir={out_dir}"]


def environment(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **extra}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(extra)
    return env


def finished_cells(out_dir: Path) -> list[Path]:
    return sorted(path.parent for path in out_dir.glob(f"micro/*/*/*/{METRICS}"))


def test_two_processes_claim_the_two_visible_gpus(tmp_path: Path) -> None:
    """Each process takes the first free slot; a third is refused while both are held."""
    claim = (
        "import sys, time; from pathlib import Path; from restkv.eval.harness import gpu_slots; "
        "slot = gpu_slots.claim_slot(Path(sys.argv[1]), gpu_slots.visible_gpus()); "
        "print(slot.device, flush=True); time.sleep(float(sys.argv[2]))"
    )
    env = environment(CUDA_VISIBLE_DEVICES="3,5")
    first = subprocess.Popen(
        [sys.executable, "-c", claim, str(tmp_path), "3"], env=env, stdout=subprocess.PIPE, text=True
    )
    assert first.stdout is not None and first.stdout.readline().strip() == "3"
    second = subprocess.run(
        [sys.executable, "-c", claim, str(tmp_path), "0"], env=env, capture_output=True, text=True, timeout=60
    )
    assert second.stdout.strip() == "5"  # slot 0 is held by the first process, alive
    first.wait(timeout=60)
    again = subprocess.run(
        [sys.executable, "-c", claim, str(tmp_path), "0"], env=env, capture_output=True, text=True, timeout=60
    )
    assert again.stdout.strip() == "3"  # a lock dies with its process: the first slot is free again


def joblib_job(n_jobs: int, mode: str = "MULTIRUN") -> DictConfig:
    """The parts of a joblib cell's Hydra config that `gpu_slots.claim_for_job` reads."""
    from hydra.types import RunMode

    target = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
    hydra_cfg = OmegaConf.create({"launcher": {"_target_": target, "n_jobs": n_jobs}, "sweep": {"dir": "unused"}})
    hydra_cfg.mode = RunMode[mode]
    return hydra_cfg


def test_more_workers_than_gpus_a_held_slot_and_bad_n_jobs_are_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(gpu_slots.GpuSlotError, match="n_jobs=4 runs 4 cells at once, but 2 GPU"):
        gpu_slots.claim_for_job(joblib_job(4), "auto")
    assert gpu_slots.claim_for_job(joblib_job(4), "cpu") is None  # device=cpu: nothing to claim
    assert gpu_slots.claim_for_job(joblib_job(1, "RUN"), "auto") is None  # a single run
    slot = gpu_slots.claim_slot(tmp_path, ["0"])
    try:
        assert gpu_slots.claim_slot(tmp_path, ["0"]) == slot  # one process keeps one claim
        other = subprocess.run(
            [
                sys.executable,
                "-c",
                f"from restkv.eval.harness import gpu_slots; gpu_slots.claim_slot({str(tmp_path)!r}, ['0'])",
            ],
            env=environment(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert other.returncode != 0 and "every GPU slot" in other.stderr and "hydra.launcher.n_jobs" in other.stderr
    finally:
        gpu_slots.release_slot()
    for n_jobs in (0, "2", True):
        with pytest.raises(gpu_slots.GpuSlotError, match="is not allowed"):
            gpu_slots.parallel_workers(n_jobs)
    assert gpu_slots.parallel_workers(-1, cpus=8) == 8
    assert gpu_slots.parallel_workers(-2, cpus=8) == 7


def test_a_six_cell_sweep_runs_in_parallel_with_a_gpu_slot_per_worker(tmp_path: Path) -> None:
    """Two joblib workers, each holding its own slot (``CUDA_VISIBLE_DEVICES=3,5`` simulated: torch here
    is a CPU build, so the run itself stays on the CPU): slot 1 is only taken while slot 0's owner lives,
    so two workers ran at once; every cell writes its metrics."""
    done = subprocess.run(
        sweep_command(tmp_path, *CHEAP, *SWEEP),
        env=environment(CUDA_VISIBLE_DEVICES="3,5"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(finished_cells(tmp_path)) == 6
    claims = set(
        re.findall(r"gpu slot (\d): this worker \(process (\d+)\) uses CUDA_VISIBLE_DEVICES=(\d)", done.stdout)
    )
    assert {(slot, device) for slot, _, device in claims} == {("0", "3"), ("1", "5")}
    assert len({pid for _, pid, _ in claims}) == 2
    locks = sorted((tmp_path / ".sweeps").glob(f"*/{gpu_slots.SLOTS_FOLDER}/*.lock"))
    assert [path.name for path in locks] == ["0.lock", "1.lock"]


def test_a_killed_sweep_resumes_without_redoing_finished_cells_or_samples(tmp_path: Path) -> None:
    command = sweep_command(tmp_path, *CHEAP, "bench.samples=3", *SWEEP)
    process = subprocess.Popen(
        command, env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 240
    while len(finished_cells(tmp_path)) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    finished = {folder: (folder / PREDICTIONS).read_bytes() for folder in finished_cells(tmp_path)}
    assert 2 <= len(finished) < 6, "the sweep was not cut in the middle"
    partial = {
        path.parent: path.read_bytes()
        for path in tmp_path.glob(f"micro/*/*/*/{PREDICTIONS}")
        if path.parent not in finished
    }

    done = subprocess.run(command, env=environment(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(finished_cells(tmp_path)) == 6
    for folder, before in finished.items():
        assert (folder / PREDICTIONS).read_bytes() == before  # nothing appended: no sample recomputed
    for folder, before in partial.items():
        kept = before[: before.rfind(b"\n") + 1]  # a line cut by the kill is redone
        after = (folder / PREDICTIONS).read_bytes()
        assert after.startswith(kept)
        ids = [json.loads(line)["id"] for line in after.decode().splitlines()]
        assert len(ids) == len(set(ids)) == 3


def job_folder(out_dir: Path, *launcher: str) -> Path:
    """The run folder of a cell under ``launcher`` (overrides), named from its composed config as eval/run.py does."""
    overrides = [*launcher, *CHEAP, "policy=restkv", "budget=64", f"out_dir={out_dir}"]
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    return folder_of(run_settings(cfg, cfg.hydra), Budget(cfg.budget))


def test_the_slurm_launcher_writes_the_run_folders_of_the_joblib_one(tmp_path: Path) -> None:
    """Same folders, so a sweep started on one launcher resumes on the other (the runner resumes any folder)."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason='hydra/launcher=slurm needs ".[slurm]"')
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher") and cfg.hydra.launcher.gpus_per_node == 1
    slurm = job_folder(tmp_path, "hydra/launcher=slurm", "hydra.launcher.partition=gpu")
    joblib = job_folder(tmp_path, *JOBLIB)
    assert slurm == joblib == job_folder(tmp_path) == job_folder(tmp_path, *JOBLIB, "logger=wandb")
    assert slurm.relative_to(tmp_path).parts[:3] == ("micro", "micro-llama", "restkv")
