"""Eviction, then the kept tokens stored quantized: fidelity, bytes, the backends, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers import DynamicCache
from transformers.cache_utils import QuantizedLayer

from restkv import compress, get_policy
from restkv.eval.harness.runner import RunSettings, run_benchmark
from restkv.eval.run import CONFIGS
from restkv.storage.quantize import OutlierQuantizedLayer, Quantization, quantized_bytes

PROMPT, WINDOW, BUDGET = 96, 8, 40


def prompt(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(seed))


def decode(model, quantization: Quantization | None, steps: int = 6, tokens: list[int] | None = None):
    """``steps`` tokens decoded after eviction, greedy or teacher-forced (``tokens``); the per-step logits,
    the prefill record and the cache."""
    cache = DynamicCache(config=model.config)
    ids, logits = prompt(), []
    with torch.no_grad(), compress(model, get_policy("restkv", window=WINDOW), BUDGET, quantization=quantization) as c:
        out = model(ids, cache=cache).logits[:, -1]
        for step in range(steps):
            logits.append(out[0])
            token = out.argmax(-1, keepdim=True) if tokens is None else torch.tensor([[tokens[step]]])
            out = model(token, cache=cache, position_ids=torch.tensor([[PROMPT + step]])).logits[:, -1]
    return torch.stack(logits), c.record, cache


def test_quantized_cache_tracks_the_unquantized_one_and_shrinks_it(make_model) -> None:
    model = make_model("llama")
    reference, plain, _ = decode(model, None)
    errors = {}
    for bits in (8, 4, 2):
        quantization = Quantization("hqq", nbits=bits, group_size=32, residual_length=4)
        logits, record, cache = decode(model, quantization, tokens=reference.argmax(-1).tolist())
        assert all(isinstance(layer, QuantizedLayer) for layer in cache.layers)
        errors[bits] = float((logits[1:] - reference[1:]).abs().max())  # step 0 reads the prefill only
        stored = sum(s.logical_bytes for s in record.sizes)
        unquantized = sum(s.logical_bytes for s in plain.sizes)
        bound = unquantized * (bits + 2) / 32  # bits per entry, plus a float32 scale and zero per 32 entries
        assert stored <= bound, f"{bits}-bit storage {stored} B vs {unquantized} B in float32"
    assert errors[8] < 0.05 and errors[8] < errors[4] < errors[2], errors


def test_decoding_past_the_residual_requantizes_and_keeps_counting(make_model) -> None:
    model = make_model("qwen3")
    _, _, cache = decode(model, Quantization("hqq", nbits=4, group_size=32, residual_length=3), steps=8)
    for layer in cache.layers:
        assert layer.get_seq_length() == BUDGET + 8
        assert layer.keys.numel() == 0 or layer.keys.shape[2] < 3


def test_kvquant_keeps_outliers_exactly() -> None:
    tensor = torch.randn(1, 2, 64, 16)
    tensor[0, 1, 5, 3], tensor[0, 0, 40, 0] = 40.0, -25.0
    plain = Quantization("hqq", nbits=2, group_size=32).layer(tensor, tensor.clone(), 0)
    outliers = Quantization("kvquant", nbits=2, group_size=32).layer(tensor, tensor.clone(), 0)
    assert isinstance(outliers, OutlierQuantizedLayer)
    restored = outliers._dequantize(outliers._quantized_keys)
    assert restored[0, 1, 5, 3] == 40.0 and restored[0, 0, 40, 0] == -25.0
    rest = tensor.abs() <= 6
    error_with = (restored - tensor)[rest].abs().mean()
    error_without = (plain._dequantize(plain._quantized_keys) - tensor)[rest].abs().mean()
    assert error_with < error_without, "outliers no longer stretch the other entries' quantization range"
    assert sum(quantized_bytes(outliers)) > sum(quantized_bytes(plain))  # the outliers are paid for


def test_quanto_backend_runs(make_model) -> None:
    pytest.importorskip("optimum.quanto", reason="optimum-quanto (the quant extra) is not installed")
    logits, record, _ = decode(make_model("llama"), Quantization("quanto", nbits=4, group_size=32), steps=2)
    assert torch.isfinite(logits).all() and all(s.logical_bytes > 0 for s in record.sizes)


BAD = [
    ({"backend": "bnb"}, ValueError, r"quantization.backend='bnb' is not allowed; choose one of: none, hqq, quanto"),
    ({"backend": "quanto", "nbits": 8}, ValueError, r"nbits=8 is not supported by the 'quanto' backend; it supports 2"),
    ({"backend": "hqq", "nbits": 5}, ValueError, r"nbits=5 is not supported by the 'hqq' backend; it supports 1, 2, 3"),
    ({"backend": "hqq", "axis_key": 2}, ValueError, r"axis_key=2 is not supported by the 'hqq' backend; allowed: 0, 1"),
    ({"backend": "hqq", "group_size": 0}, ValueError, r"quantization.group_size=0 is not allowed"),
]


@pytest.mark.parametrize(("settings", "error", "message"), BAD)
def test_bad_quantization_settings_are_named(settings: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        Quantization(**settings)


def test_missing_backend_names_the_extra(monkeypatch) -> None:
    import restkv.storage.quantize as quantize

    monkeypatch.setattr(quantize, "_installed", lambda module: False)
    with pytest.raises(ImportError, match=r"needs the 'optimum-quanto' package, which is not installed: pip install"):
        Quantization("quanto", nbits=4, group_size=32)


def test_group_sizes_some_lengths_cannot_fit_are_refused_before_quantizing() -> None:
    keys = torch.randn(1, 2, 37, 16)
    with pytest.raises(ValueError, match=r"group_size=64 does not divide layer 3's heads x head_dim \(2 x 16 = 32\)"):
        Quantization("hqq", nbits=4, group_size=64).layer(keys, keys.clone(), 3)
    with pytest.raises(ValueError, match=r"along axis 1 at 2 bits packs 4 groups together, and layer 0 has 2 groups"):
        Quantization("hqq", nbits=2, group_size=16, axis_key=1).layer(keys, keys.clone(), 0)
    for length in (37, 38, 41):  # every length fits a group size that divides heads x head_dim
        keys = torch.randn(1, 2, length, 16)
        Quantization("hqq", nbits=2, group_size=8, axis_key=1).layer(keys, keys.clone(), 0)


def test_head_wise_and_expanded_caches_are_refused(make_model) -> None:
    model = make_model("llama")
    quantization = Quantization("hqq", nbits=4, group_size=32)
    with pytest.raises(NotImplementedError, match="allocation='adakv' is not dense: use layout='auto'"):
        compress(model, get_policy("ada_restkv"), BUDGET, quantization=quantization)
    with pytest.raises(NotImplementedError, match="gqa='expand' on a grouped-query model stores query heads"):
        compress(model, get_policy("restkv", gqa="expand"), BUDGET, quantization=quantization)


def run(tmp_path: Path, *overrides: str) -> tuple[dict, list[dict]]:
    args = [f"out_dir={tmp_path}", "budget=64", *overrides]
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=args)
    bench = cfg.bench.get("name", None) or ("fidelity" if "bench=fidelity" in overrides else "ruler")
    settings = RunSettings(bench, "micro-llama", "restkv", out_dir=tmp_path, overrides=list(overrides))
    summary = run_benchmark(cfg, settings)
    lines = sorted(tmp_path.rglob("predictions.jsonl"))[-1].read_text().splitlines()
    return summary, [json.loads(line) for line in lines]


def test_restkv_with_a_4_bit_cache_end_to_end_on_the_micro_model(tmp_path: Path) -> None:
    """Generation on a RULER sample and fidelity, ReST-KV + 4-bit KIVI-style cache, bytes measured."""
    plain, plain_records = run(tmp_path / "plain", "bench.tasks=[niah_single_1]", "limit=1")
    quant, records = run(tmp_path / "quant", "quantization=kivi", "bench.tasks=[niah_single_1]", "limit=1")
    assert quant["cache"]["quantization"]["nbits"] == 4 and plain["cache"]["quantization"] == {"backend": "none"}
    assert records[0]["prediction"] and records[0]["kept_tokens"] == plain_records[0]["kept_tokens"]
    ratio = quant["cache"]["logical_bytes_mean"] / plain["cache"]["logical_bytes_mean"]
    assert ratio < 0.5, f"a 4-bit cache of bfloat16 tokens should hold well under half the bytes; got {ratio:.2f}"
    fidelity, fidelity_records = run(
        tmp_path / "fidelity",
        "quantization=kivi",
        "bench=fidelity",
        "evaluation.tokens=4",
        "bench.source.tasks=[niah_single_1]",
        "bench.source.lengths=[512]",
        "bench.source.samples=1",
    )
    assert fidelity_records[0]["kl"] > 0 and fidelity["cache"]["quantization"]["backend"] == "hqq"
