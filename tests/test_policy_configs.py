"""Policy configs, the registry and the documentation's knob table (docs/policies.md) describe the same policies.

Defaults live in the dataclasses (and presets in `restkv.presets`); a policy YAML holds
``_target_`` plus what it changes, its name is the registry's name, and the docs' table gives
each knob the default the dataclass has.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from restkv import Policy, ReSTKV, ScoringPolicy, get_policy, policy_names, preset_names
from restkv.eval.harness.config_tree import CONFIG_KEYS, configured_policy
from restkv.eval.run import CONFIGS
from restkv.registry import policy_defaults, resolve_policy

ROOT = Path(CONFIGS) / "policy"
CONFIG_NAMES = sorted(str(p.relative_to(ROOT).with_suffix("")) for p in ROOT.rglob("*.yaml"))
POLICIES_DOC = Path(__file__).resolve().parents[1] / "docs" / "policies.md"


def composed_policy(*overrides: str):
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return compose(config_name="config", overrides=list(overrides)).policy


def test_config_names_are_registry_names() -> None:
    assert sorted(policy_names() + preset_names()) == CONFIG_NAMES


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_config_builds_the_registered_policy(name: str) -> None:
    built = instantiate(composed_policy(f"policy={name}"), _convert_="all")
    assert built == get_policy(name) == configured_policy(name)
    assert type(built) is resolve_policy(name)[0]


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_config_states_only_what_it_changes(name: str) -> None:
    written = OmegaConf.to_container(OmegaConf.load(ROOT / f"{name}.yaml"))
    assert isinstance(written, dict)
    cls, _ = resolve_policy(name)
    package = cls.__module__.rpartition(".")[0]
    assert written["_target_"] in (f"{cls.__module__}.{cls.__name__}", f"{package}.{cls.__name__}")
    defaults = policy_defaults(name)
    restated = {k: v for k, v in written.items() if k not in CONFIG_KEYS and defaults.get(k) == v}
    assert not restated, f"configs/policy/{name}.yaml restates defaults {restated}"


def test_every_knob_is_overridable_and_typed() -> None:
    assert instantiate(composed_policy("policy=snapkv", "policy.alpha=0.5")).alpha == 0.5
    with pytest.raises(ConfigCompositionException, match=r"policy\.use_wo=maybe"):
        composed_policy("policy=restkv", "policy.use_wo=maybe")


def _table_rows() -> dict[str, tuple[str, dict[str, str]]]:
    """``policy -> (class path, {knob: default as written})`` from the docs' policy table."""
    rows = {}
    for line in POLICIES_DOC.read_text().splitlines():
        match = re.match(r"\| `([\w/]+)` \| `([\w.]+)` \| .* \|\s*(.*?)\s*\|$", line)
        if match:
            knobs = dict(re.findall(r"`(\w+)` \(`?([^`;:,)]+)`?", match.group(3)))
            rows[match.group(1)] = (match.group(2), knobs)
    return rows


def _parse(text: str) -> object:
    if text == "null":  # a knob left to another default (the kvpress press's own)
        return None
    if text in ("true", "false"):
        return text == "true"
    try:
        return float(text)
    except ValueError:
        return text


def _must_be_listed(cls: type) -> set[str]:
    """Knobs the table must name: those whose default differs from the policy the row builds on.

    A policy builds on its parent class when the parent is itself a table row (PyramidKV on
    SnapKV), on ReST-KV when it is another scoring policy, else on the shared `Policy` knobs.
    """
    own = {f.name: f.default for f in dataclasses.fields(cls)}
    if cls is ReSTKV:
        return set(own) - {f.name for f in dataclasses.fields(Policy)}
    parent = cls.__mro__[1]
    if parent in {resolve_policy(name)[0] for name in policy_names()}:
        reference = parent()
    else:
        reference = ReSTKV() if issubclass(cls, ScoringPolicy) else Policy()
    shared = {f.name for f in dataclasses.fields(reference)}
    return {k for k, v in own.items() if k not in shared or getattr(reference, k) != v}


def test_docs_knob_table_matches_the_dataclasses() -> None:
    rows = _table_rows()
    assert sorted(rows) == policy_names()
    for name, (path, knobs) in rows.items():
        cls, _ = resolve_policy(name)
        assert path == f"{cls.__module__.rpartition('.')[0]}.{cls.__name__}", name
        defaults = policy_defaults(name)
        for knob, written in knobs.items():
            assert knob in defaults, f"docs/policies.md lists {name}.{knob}, which is not a knob"
            assert _parse(written) == defaults[knob], (
                f"docs/policies.md: {name}.{knob} ({written}) vs {defaults[knob]!r}"
            )
        missing = _must_be_listed(cls) - set(knobs)
        assert not missing, f"docs/policies.md's row for {name} omits {sorted(missing)}"
