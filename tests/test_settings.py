"""Each run-level setting has one home (`restkv.eval.harness.settings`): its default, allowed values, identity and
the value that reproduces older run folders are declared there once, and everything else derives from it.

Adding a knob is a field there and its line in ``configs/config.yaml``; these tests fail when a second home grows
(a default or a list of allowed values restated elsewhere, a run-level key read from the raw config after the plan).
"""

from __future__ import annotations

import ast
from dataclasses import asdict, fields
from pathlib import Path

import pytest
import yaml

from restkv.eval.harness import identity, naming, settings, validate
from restkv.eval.harness.settings import DEFAULTS, RULES, SECTIONS, Settings

ROOT = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "configs" / "config.yaml").read_text())
GROUPS = {"model", "policy", "evaluation", "bench", "quantization", "logger", "experiment", "hydra", "defaults"}
LEAVES = {key.rpartition(".")[2] for key in RULES}
HOME = (ROOT / "eval" / "harness" / "settings.py", ROOT / "eval" / "harness" / "choices.py")
"""The declarations, and the names they choose among (the core's own are in restkv/choices.py)."""
READERS = [
    ROOT / "eval" / "run.py",
    *(ROOT / "eval" / "harness").glob("*.py"),
    *(ROOT / "eval" / "evaluation").glob("*.py"),
]
"""The modules that read a run's settings (the core never sees the config)."""


def test_every_run_level_key_of_the_config_is_declared_once_with_the_same_default() -> None:
    declared = {f.name for f in fields(Settings)}
    assert set(CONFIG) - GROUPS == declared, "configs/config.yaml's top-level keys and the settings differ"
    for key, value in DEFAULTS.items():
        head, _, leaf = key.partition(".")
        written = CONFIG[head][leaf] if leaf else CONFIG[head]
        assert written == value, f"configs/config.yaml has {key}: {written!r}, the declared default is {value!r}"
    for name in SECTIONS:
        assert set(CONFIG[name]) == {key.partition(".")[2] for key in RULES if key.startswith(name + ".")}


def test_identity_naming_and_older_folders_derive_from_the_declarations() -> None:
    from restkv.eval.harness.runner import ADDED_SETTINGS
    from restkv.storage.quantize import Quantization

    outside = {key for key, (rule, _, _) in RULES.items() if not rule.identity}
    assert outside and set(identity.NOT_IDENTITY) == outside | {"hydra", "logger"}
    assert set(naming.NAMING_GROUPS) | outside | {"budget"} == naming.NAMING_KEYS
    assert {**settings.added_settings(), "quantization": asdict(Quantization())} == ADDED_SETTINGS
    assert ADDED_SETTINGS["compression"]["decode_interval"] == DEFAULTS["compression.decode_interval"] == 32
    assert set(validate.RUN_KEY_CHECKS) == set(RULES)


def _literal_defaults(path: Path) -> list[str]:
    """``x.get("<setting>", <default>)`` calls: a default restated where the settings are read."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and len(node.args) == 2
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in LEAVES | set(SECTIONS)
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", READERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_setting_default_is_restated_outside_its_home(path: Path) -> None:
    if path in HOME:
        return
    assert not _literal_defaults(path), "read the setting from the plan's Settings, or settings.value_of"
    text = path.read_text()
    for key, (rule, _, _) in RULES.items():
        if rule.choices is not None and len(rule.choices) > 1:
            listed = ", ".join(f'"{choice}"' for choice in rule.choices)
            assert f"({listed})" not in text, f"{path.relative_to(ROOT)} restates the choices of {key}"


def test_after_the_plan_the_runner_reads_settings_not_the_raw_config() -> None:
    from restkv.eval.harness import runner

    tree = ast.parse(Path(runner.__file__).read_text())
    for function in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name != "plan_run"):
        for node in ast.walk(function):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "cfg":
                pytest.fail(f"runner.{function.name} reads cfg.{node.attr}: read plan.settings instead")


def test_a_settings_value_is_checked_with_what_it_allows() -> None:
    with pytest.raises(ValueError, match=r"compression.decode_interval=0 is not allowed; it must be an integer >= 1"):
        Settings.of({"compression": {"decode_interval": 0}})
    with pytest.raises(ValueError, match=r"compression.phaze is not a setting; .* did you mean phase\?"):
        Settings.of({"compression": {"phaze": "decode"}})
    with pytest.raises(ValueError, match=r"layout='varlne' is not allowed; choose one of: auto, varlen, masked"):
        Settings.of({"layout": "varlne"})
    run = Settings.of({"compression": {"phase": "decode", "decode_budget": 64}, "limit": 3})
    assert (run.compression.phase, run.compression.decode_interval, run.limit, run.layout) == ("decode", 32, 3, "auto")
    assert settings.value_of({}, "compression.decode_interval") == 32
