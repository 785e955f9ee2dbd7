"""logger=wandb: a finished run logged offline (config, metrics, per-sample table); without the package the
run stops before any work with the install command; logger=none imports nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from restkv.eval.harness import tracking
from restkv.eval.harness.run_folder import METRICS, PREDICTIONS
from restkv.eval.run import CONFIGS

ROOT = Path(__file__).resolve().parents[1]
CHEAP = ["bench=micro", "bench.samples=2", "bench.tasks=[passkey]", "bench.lengths=[512]", "policy=snapkv", "budget=64"]


def composed(*overrides: str):
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def run(out_dir: Path, *overrides: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-W", "ignore", str(ROOT / "eval" / "run.py"), *CHEAP, *overrides, f"out_dir={out_dir}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def test_logger_none_is_the_default_and_imports_nothing(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # importing wandb would fail
    assert tracking.tracker_for(composed()) is None


def test_a_missing_wandb_stops_the_run_before_any_work(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(tracking.TrackingUnavailable, match=r'pip install -e "\.\[tracking\]"'):
        tracking.tracker_for(composed("logger=wandb"))
    blocker = tmp_path / "sitecustomize.py"  # the same in a real run: no folder is written
    blocker.write_text("import sys\nsys.modules['wandb'] = None\n")
    done = run(tmp_path / "out", "logger=wandb", env={**_env(tmp_path), "PYTHONPATH": str(tmp_path)})
    assert done.returncode != 0
    assert 'pip install -e ".[tracking]"' in done.stdout + done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("logger.mode=sometimes", "logger.mode='sometimes' is not allowed; choose one of: offline, online, disabled"),
        ("+logger.colour=red", "logger.colour is not a wandb logger setting"),
        ("logger.backend=mlflow", "logger.backend='mlflow' is not allowed; choose one of: none, wandb"),
    ],
)
def test_bad_logger_settings_are_named(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        tracking.tracker_for(composed("logger=wandb", override))


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path / "wandb-home")}


def test_logger_wandb_logs_a_finished_run_offline(tmp_path: Path) -> None:
    pytest.importorskip("wandb", reason='logger=wandb needs the wandb package: pip install -e ".[tracking]"')
    out = tmp_path / "out"
    plain = run(out, env=_env(tmp_path))
    assert plain.returncode == 0, plain.stderr[-3000:]
    (folder,) = {path.parent for path in out.glob(f"micro/*/*/*/{METRICS}")}
    before = (folder / PREDICTIONS).read_bytes()

    logged = run(out, "logger=wandb", env=_env(tmp_path))  # same folder: the logger is not in its name
    assert logged.returncode == 0, logged.stderr[-3000:]
    assert (folder / PREDICTIONS).read_bytes() == before  # nothing recomputed
    (offline,) = (folder / "wandb").glob("offline-run-*")
    assert "wandb sync" in logged.stdout
    assert next(offline.glob("*.wandb")).stat().st_size > 0
    (table,) = offline.glob("files/media/table/predictions_*.table.json")
    content = json.loads(table.read_text())
    assert "score" in content["columns"] and len(content["data"]) == 2

    record = next(offline.glob("*.wandb")).read_bytes()  # the offline log holds config and logged numbers as text
    assert b"average" in record and b"tasks/passkey" in record and b"snapkv" in record


def test_numbers_and_rows_flatten_what_wandb_takes(tmp_path: Path) -> None:
    summary = {"average": 50.0, "tasks": {"a": 1.0}, "ran": ["a"], "ok": True, "nan": float("nan"), "budget": "64"}
    assert tracking.numbers(summary) == {"average": 50.0, "tasks/a": 1.0}
    path = tmp_path / PREDICTIONS
    lines = [{"id": "x", "task": "t", "score": 1.0, "references": ["a"]}, {"id": "y", "task": "t", "score": 0}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"id": "z", "ta')  # a torn last line
    columns, rows = tracking.prediction_rows(path)  # the runner's reader: the torn line is not a row
    assert columns == ["id", "task", "score", "references"]
    assert rows == [["x", "t", 1.0, '["a"]'], ["y", "t", 0, None]]
    assert OmegaConf.to_container(composed("logger=wandb").logger)["mode"] == "offline"
