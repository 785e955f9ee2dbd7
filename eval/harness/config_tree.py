"""The Hydra config tree: where it is, its files by name, the policy knobs it gets from the registry and the
resolvers its files use. Every composition of ``configs/`` (a run, the check before it, a script, a test) imports
this module first, so what the tree needs is registered here and nowhere else.

Policy configs (``configs/policy/<name>.yaml``) hold ``_target_`` plus what they change: their
knobs and defaults come from the policy dataclasses, stored here as typed Hydra nodes
(``policy_knobs/<name>``) that every policy config extends. So ``policy.alpha=0.5`` works for every
knob, a wrong type (``policy.use_wo=maybe``) is refused by name, and a default is written once.
"""

from __future__ import annotations

import dataclasses
import typing
import warnings
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from restkv.eval.models.paths import bundled
from restkv.eval.models.spec import ModelSpec
from restkv.policy import Policy
from restkv.registry import get_policy, policy_defaults, policy_names, preset_names, resolve_policy

CONFIGS = bundled("configs")
# configs/hydra/launcher/joblib.yaml has the name of the joblib plugin's own config, so Hydra merges the
# two (the plugin's typed fields under our n_jobs) and warns that such matching is deprecated, in the
# launching process and again in every worker (which imports this module with the job, before running it).
warnings.filterwarnings(
    "ignore", message=r"\s*'hydra/launcher/joblib' is validated against ConfigStore schema", category=UserWarning
)
KNOBS_GROUP = "policy_knobs"
CONFIG_KEYS = ("_target_", "defaults")


def config_file(folder: str, name: str, what: str, suffix: str = ".yaml") -> Path:
    """``configs/<folder>/<name><suffix>``; an unknown ``name`` fails with the names that exist."""
    path = CONFIGS / folder / f"{name}{suffix}"
    if not path.exists():
        known = sorted(
            str(p.relative_to(CONFIGS / folder).with_suffix("")) for p in (CONFIGS / folder).rglob(f"*{suffix}")
        )
        raise ValueError(f"unknown {what} {name!r}; configs/{folder} has: {', '.join(known)}")
    return path


def knobs_node(name: str) -> Any:
    """A typed config class for policy ``name``: ``_target_`` plus every knob with its default."""
    cls, _ = resolve_policy(name)
    hints = typing.get_type_hints(cls)
    fields: list[tuple[str, Any, Any]] = [("_target_", str, dataclasses.field(default=MISSING))]
    for knob, default in policy_defaults(name).items():
        fields.append((knob, hints[knob], dataclasses.field(default=default)))
    return dataclasses.make_dataclass(f"{cls.__name__}Knobs", fields)


def store_policy_knobs() -> None:
    """Put every registered policy's knobs into Hydra's config store (``policy_knobs/<name>``)."""
    store = ConfigStore.instance()
    for name in policy_names() + preset_names():
        group, _, leaf = f"{KNOBS_GROUP}/{name}".rpartition("/")
        store.store(group=group, name=leaf, node=knobs_node(name))


def configured_policy(name: str, knobs: dict[str, dict[str, Any]] | None = None) -> Policy:
    """The policy ``configs/policy/<name>.yaml`` describes (as ``eval/run.py policy=<name>``).

    ``knobs`` maps policy names to overrides of their fields; only ``knobs[name]`` applies.
    """
    written = OmegaConf.to_container(OmegaConf.load(config_file("policy", name, "policy")))
    assert isinstance(written, dict)
    changes = {key: value for key, value in written.items() if key not in CONFIG_KEYS}
    return get_policy(name, **changes, **(knobs or {}).get(name, {}))


store_policy_knobs()


def range_list(start: str, stop: str, step: str) -> list[int]:
    """``${range_list:start,stop,step}``: ``list(range(start, stop, step))`` (NIAH's 1000..32000 step 200 grid)."""
    return list(range(int(start), int(stop), int(step)))


RESOLVERS = {"range_list": range_list}
"""The interpolations the config files use, beyond OmegaConf's and Hydra's own."""


def register_resolvers() -> None:
    """Register `RESOLVERS` with OmegaConf (once; an existing registration of the same name is kept)."""
    for name, function in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function)


register_resolvers()


# The model group's typed node ------------------------------------------------------------------
MODEL_SPEC_NODE = "model_spec"


def store_model_spec() -> None:
    """Put ``ModelSpec``'s fields, types and defaults into Hydra's config store (``model_spec``).

    Every ``configs/model/*.yaml`` extends it, so every field is a ``model.<field>=...`` override for
    every model (``model.tokenizer=...`` included) and a wrong type (``model.chat_template=maybe``)
    is refused by Hydra with the key named, as for policy knobs.
    """
    ConfigStore.instance().store(name=MODEL_SPEC_NODE, node=ModelSpec)


store_model_spec()
