"""kvpress's presses with per-model files (`restkv.interop.press_files`), run offline from a local hub cache.

Each test builds, in a temporary folder, a Hugging Face cache laid out as the hub's libraries write it
(``models--<org>--<name>/refs/main`` naming a revision, ``snapshots/<revision>/<files>``) holding tiny
random-weight files in the format kvpress loads (written by kvpress's own classes where it has them), shaped
for the micro model, and points the hub libraries at it with offline mode on. kvpress's own loading code
then reads them: each press runs on the micro model (a prefill and a few decoded tokens) and evicts to the
budget. Without the files each press is refused before any work, in well under a second, naming the
repository (or URL) and the files to fetch. Skipped without kvpress.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import prefill_and_decode
from transformers import AutoModelForCausalLM

from restkv.interop import press_files
from restkv.interop.kvpress_policy import KVPressPolicy
from restkv.interop.press_catalogue import FILE_HOOKED, FILE_SCORERS, REFUSED
from restkv.interop.press_files import DUO_BASE, PressFilesMissing, hub_name

MICRO = Path(__file__).resolve().parents[1] / "models" / "micro-llama"
LENGTH, BUDGET, STEPS = 200, 100, 4
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
DUO_MODEL = "mistralai/Mistral-7B-Instruct-v0.2"
REVISION = "0123456789abcdef0123456789abcdef01234567"
LAYERS, HEADS, KV_HEADS, HIDDEN, HEAD_DIM = 4, 6, 2, 192, 32
SEVEN = ("QFilterPress", "KVzapPress", "ExpectedAttentionStatsPress", "FastKVzipPress", "RestoreKVPress")
SEVEN += ("DuoAttentionPress", "LUKVPress")


@pytest.fixture
def kvpress():
    return pytest.importorskip("kvpress", reason="kvpress is not installed (CI's kvpress leg)")


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty local hub cache, offline: the hub libraries read only it."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # read at import; the libraries read it per call
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


@pytest.fixture
def model(kvpress):
    return AutoModelForCausalLM.from_pretrained(MICRO, dtype=torch.float32, attn_implementation="sdpa").eval()


def cached(cache: Path, repo: str, folder: Path) -> None:
    """Put ``folder``'s files into ``cache`` as the hub's libraries lay out a download of ``repo``."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(REVISION)
    shutil.copytree(folder, root / "snapshots" / REVISION)


def qfilter_files(kvpress, folder: Path) -> None:
    from kvpress.presses.qfilter_press import QFilters

    QFilters(num_layers=LAYERS, num_kv_heads=KV_HEADS, kv_head_dim=HEAD_DIM).save_pretrained(folder)


def kvzap_files(kvpress, folder: Path) -> None:
    from kvpress.presses.kvzap_press import KVzapConfig, KVzapModel

    config = KVzapConfig(input_dim=HIDDEN, output_dim=KV_HEADS, n_modules=LAYERS, hidden_dim=8)
    KVzapModel(config).save_pretrained(folder)


def stats_files(kvpress, folder: Path, name: str) -> str:
    from kvpress.presses.expected_attention_with_stats import ExpectedAttentionStats

    stats = ExpectedAttentionStats(LAYERS, HEADS, HEAD_DIM, "kmfoda/booksum", name, 100, 1000, 4)
    torch.manual_seed(0)
    spread = torch.randn(LAYERS, HEADS, HEAD_DIM, HEAD_DIM) * 0.1
    stats.query_mean.data = torch.randn(LAYERS, HEADS, HEAD_DIM)
    stats.query_cov.data = spread @ spread.transpose(-1, -2)
    stats.save_pretrained(folder)
    return stats.stats_id()


def fastkvzip_files(kvpress, folder: Path) -> None:
    from kvpress.presses.fastkvzip_press import FastKVzipGate

    torch.manual_seed(0)
    gates = [FastKVzipGate(i, HIDDEN, KV_HEADS, HEADS // KV_HEADS, torch.float32, 16, 16) for i in range(LAYERS)]
    for gate in gates:
        torch.nn.init.normal_(gate.k_base)
    (folder / "micro-llama").mkdir(parents=True)
    torch.save({"module": [gate.state_dict() for gate in gates]}, folder / "micro-llama" / "q3_dim16_sink16.pt")


def restorekv_files(kvpress, folder: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file

    base = AutoModelForCausalLM.from_pretrained(MICRO, dtype=torch.float32)
    adapter = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapter.save_pretrained(folder)
    save_file({"restore_embeddings": torch.randn(8, HIDDEN) * 0.02}, str(folder / "restore_embeddings.safetensors"))


def duo_files(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"sink_size": 4, "recent_size": 16}))
    scores = np.random.default_rng(0).random((LAYERS, KV_HEADS))
    np.savetxt(folder / "full_attention_heads.tsv", scores, delimiter="\t")


def lukv_files(folder: Path) -> None:
    """A budget curve whose row t prunes (t + 1)% of each layer on average, spread unevenly over its heads."""
    folder.mkdir(parents=True)
    spread = np.tile(np.array([-0.1, 0.1]), (LAYERS, 1))
    curve = np.stack([(t + 1) / 100 + spread * min(1.0, (t + 1) / 20) for t in range(99)]).clip(0, 1)
    np.save(folder / "ea_0.02_sink4_win1_llama_avg_ratio.npy", curve)


def run(model, policy: KVPressPolicy):
    ids = torch.randint(3, 8000, (1, LENGTH), generator=torch.Generator().manual_seed(0))
    record, cache, logits, _ = prefill_and_decode(model, policy, BUDGET, ids, STEPS)
    assert torch.isfinite(logits).all()
    return record, [layer.keys.shape[2] for layer in cache.layers]


def test_the_seven_run_and_none_is_refused() -> None:
    assert set(SEVEN) == set(FILE_SCORERS) | set(FILE_HOOKED) == set(press_files.FILE_PRESSES)
    assert not set(SEVEN) & set(REFUSED)


def test_their_settings_are_kvpress_s(kvpress) -> None:
    for name, settings in {**FILE_SCORERS, **FILE_HOOKED}.items():
        fields = getattr(kvpress, name).__dataclass_fields__
        assert all(fields[setting].init for setting in settings), name


@pytest.mark.parametrize(
    ("press", "make", "repo", "loaded"),
    [
        ("QFilterPress", qfilter_files, "nthngdy/micro-llama_qfilt", "q_filters"),
        ("KVzapPress", kvzap_files, "nvidia/KVzap-mlp-micro-llama", "kvzap_model"),
        ("ExpectedAttentionStatsPress", stats_files, None, "mu"),
    ],
)
def test_scorer_presses_load_their_hub_files_and_evict_to_the_budget(kvpress, hub, model, press, make, repo, loaded):
    folder = hub.parent / "made"
    if repo is None:  # the statistics' repository is named after the model's hub id (kvpress's stats_id)
        model.config.name_or_path = LLAMA
        repo = make(kvpress, folder, LLAMA)
    else:
        make(kvpress, folder)
    cached(hub, repo, folder)
    policy = KVPressPolicy(press=press)
    assert policy.route == "integration"
    record, lengths = run(model, policy)
    assert record.kept == [BUDGET] * LAYERS and lengths == [BUDGET + STEPS] * LAYERS
    assert getattr(policy.__dict__["_attached"][1], loaded) is not None  # kvpress's own loading ran


def test_qfilter_repository_is_kvpress_s_for_the_micro_model(kvpress, hub, model) -> None:
    kvpress.QFilterPress.load_q_filters.cache_clear()  # kvpress keeps the filters it loaded per model name
    qfilter_files(kvpress, hub.parent / "made")
    cached(hub, "nthngdy/micro-llama_qfilt", hub.parent / "made")
    policy = KVPressPolicy(press="QFilterPress")
    run(model, policy)
    filters = policy.__dict__["_attached"][1].q_filters
    from safetensors.torch import load_file

    saved = load_file(str(hub.parent / "made" / "model.safetensors"))["q_filters"]
    assert torch.equal(filters, saved)  # the file in the cache is what kvpress loaded


def test_expected_attention_stats_read_a_local_folder(kvpress, hub, model, tmp_path: Path) -> None:
    stats_files(kvpress, tmp_path / "stats", "any")
    policy = KVPressPolicy(press="ExpectedAttentionStatsPress", files=str(tmp_path / "stats"))
    record, _ = run(model, policy)
    assert record.kept == [BUDGET] * LAYERS
    assert {"config.json", "model.safetensors"} <= {p.name for p in policy.input_files()}  # the run's identity


@pytest.mark.parametrize("press", ["FastKVzipPress", "RestoreKVPress"])
def test_hooked_presses_load_their_hub_files_and_evict_to_the_budget(kvpress, hub, model, press) -> None:
    folder = hub.parent / "made"
    if press == "FastKVzipPress":
        fastkvzip_files(kvpress, folder)
        repo = "Jang-Hyun/Fast-KVzip"
    else:
        restorekv_files(kvpress, folder)
        repo = "higokri/RestoreKV-micro-llama"
    cached(hub, repo, folder)
    policy = KVPressPolicy(press=press, layerwise=True)
    assert policy.route == "kvpress_hooks"
    record, lengths = run(model, policy)
    assert record.notes == {"kvpress_route": "kvpress_hooks", "kvpress_cache": "masked", "kvpress_driven_by": "budget"}
    kept = sum(sum(heads) for heads in record.head_lengths)
    if press == "FastKVzipPress":  # kvpress masks head-wise: the cache keeps its length
        assert lengths == [LENGTH + STEPS] * LAYERS and kept == LAYERS * KV_HEADS * BUDGET
    else:  # 8 restore tokens join the cache and count in the budget (kvpress's budget-matched eviction)
        assert lengths == [LENGTH + 8 + STEPS] * LAYERS and kept == LAYERS * KV_HEADS * BUDGET
        assert "restorekv" in model.peft_config  # its LoRA adapter, loaded by peft from the cache


def test_duo_attention_reads_its_patterns_from_policy_files(kvpress, hub, model, tmp_path: Path) -> None:
    duo_files(tmp_path / "duo")
    model.config.name_or_path = DUO_MODEL
    policy = KVPressPolicy(press="DuoAttentionPress", files=str(tmp_path / "duo"))
    record, lengths = run(model, policy)
    assert lengths == [LENGTH + STEPS] * LAYERS and record.notes["kvpress_cache"] == "masked"
    per_head = [n for heads in record.head_lengths for n in heads]
    assert set(per_head) <= {LENGTH, 4 + 16}  # retrieval heads keep all, streaming heads sink + recent
    share = (LENGTH - 4 - 16) / (LAYERS * KV_HEADS)  # one head's share of what the heads drop
    assert abs(sum(per_head) / len(per_head) - BUDGET) <= share / 2 + 1e-9


def test_lukv_reads_its_curve_from_policy_files(kvpress, hub, model, tmp_path: Path) -> None:
    lukv_files(tmp_path / "lukv")
    model.config.name_or_path = LLAMA
    policy = KVPressPolicy(press="LUKVPress", inner="ExpectedAttentionPress", files=str(tmp_path / "lukv"))
    record, lengths = run(model, policy)
    assert lengths == [LENGTH + STEPS] * LAYERS and record.notes["kvpress_cache"] == "masked"
    per_head = [n for heads in record.head_lengths for n in heads]
    assert len(set(per_head)) > 1  # the curve gives heads their own budgets
    assert abs(sum(per_head) / len(per_head) - BUDGET) <= 1


REFUSALS = [
    ({"press": "QFilterPress"}, None, "nthngdy/micro-llama_qfilt", "config.json, model.safetensors"),
    ({"press": "KVzapPress", "model_type": "linear"}, None, "nvidia/KVzap-linear-micro-llama", "model.safetensors"),
    (
        {"press": "ExpectedAttentionStatsPress"},
        LLAMA,
        "alessiodevoto/exp_att_stats_meta-llama_Llama-3.1-8B-Instruct_kmfoda_booksum_100_1000_4",
        "model.safetensors",
    ),
    ({"press": "FastKVzipPress"}, None, "Jang-Hyun/Fast-KVzip", "micro-llama/q3_dim16_sink16.pt"),
    ({"press": "RestoreKVPress"}, None, "higokri/RestoreKV-micro-llama", "adapter_model.safetensors"),
    ({"press": "DuoAttentionPress"}, DUO_MODEL, DUO_BASE + "/Mistral-7B-Instruct-v0.2/", "full_attention_heads.tsv"),
    (
        {"press": "LUKVPress", "inner": "ExpectedAttentionPress"},
        LLAMA,
        "LU-KV/main/evaluation/curve_data",
        "ea_0.02_sink4_win1_llama_avg_ratio.npy",
    ),
]


@pytest.mark.parametrize(("knobs", "name", "repo", "files"), REFUSALS)
def test_without_their_files_offline_they_are_refused_fast(kvpress, hub, model, knobs, name, repo, files) -> None:
    if name is not None:
        model.config.name_or_path = name
    policy = KVPressPolicy(**knobs)
    start = time.perf_counter()
    with pytest.raises(PressFilesMissing) as refused:
        policy.check_files(model.config.name_or_path, model.config)
    assert time.perf_counter() - start < 5
    message = str(refused.value)
    assert knobs["press"] in message and repo in message and files in message and "HF_HUB_OFFLINE" in message
    with pytest.raises(PressFilesMissing):  # and when the model is used directly, before kvpress loads anything
        run(model, policy)


def test_where_the_hub_answers_nothing_is_refused(kvpress, hub, model, monkeypatch) -> None:
    monkeypatch.setattr(press_files, "offline_reason", lambda files: None)
    for knobs, name, _, _ in REFUSALS:
        model.config.name_or_path = name or str(MICRO)
        KVPressPolicy(**knobs).check_files(model.config.name_or_path, model.config)  # kvpress downloads then


def test_a_folder_without_the_files_is_refused_by_name(kvpress, hub, model, tmp_path: Path) -> None:
    model.config.name_or_path = DUO_MODEL
    policy = KVPressPolicy(press="DuoAttentionPress", files=str(tmp_path))
    with pytest.raises(PressFilesMissing, match=r"lacks config.json, full_attention_heads.tsv; fetch them: curl"):
        policy.check_files(DUO_MODEL, model.config)
    with pytest.raises(ValueError, match="only ExpectedAttentionStatsPress, DuoAttentionPress, LUKVPress"):
        KVPressPolicy(press="QFilterPress", files=str(tmp_path))


def test_models_without_published_files_are_refused_with_the_known_ones(kvpress, model) -> None:
    with pytest.raises(ValueError, match="DuoAttentionPress has head patterns for these models only"):
        KVPressPolicy(press="DuoAttentionPress").check_files(str(MICRO), model.config)
    with pytest.raises(ValueError, match="LUKVPress has budget curves for these only"):
        KVPressPolicy(press="LUKVPress", inner="KnormPress").check_files(LLAMA, model.config)


def test_a_cached_snapshot_is_named_by_its_repository() -> None:
    snapshot = f"/home/u/.cache/huggingface/hub/models--meta-llama--Llama-3.1-8B-Instruct/snapshots/{REVISION}"
    assert hub_name(snapshot) == LLAMA and hub_name(LLAMA) == LLAMA and hub_name(str(MICRO)) == str(MICRO)


def test_a_model_read_from_its_cache_snapshot_loads_files_by_its_hub_id(kvpress, hub, model) -> None:
    model.config.name_or_path = str(hub / "models--meta-llama--Llama-3.1-8B-Instruct" / "snapshots" / REVISION)
    repo = stats_files(kvpress, hub.parent / "made", LLAMA)  # named after the hub id, not the snapshot's folder
    cached(hub, repo, hub.parent / "made")
    record, _ = run(model, KVPressPolicy(press="ExpectedAttentionStatsPress"))
    assert record.kept == [BUDGET] * LAYERS and model.config.name_or_path.endswith(REVISION)


def test_the_runner_refuses_before_any_model_loads(kvpress, hub, tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir

    from restkv.eval.harness.runner import RunSettings, run_benchmark
    from restkv.eval.run import CONFIGS

    overrides = ["model=micro-llama", "bench=micro", "bench.lengths=[512]", "bench.samples=1", "bench.tasks=[passkey]"]
    overrides += ["policy=kvpress", "policy.press=KVzapPress", "budget=128"]
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=[*overrides, f"out_dir={tmp_path / 'out'}"])
    start = time.perf_counter()
    with pytest.raises(PressFilesMissing, match=r"hf download nvidia/KVzap-mlp-micro-llama config.json model"):
        run_benchmark(cfg, RunSettings("micro", "micro-llama", "kvpress", overrides, tmp_path / "out"))
    assert time.perf_counter() - start < 5 and not (tmp_path / "out").exists()


def test_the_runner_runs_a_press_from_the_cache(kvpress, hub, tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir

    from restkv.eval.harness.runner import RunSettings, run_benchmark
    from restkv.eval.run import CONFIGS

    kvpress.QFilterPress.load_q_filters.cache_clear()
    qfilter_files(kvpress, tmp_path / "made")
    cached(hub, "nthngdy/micro-llama_qfilt", tmp_path / "made")
    overrides = ["model=micro-llama", "bench=micro", "bench.lengths=[512]", "bench.samples=1", "bench.tasks=[passkey]"]
    overrides += ["policy=kvpress", "policy.press=QFilterPress", "budget=128"]
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=[*overrides, f"out_dir={tmp_path / 'out'}"])
    run_benchmark(cfg, RunSettings("micro", "micro-llama", "kvpress", overrides, tmp_path / "out"))
    record = json.loads(next((tmp_path / "out").rglob("predictions.jsonl")).read_text().splitlines()[0])
    assert record["kept_tokens"] == 128 and record["context_length"] > 128
