"""Which overrides name a run folder: the keys already in its name (or that change no prediction) are left out of
the hash of the others. Shared by ``eval/run.py`` and the check before the work (`restkv.eval.harness.run_check`),
which says where each job would write."""

from __future__ import annotations

from restkv.eval.harness.settings import IN_NAME, NOT_IDENTITY

NAMING_GROUPS = ("bench", "model", "policy", "experiment", "logger", "model.device_map")
"""Config choices already in the folder's name (bench, model, policy; an experiment's through its overrides'), or
that change no prediction (the logger, where the model's layers are placed)."""
NAMING_KEYS = {*NAMING_GROUPS, *IN_NAME, *NOT_IDENTITY}
"""Override keys already in the folder's name, or that change no prediction (the run-level settings outside a
run's identity, `restkv.eval.harness.settings`); ``logger.*`` and ``hydra.*`` (launchers included) are left out
too."""
NOT_NAMING_PREFIXES = ("hydra.", "logger.")


def other_overrides(overrides: list[str]) -> list[str]:
    """Overrides that change results but are not already in the run folder's name."""
    kept = []
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        if key not in NAMING_KEYS and not key.startswith(NOT_NAMING_PREFIXES):
            kept.append(item)
    return kept
