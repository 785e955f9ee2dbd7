"""Every command the README and the guides show still works: run commands compose and validate, the first run
runs, and the scripts they name exist and answer ``--help``."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import restkv.eval.harness.runner  # noqa: F401  (registers the config resolvers)
from restkv.eval.harness.validate import check_config
from restkv.eval.run import CONFIGS

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FIRST_RUN = "python eval/run.py bench=micro budget=64 limit=8"


def shown_commands() -> list[tuple[str, str]]:
    """(page, command) for every indented command line of a page, continuation lines joined, comments cut."""
    found = []
    for page in PAGES:
        text = re.sub(r"\\\n\s*", " ", page.read_text())
        for line in text.splitlines():
            if line.startswith("    ") and line.strip().startswith(("python ", "bash ")):
                found.append((page.name, re.split(r"\s#\s", line)[0].strip()))
    return found


COMMANDS = shown_commands()
RUNS = sorted({c for _, c in COMMANDS if c.startswith("python eval/run.py")})
SCRIPTS = sorted({shlex.split(c)[1] for _, c in COMMANDS if re.match(r"(python|bash) scripts/", c)})


def test_the_pages_show_commands() -> None:
    assert FIRST_RUN in RUNS and len(RUNS) > 20 and "scripts/make_figures.py" in SCRIPTS


@pytest.mark.parametrize("command", RUNS)
def test_every_run_command_composes_and_validates(command: str) -> None:
    """Each override names a real key or group with an allowed value (the first value of a sweep's list)."""
    overrides = []
    for word in shlex.split(command)[2:]:
        if word in ("-m", "--check"):  # Hydra's sweep flag, the check-only flag
            continue
        key, _, value = word.partition("=")
        if key.startswith("hydra/launcher"):
            assert (ROOT / "configs" / "hydra" / "launcher" / f"{value}.yaml").is_file(), word
            continue
        if key.startswith("hydra."):
            continue
        if "," in value and not value.startswith("["):
            value = value.split(",")[0]
        overrides.append(f"{key}={value}")
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    values = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(values, dict)
    check_config(values)


def test_the_first_run_runs(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, *shlex.split(FIRST_RUN)[1:], f"out_dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"results: {tmp_path}/micro/micro-llama/restkv/budget64" in run.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_shown_exists_and_answers_help(script: str) -> None:
    assert (ROOT / script).is_file(), script
    if script.endswith(".py"):
        run = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-2000:]
