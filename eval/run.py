"""Run one benchmark with one model, policy and budget, as composed by Hydra.

    python eval/run.py policy=restkv bench=ruler budget=128
    python eval/run.py -m policy=snapkv,restkv budget=64,128,256      # a sweep

Writes ``predictions.jsonl`` (one line per sample, as it finishes), ``metrics.json`` and the
resolved ``config.yaml`` into the run folder, prints a score table and the folder's path.
Rerunning the same command resumes: finished samples are skipped.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # executed as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from eval import configs
from eval.identity import IdentityMismatch
from eval.results import RunFolderError
from eval.runner import EmptyRun, RunSettings, SkippedWork, run_benchmark

USER_ERRORS = (ValueError, TypeError, IdentityMismatch, RunFolderError, SkippedWork, EmptyRun)
"""What a bad setting, missing data or a busy or foreign run folder raise: shown as one message, no traceback
(``HYDRA_FULL_ERROR=1`` shows it)."""

CONFIGS = str(configs.CONFIGS)
NAMING_KEYS = {
    "bench",
    "model",
    "policy",
    "budget",
    "out_dir",
    "limit",
    "device",
    "model.device_map",
    "experiment",
    "allow_skips",
    "on_change",
}


def other_overrides(overrides: list[str]) -> list[str]:
    """Overrides that change results but are not already in the run folder's name."""
    kept = []
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        if key not in NAMING_KEYS and not key.startswith("hydra."):
            kept.append(item)
    return kept


@hydra.main(version_base=None, config_path=CONFIGS, config_name="config")
def main(cfg: DictConfig) -> float:
    hydra_cfg = HydraConfig.get()
    choices = hydra_cfg.runtime.choices
    settings = RunSettings(
        bench=choices["bench"],
        model=choices["model"],
        policy=choices["policy"],
        overrides=other_overrides(list(hydra_cfg.overrides.task)),
        out_dir=Path(cfg.out_dir),
    )
    try:
        summary = run_benchmark(cfg, settings)
    except (ValueError, TypeError, RuntimeError) as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or not isinstance(error, USER_ERRORS):
            raise
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    average = summary["average"]
    return float("nan") if average is None else float(average)


if __name__ == "__main__":
    main()
