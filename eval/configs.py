"""Files of the Hydra config tree read by name outside a Hydra run (scripts, the latency benchmark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import OmegaConf

from restkv.policy import Policy

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def config_file(folder: str, name: str, what: str, suffix: str = ".yaml") -> Path:
    """``configs/<folder>/<name><suffix>``; an unknown ``name`` fails with the names that exist."""
    path = CONFIGS / folder / f"{name}{suffix}"
    if not path.exists():
        known = sorted(p.stem for p in (CONFIGS / folder).glob(f"*{suffix}"))
        raise ValueError(f"unknown {what} {name!r}; configs/{folder} has: {', '.join(known)}")
    return path


def configured_policy(name: str, knobs: dict[str, dict[str, Any]] | None = None) -> Policy:
    """The policy ``configs/policy/<name>.yaml`` describes (as ``eval/run.py policy=<name>``).

    ``knobs`` maps policy names to overrides of their fields; only ``knobs[name]`` applies.
    """
    cfg = OmegaConf.merge(OmegaConf.load(config_file("policy", name, "policy")), (knobs or {}).get(name, {}))
    return instantiate(cfg, _convert_="all")
