"""A run folder holds one experiment: what makes two runs the same, and what to do when they are not.

The identity of a run is its whole resolved config (model, policy, benchmark, evaluation, budget,
protocol: command line, YAML files, presets and config dirs alike) plus a fingerprint of the
weights, minus the keys that do not change a prediction (where results go, how many samples to
run, the device, what to do on a mismatch, which tracker a finished run is logged to). It is
written to ``identity.json`` when a folder is first used; a later run whose identity differs is
refused with both identities shown, unless ``on_change`` says otherwise:

- ``refuse`` (default): stop, write nothing;
- ``new_folder``: use the first sibling folder ``<name>~2``, ``<name>~3``, ... that holds this
  identity or nothing yet;
- ``adopt``: declare the folder's predictions to be of this experiment (e.g. after a cosmetic edit)
  and record the new identity.

A key a newer restkv added (a new policy knob, a new top-level setting) is absent from identities
written before it; at its default it reproduces the older behaviour, so a saved identity that lacks
it matches a run that has it at that default (``added_defaults``), and resuming such a folder after
an upgrade needs no ``adopt``. Any other value of the key is a different experiment. Identities
written before data files were hashed (``inputs``) are taken to have read the files read now (the
runner says so). Likewise a class
that moved keeps its experiments (restkv 0.2 installs ``baselines``, ``eval`` and ``microtrain`` as
subpackages of ``restkv``): a saved ``_target_`` naming its old place reads as its new one (`MOVED_TARGETS`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Any

from restkv.eval.harness import settings

IDENTITY = "identity.json"
NOT_IDENTITY = (*settings.NOT_IDENTITY, "hydra", "logger")
"""Top-level config keys that do not change any prediction: the run-level settings declared so
(`restkv.eval.harness.settings`: where results go, how many samples, the device, how greedy tokens are computed,
every way giving the same ones...), Hydra's own keys and ``logger`` (where finished runs are also logged)."""


class IdentityMismatch(RuntimeError):
    """The run folder holds predictions of another experiment."""


NOT_MODEL_IDENTITY = ("device_map", "notes")
"""``model`` keys that only place the model (on which GPUs) or describe it, not what it predicts."""


MOVED_TARGETS = {
    **{
        f"baselines.{name}": f"restkv.baselines.{name}"
        for name in (
            "AdaKV",
            "CAM",
            "CriticalKV",
            "FullCache",
            "H2O",
            "HeadKV",
            "KNorm",
            "L2Norm",
            "PyramidKV",
            "RandomEviction",
            "SnapKV",
            "StreamingLLM",
            "TOVA",
        )
    },
    "baselines.kvpress.KVPressPolicy": "restkv.interop.kvpress_policy.KVPressPolicy",
    "eval.benchmarks.fidelity.FidelityBenchmark": "restkv.eval.benchmarks.fidelity.FidelityBenchmark",
    "eval.benchmarks.infinitebench.InfiniteBenchBenchmark": (
        "restkv.eval.benchmarks.infinitebench.InfiniteBenchBenchmark"
    ),
    "eval.benchmarks.longbench.LongBenchBenchmark": "restkv.eval.benchmarks.longbench.LongBenchBenchmark",
    "eval.benchmarks.micro.MicroBenchmark": "restkv.eval.benchmarks.micro.MicroBenchmark",
    "eval.benchmarks.micro_niah.MicroNiahBenchmark": "restkv.eval.benchmarks.micro.niah.MicroNiahBenchmark",
    "eval.benchmarks.niah.NiahBenchmark": "restkv.eval.benchmarks.niah.NiahBenchmark",
    "eval.benchmarks.ruler.RulerBenchmark": "restkv.eval.benchmarks.ruler.RulerBenchmark",
    "eval.evaluation.Fidelity": "restkv.eval.evaluation.Fidelity",
    "eval.evaluation.Generate": "restkv.eval.evaluation.Generate",
}
"""Old ``_target_`` -> where the class is now, for identities saved before the move (see the module docstring)."""


def with_moved_targets(saved: Any) -> Any:
    """``saved`` with every ``_target_`` of `MOVED_TARGETS` renamed to the class's current place."""
    if isinstance(saved, dict):
        return {
            key: MOVED_TARGETS.get(value, value)
            if key == "_target_" and isinstance(value, str)
            else with_moved_targets(value)
            for key, value in saved.items()
        }
    if isinstance(saved, list):
        return [with_moved_targets(item) for item in saved]
    return saved


def run_identity(config: dict[str, Any], weights: str | None, inputs: dict[str, str] | None = None) -> dict[str, Any]:
    """What makes a run the experiment it is (see the module docstring): the config, the weights' fingerprint and
    the content of every data file it read (``inputs``: file -> SHA-256)."""
    kept = {k: v for k, v in config.items() if k not in NOT_IDENTITY}
    if isinstance(kept.get("model"), dict):
        kept["model"] = {k: v for k, v in kept["model"].items() if k not in NOT_MODEL_IDENTITY}
    return {"config": kept, "weights": weights, "inputs": dict(inputs or {})}


def _differences(old: Any, new: Any, path: str = "") -> list[str]:
    """``key: old -> new`` for every leaf that differs, dotted keys."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for key in sorted(set(old) | set(new), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in old:
                found.append(f"{where}: (absent) -> {new[key]!r}")
            elif key not in new:
                found.append(f"{where}: {old[key]!r} -> (absent)")
            else:
                found += _differences(old[key], new[key], where)
        return found
    return [] if old == new else [f"{path}: {old!r} -> {new!r}"]


def _saved(folder: Path, on_change: str = "refuse") -> dict[str, Any] | None:
    """The folder's saved identity; an unreadable one is refused, or replaced under ``on_change=adopt``."""
    path = folder / IDENTITY
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(saved, dict):
            raise ValueError(f"not a JSON object but {type(saved).__name__}")
        return saved
    except (ValueError, UnicodeDecodeError) as error:
        if on_change == "adopt":
            return {"unreadable": str(error)}  # adopt declares the folder this run's: the identity is rewritten
        raise IdentityMismatch(
            f"{path} is unreadable ({error}); pass on_change=adopt to declare the folder's predictions this "
            "experiment's (its identity is rewritten), or move the folder away"
        ) from error


def _holds_results(folder: Path) -> bool:
    predictions = folder / "predictions.jsonl"
    return predictions.exists() and predictions.stat().st_size > 0


def with_added_defaults(saved: dict[str, Any], identity: dict[str, Any], defaults: dict[tuple, Any]) -> dict[str, Any]:
    """``saved`` with every key of ``defaults`` (a path into the identity) it lacks filled in, where this
    run's identity holds that key at exactly that default (see the module docstring)."""
    filled = json.loads(json.dumps(saved))
    for path, default in defaults.items():
        *parents, key = path
        node, new = filled, identity
        for part in parents:
            node, new = node.get(part) if isinstance(node, dict) else None, new.get(part, {})
        if isinstance(node, dict) and isinstance(new, dict) and key not in node and new.get(key, object()) == default:
            node[key] = default
    return filled


def _mismatch(folder: Path, saved: dict[str, Any] | None, identity: dict[str, Any]) -> str | None:
    """Why ``folder`` cannot take this run's predictions, or None when it can."""
    if saved is None:
        if not _holds_results(folder):
            return None
        return (
            f"{folder} holds predictions but no {IDENTITY} (written by an earlier version of restkv), so it "
            "cannot be told whether they are of this experiment"
        )
    if saved == identity:
        return None
    changes = "\n  ".join(_differences(saved, identity))
    weights = ""
    if saved.get("weights") != identity["weights"]:
        weights = (
            f" (predictions of other weights of this model: fingerprint {saved.get('weights')}, now "
            f"{identity['weights']}; the model folder changed since)"
        )
    return f"{folder} holds predictions of another experiment{weights}; what differs (saved -> this run):\n  {changes}"


@contextlib.contextmanager
def claimed_folder(
    folder: Path,
    identity: dict[str, Any],
    on_change: str,
    lock: Callable[[Path], ContextManager[Any]],
    added_defaults: dict[tuple, Any] | None = None,
) -> Iterator[Path]:
    """Hold the folder this run writes to (``folder`` or a sibling) under ``lock``, its identity recorded.

    Raises `IdentityMismatch` when ``folder`` holds another experiment and ``on_change`` is ``refuse``.
    ``added_defaults``: keys (paths into the identity) a saved identity may lack at these defaults.
    The identity is checked while the folder is locked, so two runs started together cannot both
    claim it.
    """
    candidate, number = folder, 1
    while True:
        candidate.mkdir(parents=True, exist_ok=True)
        with lock(candidate):
            saved = _saved(candidate, on_change)
            if saved is not None:
                saved = with_moved_targets(saved)
            if saved is not None and added_defaults:
                saved = with_added_defaults(saved, identity, added_defaults)
            reason = _mismatch(candidate, saved, identity)
            if reason is None or on_change == "adopt":
                _write(candidate / IDENTITY, identity)
                yield candidate
                return
        if on_change != "new_folder":
            raise IdentityMismatch(
                f"{reason}\nNothing was run. To keep both, pass on_change=new_folder (a sibling folder "
                f"{folder.name}~2 ...); to declare them the same experiment, on_change=adopt; or use another out_dir."
            )
        number += 1
        candidate = folder.with_name(f"{folder.name}~{number}")


def _write(path: Path, identity: dict[str, Any]) -> None:
    """Write ``identity.json`` atomically; a failed write (a full disk) leaves no temporary file behind."""
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps(identity, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
