"""Every config in the tree composes and builds; unknown choices fail with Hydra's list."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException
from hydra.utils import instantiate
from omegaconf import OmegaConf

import restkv.eval.harness.runner  # noqa: F401  (registers the config resolvers)
from restkv import Policy
from restkv.eval.models.spec import ModelSpec
from restkv.eval.run import CONFIGS

ROOT = Path(CONFIGS)
POLICIES = sorted(str(p.relative_to(ROOT / "policy").with_suffix("")) for p in (ROOT / "policy").rglob("*.yaml"))
MODELS = sorted(p.stem for p in (ROOT / "model").glob("*.yaml"))
EXPERIMENTS = sorted(p.stem for p in (ROOT / "experiment").glob("*.yaml"))


def composed(*overrides: str, multirun: bool = False):
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=multirun)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_config_builds(policy: str) -> None:
    built = instantiate(composed(f"policy={policy}").policy)
    assert isinstance(built, Policy)


def test_ablation_configs_differ_from_restkv_as_named() -> None:
    base = instantiate(composed("policy=restkv").policy)
    last = instantiate(composed("policy=ablation/recon_last").policy)
    assert (last.temporal, last.spatial) == ("last", "none") and last.alpha == base.alpha
    assert instantiate(composed("policy=restkv_ruler").policy).kernel == 21


@pytest.mark.parametrize("model", MODELS)
def test_every_model_config_is_a_valid_spec(model: str) -> None:
    spec = ModelSpec(**OmegaConf.to_container(composed(f"model={model}").model))  # type: ignore[arg-type]
    assert spec.name == model


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_preset_composes(experiment: str) -> None:
    cfg = composed(f"experiment={experiment}", multirun=True)
    params = cfg.hydra.sweeper.params
    assert params, f"{experiment} sweeps nothing"
    OmegaConf.to_container(cfg.bench, resolve=True)


def test_niah_paper_grid_resolves() -> None:
    cfg = composed("experiment=niah_llama3", multirun=True)
    lengths = OmegaConf.to_container(cfg.bench, resolve=True)["lengths"]
    assert lengths[0] == 1000 and lengths[-1] == 32000 and len(lengths) == 156


def test_unknown_choice_lists_the_options() -> None:
    with pytest.raises(MissingConfigException, match="Could not find 'policy/snapk'"):
        composed("policy=snapk")
