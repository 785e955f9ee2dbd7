"""A regular (non-editable) install carries every package, the configs and the bundled models."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from restkv.eval.models import paths

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _folders() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("docs_api_pages", ROOT / "scripts" / "docs_api_pages.py")
    assert spec is not None and spec.loader is not None
    pages = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pages)
    return pages.FOLDERS


FOLDERS = _folders()
"""Folder of the checkout -> its import name, from pyproject.toml (the docs script is its one reader)."""


def test_every_package_of_the_tree_is_listed() -> None:
    names = FOLDERS  # read from pyproject.toml's package-dir (scripts/docs_api_pages.py)
    assert len(names) > 1 and all(
        name.split(".")[0] == "restkv" and (ROOT / folder / "__init__.py").is_file() for folder, name in names.items()
    )
    found = {
        ".".join((name, *init.parent.relative_to(ROOT / top).parts))
        for top, name in names.items()
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert found <= set(PYPROJECT["packages"]), (
        f"not in pyproject's packages: {sorted(found - set(PYPROJECT['packages']))}"
    )
    for package, folder in PYPROJECT["package-dir"].items():
        assert package in PYPROJECT["packages"] and (ROOT / folder).is_dir()


def test_a_checkout_uses_its_own_folders() -> None:
    assert paths.CHECKOUT == ROOT
    assert paths.bundled("configs") == ROOT / "configs"
    assert paths.local_path(ROOT / "models" / "micro-llama") == ROOT / "models" / "micro-llama"
    assert paths.local_path("models/micro-llama").resolve() == ROOT / "models" / "micro-llama"
    assert paths.local_path("no/such/thing") is None
    with pytest.raises(ValueError, match="bundled folder 'data' is not one of: configs, models"):
        paths.bundled("data")


@pytest.mark.slow
def test_regular_install_runs_from_any_folder(tmp_path: Path) -> None:
    wheels, target, elsewhere = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, ROOT], check=True)
    subprocess.run([*pip, "install", "--no-deps", "--target", target, *wheels.glob("*.whl")], check=True)
    env = {**os.environ, "PYTHONPATH": str(target)}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "restkv.eval.run",
            "bench=ruler",
            "bench.tasks=[niah_single_1]",
            "limit=1",
            "out_dir=out",
        ],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    (metrics,) = (elsewhere / "out").rglob("metrics.json")
    assert json.loads(metrics.read_text())["tasks"]["niah_single_1"] >= 0
    where = subprocess.run(
        [sys.executable, "-c", "import restkv.eval.models.paths as p; print(p.CHECKOUT, p.bundled('models'))"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.split()[0] == "None" and where.stdout.split()[1].startswith(str(target))
