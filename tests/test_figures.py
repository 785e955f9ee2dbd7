"""Figures from a results tree (written here by hand: no model runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def fake_run(root: Path, policy: str, budget: str, average: float, variant: str = "", alpha: float = 0.3) -> None:
    folder = root / "longbench" / "m" / policy / (f"budget{budget}" + (f"-{variant}" if variant else ""))
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"average": average, "tasks": {"qasper": average}}))
    (folder / "config.yaml").write_text(f"policy:\n  alpha: {alpha}\n")


def figure(*args: str) -> str:
    command = [sys.executable, str(REPO / "scripts" / "make_figures.py"), *args]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def test_budget_and_sensitivity_figures(tmp_path: Path) -> None:
    for policy, scores in {"full": [40, 40], "snapkv": [30, 35], "restkv": [33, 37]}.items():
        for budget, score in zip(["128", "512"], scores, strict=True):
            fake_run(tmp_path, policy, budget, score)
    for i, alpha in enumerate([0.1, 0.5, 0.9]):
        fake_run(tmp_path / "sens", "restkv", "128", 30 + i, variant=f"h{i}", alpha=alpha)
    out = figure("budgets", "--results", str(tmp_path), "--model", "m")
    assert (tmp_path / "figures" / "longbench-m-budgets.png").stat().st_size > 5000 and ".pdf" in out
    figure("sensitivity", "--results", str(tmp_path / "sens"), "--model", "m", "--knob", "alpha")
    assert (tmp_path / "sens" / "figures" / "longbench-m-sensitivity-alpha.png").exists()
