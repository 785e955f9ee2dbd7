"""The policy guide's example works as docs/adding-a-policy.md says, in a copy of the tree: put in ``baselines/``
with its config, ``eval/run.py policy=keynorm`` runs with it, and so does ``python docs/examples/keynorm_policy.py``.

The copy is installed as a user installs a checkout (``pip install -e .``, no dependencies: they are this
environment's) in a virtual environment of its own, so that ``restkv.baselines`` is the copy's folder. It is the
only example the docs tell a user to copy; the benchmark guide's runs in place (tests/test_readme.py).
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "adding-a-policy.md"


def guide_config() -> str:
    """The config the guide shows, as written (its ```yaml block under ``# configs/policy/keynorm.yaml``)."""
    (block,) = re.findall(r"```yaml\n(# configs/policy/keynorm\.yaml\n.*?)```", GUIDE.read_text(), flags=re.S)
    return block


def installed_copy(tmp_path: Path) -> tuple[Path, Path]:
    """(a copy of the tracked tree, the python of a virtual environment where it is ``restkv``)."""
    tree = tmp_path / "tree"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in tracked.splitlines():
        if name.startswith(("tests/", "results/")) or not (ROOT / name).is_file():
            continue
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if subprocess.run([python, "-c", "import torch, hydra"], capture_output=True).returncode:
        # this environment's packages, when they are not the system's: its folders without its own editable restkv
        # (a path line of a .pth adds the folder only; the .pth files inside it are not run)
        ours = [*site.getsitepackages(), sysconfig.get_paths()["purelib"]]
        Path(purelib, "_parent_environment.pth").write_text("\n".join(dict.fromkeys(ours)) + "\n")
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-e", str(tree)],
        check=True,
        capture_output=True,
    )
    return tree, python


def test_the_guides_example_runs_as_the_guide_says(tmp_path: Path) -> None:
    tree, python = installed_copy(tmp_path)
    shutil.copy2(tree / "docs" / "examples" / "keynorm_policy.py", tree / "baselines" / "keynorm.py")
    (tree / "configs" / "policy" / "keynorm.yaml").write_text(guide_config())
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    where = subprocess.run(
        [python, "-c", "import restkv.baselines as b; print(b.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(tree)), where

    command = [
        "eval/run.py",
        "policy=keynorm",
        "policy.window=64",
        "bench=micro",
        "bench.lengths=[512]",
        "limit=1",
        f"out_dir={tmp_path / 'out'}",
    ]
    done = subprocess.run([python, *command], cwd=tree, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / "micro" / "micro-llama" / "keynorm").is_dir(), done.stdout
    assert "results: " in done.stdout

    done = subprocess.run(
        [python, "docs/examples/keynorm_policy.py"], cwd=tree, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "each layer kept [40, 40, 40, 40] tokens of 100" in done.stdout
