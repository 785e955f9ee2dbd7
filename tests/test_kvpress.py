"""kvpress both ways: its scoring presses as our policies (``policy=kvpress``), ReST-KV as its press.

The first tests need no kvpress (budget-to-ratio mapping, the policy's settings, the error without
kvpress). The others skip without it: kvpress 0.5.5 needs transformers < 5.3, so they run in an
environment of their own (docs/kvpress.md).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from restkv import ReSTKV, get_policy
from restkv.eval.harness.runner import RunSettings, run_benchmark
from restkv.eval.run import CONFIGS
from restkv.interop import KVPressMissing, compression_ratio, kvpress_kept
from restkv.interop.kvpress_policy import SUPPORTED, WINDOWS, KVPressPolicy
from restkv.interop.positions import full_cache, policy_positions, press_positions

MICRO = Path(__file__).resolve().parents[1] / "models" / "micro-llama"
NO_KVPRESS = 'kvpress is not installed (pip install -e ".[kvpress]", which needs transformers < 5.3)'
FAST = ["model=tiny-random-llama", "bench=micro", "bench.lengths=[512]", "bench.samples=1", "bench.tasks=[passkey]"]


def kvpress_installed() -> bool:
    try:
        import kvpress  # noqa: F401
    except ImportError:
        return False
    return True


def needs_kvpress():
    return pytest.importorskip("kvpress", reason=NO_KVPRESS)


def run(tmp_path: Path, *overrides: str) -> dict:
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=[*FAST, f"out_dir={tmp_path}", *overrides])
    return run_benchmark(cfg, RunSettings("micro", "tiny-random-llama", "kvpress", list(overrides), tmp_path))


# --- without kvpress ---------------------------------------------------------------------------------


def test_the_ratio_makes_kvpress_keep_exactly_the_budget() -> None:
    for length in (33, 600, 2048, 4097, 131072):
        for kept in {1, 2, 31, 64, 128, 1000, length // 3, length - 1, length} - {0}:
            if kept <= length:
                ratio = compression_ratio(kept, length)
                assert kvpress_kept(length, ratio) == kept and 0 <= ratio < 1
                assert math.isclose(ratio, 1 - kept / length, abs_tol=1e-12)
    assert kvpress_kept(600, 1 - 120 / 600) == 119 and kvpress_kept(700, 1 - 128 / 700) == 127  # the last bit
    with pytest.raises(ValueError, match="cannot keep 700 of 600 tokens"):
        compression_ratio(700, 600)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"press": "SnapPress"}, r"press='SnapPress' is not a press that runs here; runnable: AdaKVPress, BlockPress"),
        ({"press": "KnormPress", "window_size": 32}, r"KnormPress does not take window_size; its settings: none"),
        ({"press": "SnapKVPress", "n_sink": 2}, r"SnapKVPress does not take n_sink; its settings: window_size, kernel"),
        ({"press": "SnapKVPress", "window": 16}, r"window is SnapKVPress's own \(64\); set policy.window_size"),
        ({"press": "KnormPress", "window": 16}, r"window is KnormPress's own \(1\); leave it unset"),
        ({"gqa": "expand"}, r"gqa='expand' is not allowed: kvpress presses give one score per key/value head"),
    ],
)
def test_settings_are_checked_when_built(knobs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KVPressPolicy(**knobs)


def test_the_window_is_the_press_own() -> None:
    assert KVPressPolicy().window == 64
    assert KVPressPolicy(window_size=32).window == 32 == KVPressPolicy(window_size=32, window=32).window
    assert KVPressPolicy(press="TOVAPress").window == 1 == KVPressPolicy(press="KnormPress").window
    assert KVPressPolicy(press="StreamingLLMPress", n_sink=8).settings() == {"n_sink": 8}
    assert get_policy("kvpress", press="RandomPress", seed=3).settings() == {"seed": 3}


def test_press_settings_are_typed_on_the_command_line() -> None:
    with pytest.raises(HydraException) as error, initialize_config_dir(config_dir=CONFIGS, version_base=None):
        compose(config_name="config", overrides=["policy=kvpress", "policy.window_size=abc"])
    assert "policy.window_size=abc" in str(error.value)
    assert "could not be converted to Integer" in str(error.value.__cause__)


@pytest.mark.skipif(kvpress_installed(), reason="kvpress is installed here")
def test_without_kvpress_the_run_stops_before_writing(tmp_path: Path) -> None:
    with pytest.raises(KVPressMissing, match=r'install the extra: pip install -e "\.\[kvpress\]"'):
        run(tmp_path, "policy=kvpress")
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
    import restkv.interop

    with pytest.raises(ValueError, match=r"kvpress is not installed"):
        restkv.interop.ReSTKVPress  # noqa: B018


# --- kvpress presses as our policies ---------------------------------------------------------------------


def test_the_table_is_the_installed_kvpress() -> None:
    kvpress = needs_kvpress()
    for name, settings in SUPPORTED.items():
        cls = getattr(kvpress, name)
        assert issubclass(cls, kvpress.ScorerPress) and cls.compress is kvpress.ScorerPress.compress, name
        public = [f.name for f in cls.__dataclass_fields__.values() if not f.name.startswith("_")]
        assert sorted(public) == sorted(("compression_ratio", *settings)), name
    for name, (setting, default) in WINDOWS.items():
        assert setting is None or getattr(kvpress, name).__dataclass_fields__[setting].default == default


@pytest.mark.parametrize(
    ("press", "reason"),
    [
        ("BasePress", "base class of every press"),
        ("ScorerPress", "base class of the scorer presses"),
    ],
)
def test_other_presses_are_refused_with_the_reason(press: str, reason: str) -> None:
    needs_kvpress()
    with pytest.raises(ValueError, match=rf"kvpress's {press} is not supported because .*{reason}"):
        KVPressPolicy(press=press)


@pytest.fixture(scope="module")
def micro():
    needs_kvpress()
    load = AutoModelForCausalLM.from_pretrained
    models = {attn: load(MICRO, dtype=torch.float32, attn_implementation=attn).eval() for attn in ("sdpa", "eager")}
    return models, torch.randint(20, 1000, (1, 700), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_our_policy_keeps_what_the_press_keeps(micro, name: str) -> None:
    """Through our integration each press keeps the positions it keeps in its own hooks (same seeds)."""
    kvpress = needs_kvpress()
    models, ids = micro
    model = models["eager" if name == "ObservedAttentionPress" else "sdpa"]
    settings = {"window_size": 32} if name == "SnapKVPress" else {}
    native = press_positions(model, getattr(kvpress, name)(compression_ratio(128, 700), **settings), ids)
    ours = policy_positions(model, KVPressPolicy(press=name, **settings), 128, ids)
    assert [p.shape for p in ours] == [torch.Size([2, 128])] * 4
    assert all(torch.equal(a, b) for a, b in zip(native, ours, strict=True))


@pytest.mark.parametrize(
    ("ours", "press", "settings"),
    [("snapkv", "SnapKVPress", {"window_size": 32}), ("streamingllm", "StreamingLLMPress", {"n_sink": 4})],
)
def test_where_definitions_agree_ours_keeps_what_kvpress_keeps(micro, ours: str, press: str, settings: dict) -> None:
    """The cross-check's claim (results/summaries/kvpress-crosscheck.txt): our SnapKV and StreamingLLM are kvpress's."""
    kvpress = needs_kvpress()
    models, ids = micro
    for budget in (64, 128, 300):
        theirs = getattr(kvpress, press)(compression_ratio(budget, 700), **settings)
        native = press_positions(models["sdpa"], theirs, ids)
        mine = policy_positions(models["sdpa"], get_policy(ours), budget, ids)
        assert all(torch.equal(a, b) for a, b in zip(native, mine, strict=True)), (ours, budget)


def test_a_press_reading_attention_weights_needs_eager(micro) -> None:
    models, ids = micro
    with pytest.raises(ValueError, match=r"reads the attention weights: run it with model\.attn_implementation=eager"):
        policy_positions(models["sdpa"], KVPressPolicy(press="ObservedAttentionPress"), 128, ids)


@pytest.mark.parametrize(
    ("press", "extra"),
    [
        ("SnapKVPress", ["policy.window_size=32", "protocol=query_agnostic"]),
        ("SnapKVPress", ["policy.schedule=pyramid"]),
        ("StreamingLLMPress", ["policy.n_sink=4"]),
        ("KnormPress", ["protocol=query_agnostic"]),
        ("TOVAPress", []),
        ("ExpectedAttentionPress", ["policy.n_future_positions=256"]),
        ("RandomPress", ["policy.seed=0"]),
        ("KeyDiffPress", []),
        ("ObservedAttentionPress", ["model.attn_implementation=eager"]),
        ("AdaKVPress", ["policy.inner=SnapKVPress", "policy.window_size=32"]),
        ("PyramidKVPress", ["policy.window_size=32"]),
    ],
)
def test_presses_run_end_to_end_and_resume(tmp_path: Path, press: str, extra: list[str], capsys) -> None:
    needs_kvpress()
    overrides = ["policy=kvpress", f"policy.press={press}", "budget=96", *extra]
    summary = run(tmp_path, *overrides)
    (folder,) = (tmp_path / "micro" / "tiny-random-llama" / "kvpress").iterdir()
    (record,) = [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]
    assert record["kept_tokens"] < record["context_length"]
    pyramid = "policy.schedule=pyramid" in extra or press == "PyramidKVPress"
    assert record["kept_tokens"] == 96 or pyramid  # PyramidKV budgets: 96 on average
    assert summary["ran"]["samples"] == 1 and json.loads((folder / "metrics.json").read_text())["budget"] == "96"
    run(tmp_path, *overrides)
    assert "1 of 1 samples already done" in capsys.readouterr().out


# --- ReST-KV as a kvpress press ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipe(micro):
    from transformers import pipeline

    tokenizer = AutoTokenizer.from_pretrained(MICRO)
    return pipeline("kv-press-text-generation", model=micro[0]["sdpa"], tokenizer=tokenizer, device="cpu")


CONTEXT = " ".join(f"The number of item {i} is {(i * 7919) % 10007}." for i in range(110))


@pytest.mark.parametrize("budget", [48, 128, 400])
@pytest.mark.parametrize(
    "policy", [ReSTKV(), ReSTKV(gqa="max"), get_policy("restkv_ruler"), get_policy("snapkv"), get_policy("h2o")]
)
def test_restkv_press_in_kvpress_pipeline_keeps_our_positions(pipe, budget: int, policy) -> None:
    from restkv.interop import ReSTKVPress

    ids = pipe.preprocess(CONTEXT, questions=[""], answer_prefix="", max_context_length=10**6)["context_ids"]
    press = ReSTKVPress(compression_ratio=compression_ratio(budget, ids.shape[1]), policy=policy)
    cache = DynamicCache()
    answer = pipe(CONTEXT, question="What is the number of item 7?", press=press, cache=cache, max_new_tokens=4)
    assert isinstance(answer["answer"], str)
    kept = [layer.keys.shape[2] for layer in cache.layers]
    assert kept == [budget] * 4
    from restkv.interop.positions import kept_positions

    theirs = kept_positions(cache, full_cache(pipe.model, ids))
    ours = policy_positions(pipe.model, policy, budget, ids)
    assert all(torch.equal(a, b) for a, b in zip(theirs, ours, strict=True))


def test_restkv_press_refuses_what_kvpress_cannot_do() -> None:
    needs_kvpress()
    from restkv.interop import ReSTKVPress

    with pytest.raises(ValueError, match=r"gqa='expand' is not allowed: kvpress keeps one selection per key/value"):
        ReSTKVPress(policy=ReSTKV(gqa="expand"))
    with pytest.raises(ValueError, match=r"schedule='pyramid' is not allowed"):
        ReSTKVPress(policy=get_policy("pyramidkv"))
    with pytest.raises(ValueError, match=r"needs a policy of ours that implements score\(\); got FullCache"):
        ReSTKVPress(policy=get_policy("full"))
    assert ReSTKVPress().policy == ReSTKV()
