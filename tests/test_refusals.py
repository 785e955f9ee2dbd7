"""Combinations that cannot act are refused before any work, in one line, and leave no folder behind.

Fidelity scoring with decode-time eviction (no decode-time cut is ever made), multi-turn under a protocol it does
not use (it compresses the context alone), an empty ``out_dir`` (results would land in the working directory),
multi-turn samples without further turns (refused before any folder exists, naming a setting that exists); the
optional needs of the chosen settings, named together; a policy file run as a script and its copy in
``baselines/``, one policy.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from restkv.eval.harness import needs
from restkv.eval.harness.runner import RunSettings, plan_run
from restkv.eval.harness.validate import check_combinations, check_out_dir
from restkv.eval.run import CONFIGS

ROOT = Path(__file__).resolve().parents[1]
MICRO = ["bench=micro", "bench.lengths=[512]", "limit=1"]


def config(*overrides: str):
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def values(*overrides: str) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(config(*overrides), resolve=True)


def test_fidelity_with_decode_time_eviction_is_refused() -> None:
    decode = ["policy=rkv", "compression.phase=decode", "compression.decode_budget=16", "evaluation=fidelity"]
    with pytest.raises(ValueError, match=r"evaluation=fidelity with compression.phase=decode is not allowed"):
        check_combinations(values(*MICRO, *decode))
    check_combinations(values(*MICRO, "evaluation=fidelity"))  # prefill-only fidelity stays allowed


def test_multi_turn_must_say_the_protocol_it_uses() -> None:
    with pytest.raises(ValueError, match=r"add protocol=query_agnostic"):
        check_combinations(values(*MICRO, "evaluation=multi_turn"))
    check_combinations(values(*MICRO, "evaluation=multi_turn", "protocol=query_agnostic"))


@pytest.mark.parametrize("given", ["", "  "])
def test_an_empty_out_dir_is_refused(given: str) -> None:
    with pytest.raises(ValueError, match=r"out_dir=.* is not allowed: name the folder"):
        check_out_dir(given)


def test_an_empty_out_dir_on_the_command_line_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "eval" / "run.py"), *MICRO, "out_dir="],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.startswith("error: out_dir='' is not allowed"), done.stderr
    assert done.stderr.count("\n") == 1 and not any(tmp_path.iterdir())


def test_multi_turn_without_turns_is_refused_before_any_folder(tmp_path: Path) -> None:
    cfg = config(
        "bench=micro",
        "bench.tasks=[micro_single_1]",
        "bench.lengths=[512]",
        "limit=1",
        "evaluation=multi_turn",
        "protocol=query_agnostic",
        f"out_dir={tmp_path}",
    )
    with pytest.raises(ValueError, match=r"bench.tasks=\[micro_multikey_1\]") as refused:
        plan_run(cfg, RunSettings("micro", "micro-llama", "restkv", ["evaluation=multi_turn"], tmp_path))
    assert "bench.turns" not in str(refused.value)  # no such setting
    assert not any(tmp_path.iterdir())
    # the setting it names does give turns
    cfg = config(
        "bench=micro",
        "bench.tasks=[micro_multikey_1]",
        "bench.lengths=[512]",
        "limit=1",
        "evaluation=multi_turn",
        "protocol=query_agnostic",
        f"out_dir={tmp_path}",
    )
    assert plan_run(cfg, RunSettings("micro", "micro-llama", "restkv", [], tmp_path)).samples


def test_missing_needs_are_named_together_with_their_installs(monkeypatch) -> None:
    absent = {"flash_attn", "wandb", "hqq", "hydra_plugins.hydra_joblib_launcher"}
    monkeypatch.setattr(needs, "installed", lambda module: module not in absent)
    chosen = values(*MICRO, "logger=wandb", "quantization=kivi", "model.attn_implementation=flash_attention_2")
    with pytest.raises(needs.MissingNeed) as refused:
        needs.check_needs(chosen, "joblib")
    message = str(refused.value)
    for says in ("'flash_attn'", "logger=wandb", "'hqq'", "hydra/launcher=joblib", '".[launchers]"', "logger=none"):
        assert says in message, says
    assert "\n" not in message
    needs.check_needs(values(*MICRO), None)  # the defaults need nothing optional


def test_punkt_is_named_for_the_nested_benchmark_of_fidelity(monkeypatch) -> None:
    from restkv.eval.benchmarks.ruler import haystacks

    monkeypatch.setattr(haystacks, "_punkt", lambda: None)
    with pytest.raises(needs.MissingNeed, match=r"bench.source.sentences=punkt .*punkt_tab"):
        needs.check_punkt(values("bench=fidelity", "bench.source.sentences=punkt"))


@pytest.mark.skipif(importlib.util.find_spec("kvpress") is not None, reason="kvpress is installed here")
def test_policy_kvpress_without_kvpress_is_refused_before_work(tmp_path: Path) -> None:
    command = [sys.executable, "eval/run.py", "policy=kvpress", *MICRO, f"out_dir={tmp_path}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and 'pip install -e ".[kvpress]"' in done.stderr and done.stderr.count("\n") == 1
    assert not any(tmp_path.iterdir())


def test_a_policy_file_run_as_a_script_and_its_copy_are_one_policy(tmp_path: Path) -> None:
    """``python docs/examples/keynorm_policy.py`` registers ``__main__.KeyNorm``; the registry then imports the
    copy in ``baselines/``: the same source, one policy. Another class under the name stays refused."""
    from restkv import register_policy
    from restkv.registry import _POLICIES

    source = (
        "from dataclasses import dataclass\nfrom restkv import Policy\n\n\n@dataclass\nclass Twin(Policy):\n"
        "    def score(self, inputs, keep):\n        return None\n"
    )
    classes = []
    for index in range(2):
        path = tmp_path / f"twin_{index}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(f"twin_{index}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        classes.append(module.Twin)
    try:
        assert register_policy("twin_test")(classes[0]) is classes[0]
        assert register_policy("twin_test")(classes[1]) is classes[1]
        assert _POLICIES["twin_test"] is classes[0]  # the first stays
        other = type("Twin", (classes[0],), {"__module__": "elsewhere"})
        with pytest.raises(ValueError, match="already taken"):
            register_policy("twin_test")(other)
    finally:
        _POLICIES.pop("twin_test", None)
        sys.modules.pop("twin_0", None)
        sys.modules.pop("twin_1", None)
