"""Hydra entry point: compose ``configs/latency/<preset>.yaml``, measure (either mode), write the JSON and plots."""

from __future__ import annotations

import json
import shlex
import sys
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from restkv.eval.harness.config_tree import CONFIGS
from restkv.eval.harness.errors import guarded
from restkv.eval.latency import capacity, capacity_report, model_mode, scoring_mode
from restkv.eval.latency.chunked_mode import run_chunked
from restkv.eval.latency.modeling import cache_token_bytes
from restkv.eval.latency.plots import plot
from restkv.eval.latency.records import summarize, summarize_scoring
from restkv.eval.latency.settings import Settings, model_config
from restkv.eval.latency.tables import tables
from restkv.eval.models.spec import check_backend_runs

# The primary config lives here so that ``configs/latency/`` holds presets only.
ConfigStore.instance().store(
    name="latency_main",
    node={
        "defaults": [
            {"latency": "tiny"},
            "_self_",
            {"override hydra/job_logging": "stdout"},
            {"override hydra/hydra_logging": "none"},
        ],
        "hydra": {"run": {"dir": "."}, "output_subdir": None, "job": {"chdir": False}},
    },
)


def measure(settings: Settings, command: str = "") -> dict[str, Any]:
    """The record of one run: `runner` for ``mode: model``, `scoring` for ``mode: scoring``."""
    if settings.mode == "scoring":
        return summarize_scoring(settings, scoring_mode.run(settings), command)
    token_bytes = cache_token_bytes(model_config(settings), settings.torch_dtype)
    return summarize(settings, model_mode.run(settings), token_bytes, command)


def run_capacity(settings: Settings, command: str = "") -> dict[str, Any]:
    """``mode: capacity``: measure, write ``<out_dir>/<name>.json``, its table ``.md`` and plot ``.png``."""
    record = capacity_report.summarize(settings, capacity.run(settings), command)
    path = settings.json_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    if settings.plots:
        record["plots"] = [p.name for p in capacity_report.plot(record, path.with_suffix(""))]
    path.write_text(json.dumps(record, indent=1) + "\n")
    text = capacity_report.table(record)
    path.with_suffix(".md").write_text(text)
    print(text)
    print(f"results: {path}")
    return record


def run(settings: Settings, command: str = "") -> dict[str, Any]:
    """Measure, write ``<out_dir>/<name>.json`` and the plots, print the tables; return the record."""
    if settings.mode == "capacity":
        return run_capacity(settings, command)
    if settings.mode == "chunked":
        return run_chunked(settings, command)
    record = measure(settings, command)
    path = settings.json_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    if settings.plots:
        record["plots"] = [p.name for p in plot(record, path.with_suffix(""))]
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(tables(record))
    print(f"\nresults: {path}")
    return record


@hydra.main(version_base=None, config_path=str(CONFIGS), config_name="latency_main")
@guarded
def main(cfg: DictConfig) -> None:
    preset = HydraConfig.get().runtime.choices["latency"]
    settings = Settings.from_config(cfg.latency, preset)
    check_backend_runs(
        settings.attn_implementation,
        settings.resolved_device().type,
        "latency.attn_implementation",
        "latency.device=cuda",
    )
    command = "python -m restkv.eval.latency " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    run(settings, command)
