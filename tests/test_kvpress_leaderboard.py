"""experiment=kvpress_leaderboard (kvpress's public leaderboard as our run) and its micro variant compose, and
every job they sweep passes the checks a run makes before any model loads, for both hub models."""

from __future__ import annotations

import itertools

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from restkv.eval.harness.validate import check_config
from restkv.eval.models.spec import model_spec
from restkv.eval.run import CONFIGS

TASKS_13 = [
    "niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3",
    "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2",
]  # fmt: skip
BUDGETS = [0.75, 0.5, 0.25, 0.125]  # kvpress's compression ratios 0.25, 0.5, 0.75, 0.875


def jobs(preset: str, *extra: str):
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        base = compose(config_name="config", overrides=[f"experiment={preset}", *extra], return_hydra_config=True)
        params = base.hydra.sweeper.params
        axes = {name: str(values).split(",") for name, values in params.items()}
        for combo in itertools.product(*axes.values()):
            job = [f"{name}={value}" for name, value in zip(axes, combo, strict=True)]
            yield job, compose(config_name="config", overrides=[f"experiment={preset}", *extra, *job])


@pytest.mark.parametrize(("model", "path"), [(None, "meta-llama/Llama-3.1-8B-Instruct"), ("qwen3-8b", "Qwen/Qwen3-8B")])
def test_the_leaderboard_preset_composes_and_validates(model: str | None, path: str) -> None:
    extra = [f"model={model}"] if model else []
    seen = []
    for _job, cfg in jobs("kvpress_leaderboard", *extra):
        check_config(OmegaConf.to_container(cfg, resolve=True))
        assert model_spec(cfg.model).path == path and cfg.model.chat_template is True
        assert cfg.protocol == "query_agnostic" and list(cfg.bench.lengths) == [4096]
        assert list(cfg.bench.tasks) == TASKS_13 and cfg.bench.samples == 500 and cfg.bench.max_new_tokens is None
        instantiate(cfg.policy)
        seen.append((cfg.policy._target_.rsplit(".", 1)[-1], cfg.budget))
    assert sorted({budget for _, budget in seen}, reverse=True) == BUDGETS
    assert {"ReSTKV", "KVzip", "SnapKV"} <= {name for name, _ in seen}


def test_the_micro_variant_composes_offline() -> None:
    for _, cfg in jobs("kvpress_leaderboard_micro"):
        check_config(OmegaConf.to_container(cfg, resolve=True))
        assert cfg.model.name == "micro-llama" and cfg.protocol == "query_agnostic" and cfg.budget in BUDGETS
        instantiate(cfg.policy)
