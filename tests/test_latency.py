"""The latency benchmark at tiny sizes: the pipeline end to end, its arithmetic, its caches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

from restkv import ReSTKV, compress
from restkv.baselines import FullCache, SnapKV
from restkv.cache import CompressedLayer
from restkv.eval.harness.config_tree import CONFIGS
from restkv.eval.latency.bounds import bound_ms, decode_bytes
from restkv.eval.latency.cli import run
from restkv.eval.latency.modeling import (
    cache_token_bytes,
    parameter_bytes_read,
    random_model,
    synthetic_base,
    synthetic_cache,
)
from restkv.eval.latency.settings import Settings, model_config
from restkv.eval.latency.timing import forward

PREFILL_FIELDS = {
    "context",
    "policy",
    "budget",
    "seconds_median",
    "seconds",
    "eviction_seconds_median",
    "eviction_seconds",
    "kept_tokens_mean",
    "cache_bytes_before_eviction",
    "cache_bytes_after_eviction",
    "cache_bytes_allocated",
    "peak_memory_bytes",
    "peak_memory_delta_bytes",
}
DECODE_FIELDS = {
    "context",
    "budget",
    "label",
    "cache",
    "fill",
    "tokens",
    "ms_per_token_median",
    "ms_per_token",
    "cache_tokens_start",
    "cache_bytes_start",
    "cache_bytes_allocated",
    "parameter_bytes_read",
    "bytes_read_per_step",
    "bound_ms",
    "bound_bandwidth_gbps",
    "achieved_over_bound",
    "peak_memory_bytes",
    "peak_memory_delta_bytes",
}


def tiny_settings(tmp_path: Path, **changes) -> Settings:
    values = {
        "name": "test",
        "shape": "tiny-llama",
        "device": "cpu",
        "contexts": [96],
        "budgets": [40],
        "decode_budgets": [40],
        "decode_tokens": 2,
        "decode_warmup_tokens": 1,
        "warmup": 0,
        "repeats": 2,
        "bandwidth_mib": 8,
        "bandwidth_repeats": 2,
        "out_dir": str(tmp_path),
        "progress": False,
        "policy_knobs": {"snapkv": {"window": 8}, "restkv": {"window": 8}},
    }
    values.update(changes)
    return Settings(**values)


def test_pipeline_end_to_end_with_memory_and_plots(tmp_path: Path) -> None:
    settings = tiny_settings(tmp_path, decode_fill="prefill", memory=True, decode_caches=["preallocated"])
    record = run(settings, "test")
    saved = json.loads((tmp_path / "test.json").read_text())
    assert saved == json.loads(json.dumps(record))
    assert {e["policy"] for e in saved["prefill"]} == {"full", "snapkv", "restkv"}
    assert [(e["label"], e["cache"]) for e in saved["decode"]] == [
        ("full", "preallocated"),
        ("budget 40", "preallocated"),
    ]
    for entry in saved["prefill"]:
        assert set(entry) >= PREFILL_FIELDS, PREFILL_FIELDS - set(entry)
        assert len(entry["seconds"]) == 2 and entry["seconds_median"] > 0
        assert entry["peak_memory_delta_bytes"] is not None and entry["peak_memory_bytes"] > 0
        kept = 96 if entry["policy"] == "full" else 40
        assert entry["kept_tokens_mean"] == kept
        assert entry["cache_bytes_after_eviction"] == kept * saved["model"]["cache_bytes_per_token"]
        assert entry["cache_bytes_before_eviction"] == 96 * saved["model"]["cache_bytes_per_token"]
    for entry in saved["decode"]:
        assert set(entry) >= DECODE_FIELDS, DECODE_FIELDS - set(entry)
        assert entry["achieved_over_bound"] == pytest.approx(entry["ms_per_token_median"] / entry["bound_ms"], rel=1e-3)
    ratios = saved["ratios"]
    assert any("prefill_vs_snapkv" in row and "peak_memory_vs_snapkv" in row for row in ratios["prefill"])
    assert any("bound_speedup" in row for row in ratios["decode"])
    assert saved["bandwidth"]["copy_gbps"] > 0 and saved["memory_method"]
    for name in saved["plots"]:
        assert (tmp_path / name).stat().st_size > 1000
    assert {p.name for p in tmp_path.glob("*.png")} == {"test-latency.png", "test-memory.png"}


def test_synthetic_decode_says_so(tmp_path: Path) -> None:
    record = run(tiny_settings(tmp_path, prefill=False, memory=False, decode_profile=True, plots=False), "test")
    assert record["prefill"] == [] and len(record["decode"]) == 4  # full and budget 40, both cache kinds
    fastest_full = min((e for e in record["decode"] if e["budget"] is None), key=lambda e: e["ms_per_token_median"])
    for row in (r for r in record["ratios"]["decode"] if "speedup_vs_best_full" in r):  # against the best full kind
        compressed = next(e for e in record["decode"] if e["budget"] == row["budget"] and e["cache"] == row["cache"])
        assert row["best_full_cache"] == fastest_full["cache"]
        assert row["speedup_vs_best_full"] == pytest.approx(
            fastest_full["ms_per_token_median"] / compressed["ms_per_token_median"], rel=1e-3
        )
    assert any("synthetic" in note for note in record["notes"])
    assert all(e["fill"] == "synthetic" and e["peak_memory_bytes"] is None for e in record["decode"])
    assert all(e["profile_top_ops"] for e in record["decode"])
    assert {e["cache_tokens_start"] for e in record["decode"]} == {96, 40}


def test_in_process_peak_probe_as_on_gpus(tmp_path: Path) -> None:
    from restkv.eval.latency.jobs import build_model, decode_jobs
    from restkv.eval.latency.model_mode import time_jobs

    settings = tiny_settings(tmp_path, decode_fill="synthetic", repeats=1)
    model = build_model(settings)
    timed = time_jobs(model, settings, decode_jobs(settings, 96), lambda: None, peak=True)
    assert len(timed) == 4 and all(len(runs) == 1 for runs in timed)
    assert all(runs[0]["memory"]["peak_bytes"] >= runs[0]["memory"]["baseline_bytes"] for runs in timed)


def test_bound_arithmetic_by_hand() -> None:
    # 1000 bytes of weights; the cache holds 10 bytes and grows 2 bytes a token; 1 untimed step then 3 timed:
    # timed steps attend over 10 + 2*2, 10 + 2*3, 10 + 2*4 bytes -> mean 16 bytes of cache.
    assert decode_bytes(1000, 10, 2, warmup=1, steps=3) == 1016
    assert bound_ms(2e9, 10.0) == pytest.approx(200.0)  # 2 GB at 10 GB/s


@pytest.mark.parametrize("tied", [False, True])
def test_parameter_and_cache_bytes_by_hand(tied: bool) -> None:
    config = LlamaConfig(
        vocab_size=100,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        tie_word_embeddings=tied,
    )
    model = AutoModelForCausalLM.from_config(config)
    # per layer: q 8*8, k 8*4, v 8*4, o 8*8, mlp 3*8*16, two norms 2*8 -> 592; final norm 8
    body = 2 * 592 + 8
    embedding = 100 * 8
    expected = body + embedding if tied else body + embedding + 8  # untied: head whole + one embedding row
    assert parameter_bytes_read(model) == 4 * expected
    assert cache_token_bytes(config, torch.float32) == 2 * 2 * 1 * 4 * 4  # layers * (k, v) * kv heads * dim * 4 B
    assert cache_token_bytes(config, torch.bfloat16) == 2 * 2 * 1 * 4 * 2


def test_random_model_keeps_the_shapes_weight_tying() -> None:
    config = model_config(Settings(name="x", shape="llama-3.2-1b", layers=1))
    config.vocab_size, config.hidden_size, config.intermediate_size = 64, 64, 128  # small, same tying
    model = random_model(config, torch.float32, torch.device("cpu"))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert float(model.lm_head.weight.detach().std()) == pytest.approx(0.02, rel=0.2)


def decode_logits(model, policy, reserve: int, steps: int = 5) -> list[torch.Tensor]:
    ids = torch.randint(0, 256, (1, 96), generator=torch.Generator().manual_seed(3))
    cache = DynamicCache(config=model.config)
    out = []
    with torch.no_grad(), compress(model, policy, budget=40, decode_reserve=reserve):
        logits = forward(model, ids, cache, 0)
        for step in range(steps):
            logits = forward(model, logits.argmax().view(1, 1), cache, 96 + step)
            out.append(logits)
    kinds = {type(layer) for layer in cache.layers}
    assert kinds == ({CompressedLayer} if reserve or policy.evicts else {type(cache.layers[0])})
    for layer in cache.layers:  # past the reserve, a layer falls back to concatenation (capacity = length)
        if not isinstance(layer, CompressedLayer):
            continue
        length = layer.get_seq_length()
        assert layer.capacity == (length - steps + reserve if reserve >= steps else length)
    return out


@pytest.mark.parametrize("policy", [FullCache(), SnapKV(window=8), ReSTKV(window=8, gqa="expand")], ids=repr)
def test_preallocated_cache_gives_identical_logits(policy) -> None:
    model = random_model(model_config(tiny_settings(Path("."))), torch.float32, torch.device("cpu"))
    dynamic = decode_logits(model, policy, reserve=0)
    preallocated = decode_logits(model, policy, reserve=8)
    past_reserve = decode_logits(model, policy, reserve=2)  # falls back to concatenation after 2 tokens
    for a, b, c in zip(dynamic, preallocated, past_reserve, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_synthetic_caches_decode_identically() -> None:
    config = model_config(tiny_settings(Path(".")))
    model = random_model(config, torch.float32, torch.device("cpu"))
    base = synthetic_base(config, 64, torch.float32, torch.device("cpu"))
    for tokens in (64, 16):
        results = []
        for kind in ("dynamic", "preallocated"):
            cache = synthetic_cache(config, base, tokens, kind, reserve=4)
            with torch.no_grad():
                results.append([forward(model, torch.tensor([[5]]), cache, 64 + i) for i in range(3)])
            assert cache.get_seq_length() == tokens + 3
        assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_presets_compose_and_validate() -> None:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import restkv.eval.latency.cli  # noqa: F401  (registers the primary config)

    presets = sorted(p.stem for p in (CONFIGS / "latency").glob("*.yaml") if p.stem != "base")
    assert {"tiny", "cpu-8k", "cpu-decode-32k", "gpu-h200"} <= set(presets)
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        for preset in presets:
            cfg = compose(config_name="latency_main", overrides=[f"latency={preset}", "latency.repeats=7"])
            settings = Settings.from_config(cfg.latency, preset)
            assert settings.name == preset and settings.repeats == 7
            model_config(settings)
    with pytest.raises(ValueError, match="unknown key"):
        Settings.from_config(OmegaConf.create({**OmegaConf.to_container(cfg.latency), "typo": 1}), "x")


@pytest.mark.parametrize(
    ("shape", "parameters"),
    [("llama-3.2-1b", 1_235_814_400), ("llama-3.1-8b", 8_030_261_248), ("mistral-7b-v0.2", 7_241_732_096)],
)
def test_shapes_have_the_real_models_parameter_counts(shape: str, parameters: int) -> None:
    config = model_config(Settings(name="x", shape=shape))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == parameters


def test_headwise_synthetic_caches_hold_the_uniform_total() -> None:
    from restkv.eval.latency.headwise import headwise_lengths
    from restkv.eval.latency.modeling import cache_bytes
    from restkv.storage.layouts import MaskedLayer, VarlenLayer

    assert (
        headwise_lengths(4, 40, 96) == sorted(headwise_lengths(4, 40, 96)) and sum(headwise_lengths(4, 40, 96)) == 160
    )
    assert sum(headwise_lengths(8, 128, 150)) == 8 * 128 and max(headwise_lengths(8, 128, 150)) <= 150
    config = model_config(tiny_settings(Path(".")))
    base = synthetic_base(config, 96, torch.float32, torch.device("cpu"))
    heads, dim, layers = config.num_key_value_heads, base[0].shape[-1], config.num_hidden_layers
    sizes = {
        kind: cache_bytes(synthetic_cache(config, base, 40, kind, reserve=3))
        for kind in ("preallocated", "varlen", "masked")
    }
    varlen = synthetic_cache(config, base, 40, "varlen", reserve=3)
    assert all(isinstance(layer, VarlenLayer) and sum(layer.lengths) == heads * 40 for layer in varlen.layers)
    assert isinstance(synthetic_cache(config, base, 40, "masked", reserve=3).layers[0], MaskedLayer)
    kept = layers * heads * 40 * dim * 4 * 2  # keys and values, float32
    assert sizes["preallocated"]["logical"] == sizes["varlen"]["logical"] == sizes["masked"]["logical"] == kept
    assert sizes["varlen"]["allocated"] == kept + layers * heads * 3 * dim * 4 * 2  # + the reserve, nothing else
    full = layers * heads * (96 + 3) * dim * 4 * 2
    assert sizes["masked"]["allocated"] == full + layers * heads * (96 + 3)  # the full cache + a 1-byte mask
    assert sizes["masked"]["read"] == layers * heads * 96 * dim * 4 * 2  # attention reads the whole context
    assert sizes["varlen"]["reserve"] == sizes["preallocated"]["reserve"] == layers * heads * 3 * dim * 4 * 2


def test_headwise_synthetic_layouts_decode_the_same_tokens() -> None:
    """varlen and masked keep the same positions per head: decoding over them gives the same logits."""
    from restkv.baselines import FullCache

    config = model_config(tiny_settings(Path(".")))
    model = random_model(config, torch.float32, torch.device("cpu"))
    base = synthetic_base(config, 64, torch.float32, torch.device("cpu"))
    results = []
    for kind in ("varlen", "masked"):
        cache = synthetic_cache(config, base, 16, kind, reserve=2)
        with torch.no_grad(), compress(model, FullCache(), budget=1 << 20):
            results.append([forward(model, torch.tensor([[5]]), cache, 64 + i) for i in range(3)])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="head-wise compressed layers"):  # outside a compressor: refused
        forward(model, torch.tensor([[5]]), synthetic_cache(config, base, 16, "varlen", reserve=2), 64)


def test_headwise_layouts_in_the_benchmark(tmp_path: Path) -> None:
    from restkv.eval.latency.tables import tables

    settings = tiny_settings(
        tmp_path,
        prefill=False,
        memory=False,
        decode_caches=["preallocated", "varlen", "masked"],
        decode_attention_only=True,
        decode_attention_calls=3,
        plots=True,
    )
    record = run(settings, "test")
    text = tables(record)  # the printed report: the new columns, the note, both layout rows; and the plot
    assert "attn ms" in text and "alloc MiB" in text and "attention_ms (decode_attention_only)" in text
    assert "varlen layout vs the uniform cache" in text and "masked layout vs the uniform cache" in text
    assert (tmp_path / "test-latency.png").stat().st_size > 1000
    kinds = {(e["budget"], e["cache"]) for e in record["decode"]}
    assert kinds == {(None, "preallocated"), (40, "preallocated"), (40, "varlen"), (40, "masked")}
    rows = {r["layout"]: r for r in record["ratios"]["decode"] if "layout" in r}
    assert set(rows) == {"varlen", "masked"}
    assert rows["varlen"]["allocated_vs_logical"] == pytest.approx((40 + 3) / 40, rel=1e-3)  # reserve: 1 + 2 steps
    assert rows["varlen"]["allocated_vs_logical_plus_reserve"] == 1.0  # nothing else is allocated
    assert rows["masked"]["allocated_vs_full"] > 1 and rows["masked"]["allocated_vs_logical"] > 2
    assert all(e["attention_ms"] > 0 for e in record["decode"])
    with pytest.raises(ValueError, match="decode_caches=\\['paged'\\]: allowed dynamic, preallocated, varlen, masked"):
        tiny_settings(tmp_path, decode_caches=["paged"])


@pytest.mark.parametrize("kind", ["varlen", "masked"])
def test_headwise_layouts_with_equal_heads_decode_as_the_dense_cache(kind: str) -> None:
    """Equivalence: with every head keeping the budget (spread 0), a head-wise layout is the uniform cache."""
    from restkv.eval.latency.headwise import headwise_lengths

    assert headwise_lengths(2, 16, 64, spread=0.0) == [16, 16]
    config = model_config(tiny_settings(Path(".")))
    model = random_model(config, torch.float32, torch.device("cpu"))
    base = synthetic_base(config, 64, torch.float32, torch.device("cpu"))
    results = []
    for name in ("preallocated", kind):
        cache = synthetic_cache(config, base, 16, name, reserve=2, spread=0.0)
        if kind == "varlen" and name == kind:
            assert all(layer.lengths == [16, 16] for layer in cache.layers)
        with torch.no_grad(), compress(model, FullCache(), budget=1 << 20):
            results.append([forward(model, torch.tensor([[5]]), cache, 64 + i) for i in range(3)])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_headwise_layer_sizes_by_hand() -> None:
    """layer_size of a synthetic varlen layer: (sum of lengths + heads * reserve) * head_dim * (k, v) * 4 B."""
    from restkv.eval.latency.headwise import headwise_lengths
    from restkv.eval.latency.modeling import cache_bytes

    config = model_config(tiny_settings(Path(".")))
    base = synthetic_base(config, 96, torch.float32, torch.device("cpu"))
    heads, dim, layers = config.num_key_value_heads, base[0].shape[-1], config.num_hidden_layers
    lengths = headwise_lengths(heads, 40, 96)
    assert lengths != [40] * heads and sum(lengths) == heads * 40
    for reserve in (0, 5):
        sizes = cache_bytes(synthetic_cache(config, base, 40, "varlen", reserve=reserve))
        per_layer = (sum(lengths) + heads * reserve) * dim * 2 * 4
        assert sizes["allocated_per_layer"] == [per_layer] * layers and sizes["allocated"] == layers * per_layer
        assert sizes["logical_per_layer"] == [sum(lengths) * dim * 2 * 4] * layers
        assert sizes["layer_kinds"] == ["VarlenLayer"]
        if reserve == 0:
            assert sizes["allocated"] == sizes["logical"]  # exactly the kept tokens


def test_headwise_layouts_after_a_real_prefill(tmp_path: Path) -> None:
    """decode_fill=prefill: the compressor stores AdaKV's head-wise selection in the layout each kind names."""
    settings = tiny_settings(
        tmp_path,
        prefill=False,
        memory=False,
        plots=False,
        decode_fill="prefill",
        decode_policy="adakv",
        policy_knobs={"adakv": {"window": 8}},
        decode_caches=["preallocated", "varlen", "masked"],
        repeats=1,
    )
    record = run(settings, "test")
    kinds = {(e["budget"], e["cache"]): e["cache_layer_kinds"] for e in record["decode"]}
    assert kinds == {
        (None, "preallocated"): ["CompressedLayer"],
        (40, "preallocated"): ["VarlenLayer"],  # layout=auto stores a head-wise selection varlen
        (40, "varlen"): ["VarlenLayer"],
        (40, "masked"): ["MaskedLayer"],
    }
    rows = {r["layout"]: r for r in record["ratios"]["decode"] if "layout" in r}
    assert rows["varlen"]["allocated_vs_uniform"] == 1.0 and rows["varlen"]["allocated_vs_logical_plus_reserve"] == 1.0
    assert rows["masked"]["allocated_vs_full"] > 1
    for e in record["decode"]:
        assert sum(e["cache_bytes_per_layer"]["allocated"]) == e["cache_bytes_allocated"]
