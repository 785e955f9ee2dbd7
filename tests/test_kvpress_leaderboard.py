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
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
    "niah_multiquery",
    "vt",
    "cwe",
    "fwe",
    "qa_1",
    "qa_2",
]
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


def test_the_table_and_kvpress_layout_are_written(tmp_path) -> None:
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import kvpress_leaderboard_table as board

    for policy, scores in {"restkv": [1, 1, 0, 1], "snapkv": [1, 0, 0, 0]}.items():
        folder = tmp_path / "ruler" / "micro-llama" / policy / "budget0.5"
        folder.mkdir(parents=True)
        lines = [
            {"id": f"s{i}", "task": "vt" if i % 2 else "cwe", "score": s, "prediction": "x", "references": ["x"]}
            for i, s in enumerate(scores)
        ]
        (folder / "predictions.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    found = board.runs(tmp_path, "micro-llama")
    text = board.table(found)
    assert "| `restkv` | 75.0 (n=4) |" in text and "| `snapkv` | 25.0 (n=4); -50.0 [" in text and "ratio 0.5" in text
    out = tmp_path / "kvpress"
    assert board.write_kvpress_layout(found, out, "org/name", "4096") == 2
    metrics = json.loads((out / "ruler__4096__org--name__snapkv__0.50" / "metrics.json").read_text())
    assert metrics == {"cwe": {"string_match": 50.0}, "vt": {"string_match": 0.0}}
    assert (out / "ruler__4096__org--name__restkv__0.50" / "predictions.csv").read_text().startswith("task,answer")
