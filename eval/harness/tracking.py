"""Optional experiment tracking: a finished run logged to Weights & Biases (``logger=wandb``).

The run folder stays the record of a run; tracking copies a finished one into a tracker, so that
sweeps can be browsed and compared there. With ``logger=wandb`` (``configs/logger/wandb.yaml``) each
run, once its ``metrics.json`` is written, becomes one wandb run holding:

- the resolved config (the run's ``config.yaml``) as the wandb config;
- every number of ``metrics.json`` (``average``, ``tasks/<task>``, ``cache/...``, benchmark extras),
  logged once and so also in the run's summary;
- ``predictions``: a table with one row per sample of ``predictions.jsonl``;
- ``images/<name>``: every PNG of the run folder (NIAH's heatmap).

``logger.mode`` is ``offline`` by default: nothing leaves the machine, the run is written to
``<logger.dir>/wandb/offline-run-*`` (``logger.dir`` null: the run folder itself) and
``wandb sync <that folder>`` uploads it later. A rerun of a finished cell logs its results again
(one wandb run per invocation), without recomputing anything.

``logger=none`` (the default) does nothing and imports nothing. The logger is not part of a run's
identity nor of its folder's name (``restkv.eval.harness.identity``, ``restkv.eval.run``): switching it on
for an existing run folder resumes that folder. A missing ``wandb`` package is reported by `tracker_for`, which
``eval/run.py`` calls before any work, not after the benchmark.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

BACKENDS = ("none", "wandb")
WANDB_MODES = ("offline", "online", "disabled")
INSTALL = 'pip install -e ".[tracking]"'

Tracker = Callable[[Path, dict[str, Any]], None]
"""Called with the run folder and its summary (``metrics.json``'s content) once the run has finished."""


class TrackingUnavailable(RuntimeError):
    """The configured tracker cannot be used here (its package is missing)."""


class TrackingFailed(RuntimeError):
    """The tracker refused a finished run; its results are in the run folder all the same."""


@dataclass(frozen=True)
class WandbSettings:
    """``configs/logger/wandb.yaml``: where and how runs are logged (see the module docstring)."""

    project: str = "restkv"
    entity: str | None = None
    mode: str = "offline"
    dir: str | None = None
    name: str | None = None
    group: str | None = None
    tags: tuple[str, ...] = field(default_factory=tuple)


def wandb_settings(node: dict[str, Any]) -> WandbSettings:
    """The ``logger`` section as `WandbSettings`; an unknown key or a bad value is named with what is allowed."""
    allowed = [f.name for f in fields(WandbSettings)]
    unknown = sorted(set(node) - {*allowed, "backend"})
    if unknown:
        raise ValueError(f"logger.{unknown[0]} is not a wandb logger setting; allowed: {', '.join(allowed)}")
    values = {key: node[key] for key in allowed if key in node}
    if values.get("mode", "offline") not in WANDB_MODES:
        raise ValueError(f"logger.mode={values['mode']!r} is not allowed; choose one of: {', '.join(WANDB_MODES)}")
    tags = values.get("tags") or []
    if not isinstance(tags, list | tuple) or not all(isinstance(tag, str) for tag in tags):
        raise ValueError(f"logger.tags={tags!r} is not allowed; it must be a list of strings")
    for key in ("project", "entity", "dir", "name", "group"):
        value = values.get(key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"logger.{key}={value!r} is not allowed; it must be a string (or null)")
    if not values.get("project", "restkv"):
        raise ValueError("logger.project='' is not allowed; name the wandb project")
    return WandbSettings(**{**values, "tags": tuple(tags)})


def import_wandb() -> Any:
    """The ``wandb`` module, or `TrackingUnavailable` saying how to install it."""
    try:
        return importlib.import_module("wandb")
    except ImportError as error:
        raise TrackingUnavailable(
            f"logger=wandb needs the wandb package, which cannot be imported here ({error}). Nothing was run. "
            f"Install it with {INSTALL}, or pass logger=none"
        ) from None


def tracker_for(cfg: DictConfig) -> Tracker | None:
    """What logs this run when it has finished, or None for ``logger=none`` (nothing imported).

    Checks the ``logger`` section and imports the tracker's package now, so that a missing package
    or a bad setting stops the run before any work is done.
    """
    node = OmegaConf.to_container(cfg.get("logger") or OmegaConf.create({}), resolve=True)
    assert isinstance(node, dict)
    backend = node.get("backend", "none")
    if backend not in BACKENDS:
        raise ValueError(f"logger.backend={backend!r} is not allowed; choose one of: {', '.join(BACKENDS)}")
    if backend == "none":
        return None
    settings = wandb_settings(node)
    if settings.dir:
        check_writable(Path(settings.dir), "logger.dir")
    config = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(config, dict)
    return WandbTracker(settings, import_wandb(), config, Path(str(cfg.out_dir)))


def check_writable(folder: Path, key: str) -> None:
    """Refuse, before any work, a folder the tracker could not write its record into after the run."""
    existing = next((p for p in [folder, *folder.parents] if p.exists()), None)
    if existing is not None and (not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK)):
        state = "read-only" if existing.is_dir() else "not a folder"
        raise TrackingUnavailable(
            f"{key}={str(folder)!r} cannot be written ({existing} is {state}); choose another folder, or leave it "
            "unset (the record goes into the run folder)"
        )


def numbers(summary: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Every finite number of ``summary`` (nested dicts flattened to ``a/b`` keys; lists and booleans left out)."""
    found: dict[str, float] = {}
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            found.update(numbers(value, f"{name}/"))
        elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            found[name] = value
    return found


def prediction_rows(path: Path) -> tuple[list[str], list[list[Any]]]:
    """``predictions.jsonl`` as table columns (every field, in order of first appearance) and rows, read by the
    runner's reader (its trusted records).

    Strings, numbers, booleans and nulls stay as they are; lists and objects (references, meta) become
    their JSON text, so that every column holds one kind of value.
    """
    from restkv.eval.harness.run_folder import read_predictions

    records = list(read_predictions(path).records.values())
    columns = list(dict.fromkeys(key for record in records for key in record))

    def cell(value: Any) -> Any:
        if value is None or isinstance(value, str | int | float | bool):
            return value
        return json.dumps(value, ensure_ascii=False, sort_keys=True)

    return columns, [[cell(record.get(column)) for column in columns] for record in records]


class WandbTracker:
    """Logs a finished run to wandb (see the module docstring); one wandb run per call."""

    def __init__(self, settings: WandbSettings, wandb: Any, config: dict[str, Any], out_dir: Path) -> None:
        self.settings = settings
        self.wandb = wandb
        self.config = config
        self.out_dir = out_dir

    def run_name(self, folder: Path) -> str:
        """The run folder below ``out_dir`` (``micro/micro-llama/restkv/budget64``), or its own name."""
        try:
            return folder.resolve().relative_to(self.out_dir.resolve()).as_posix()
        except ValueError:
            return folder.name

    def payload(self, folder: Path, summary: dict[str, Any]) -> dict[str, Any]:
        """What is logged: the summary's numbers, the per-sample table and the run folder's images."""
        logged: dict[str, Any] = dict(numbers(summary))
        predictions = folder / "predictions.jsonl"
        if predictions.exists():
            columns, rows = prediction_rows(predictions)
            logged["predictions"] = self.wandb.Table(columns=columns, data=rows, allow_mixed_types=True)
        for image in sorted(folder.glob("*.png")):
            logged[f"images/{image.stem}"] = self.wandb.Image(str(image))
        return logged

    def __call__(self, folder: Path, summary: dict[str, Any]) -> None:
        """Log the finished run in ``folder``; a tracker error says the results are safe and how to retry."""
        settings = self.settings
        where = Path(settings.dir) if settings.dir else folder
        where.mkdir(parents=True, exist_ok=True)
        try:
            run = self.wandb.init(
                project=settings.project,
                entity=settings.entity,
                mode=settings.mode,
                dir=str(where),
                name=settings.name or self.run_name(folder),
                group=settings.group,
                tags=list(settings.tags) or None,
                config=self.config,
            )
            try:
                run.log(self.payload(folder, summary))
            finally:
                run.finish()
        except self.wandb.Error as error:
            raise TrackingFailed(
                f"wandb did not take the finished run ({error}). Its results are in {folder}; rerun the same "
                "command to log them (nothing is recomputed), or pass logger.mode=offline and sync later"
            ) from error
        if settings.mode == "offline":
            logs = where / "wandb"
            print(f"wandb: logged offline under {logs}; upload with: wandb sync {logs}/offline-run-*")
