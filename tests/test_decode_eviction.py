"""Eviction during decoding (`restkv.decoding.eviction`): oracle, bounds, equivalences and refusals.

The oracle is computed here from scratch: one forward over prompt + decoded tokens whose attention lets each
decoded row see, on each layer and key/value head, exactly the positions that layer held when the row was
decoded (the compressor's trace), and prompt rows the causal prompt. The compressed run's logits at every step
must equal it, on all four architectures, with the prompt evicted at prefill too or kept whole.
"""

from __future__ import annotations

import pytest
import torch
from conftest import attention_function
from transformers import DynamicCache

from restkv import compress, get_policy
from restkv.decoding.eviction import DecodeEviction
from restkv.storage.quantize import Quantization

ARCHS = ["llama", "mistral", "qwen2", "qwen3"]
PROMPT, WINDOW, STEPS = 64, 8, 14


def prompt(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(seed))


def generate(model, policy, budget: int, eviction: DecodeEviction | None, steps: int = STEPS):
    """Greedy decoding under compression: (all tokens, per-step logits, the compressor, cache sizes per step)."""
    ids, cache = prompt(), DynamicCache(config=model.config)
    tokens, logits, sizes = ids, [], []
    with torch.no_grad(), compress(model, policy, budget, decode_eviction=eviction, trace_decode=True) as compressor:
        last = model(ids, cache=cache).logits[0, -1]
        for step in range(steps):
            token = last.argmax().view(1, 1)
            tokens = torch.cat([tokens, token], dim=1)
            last = model(token, cache=cache, position_ids=torch.tensor([[PROMPT + step]])).logits[0, -1]
            logits.append(last)
            sizes.append([layer.get_seq_length() for layer in cache.layers])
    return tokens, torch.stack(logits), compressor, sizes


def oracle(log: dict[int, list[torch.Tensor]]):
    """Attention where decoded row ``PROMPT + s`` sees, per layer and head, the positions logged at step ``s``."""

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        heads, length = query.shape[1], key.shape[2]
        key = key.repeat_interleave(heads // key.shape[1], dim=1).float()
        value = value.repeat_interleave(heads // value.shape[1], dim=1).float()
        logits = (query.float() @ key.transpose(-1, -2)) * scaling
        allowed = torch.ones(heads, length, length, dtype=torch.bool).tril()
        for step, held in enumerate(log[module.layer_idx]):
            row = PROMPT + step
            if row >= length:
                break
            visible = torch.zeros(held.shape[1], length, dtype=torch.bool)
            visible.scatter_(1, held[0], True)
            allowed[:, row] = visible.repeat_interleave(heads // held.shape[1], dim=0)
        weights = logits.masked_fill(~allowed, float("-inf")).softmax(-1)
        return (weights @ value).to(query.dtype).transpose(1, 2).contiguous(), weights

    return attention


@pytest.mark.parametrize("phase", ["decode", "both"])
@pytest.mark.parametrize("name", ["snapkv", "restkv", "rkv"])
@pytest.mark.parametrize("arch", ARCHS)
def test_each_step_equals_attention_over_what_the_layer_held(arch: str, name: str, phase: str, make_model) -> None:
    model = make_model(arch, attn="sdpa")
    eviction = DecodeEviction(budget=24, interval=4, phase=phase)
    tokens, logits, compressor, sizes = generate(model, get_policy(name, window=WINDOW), 40, eviction)
    log = compressor.decoder.log
    assert compressor.decoder.sizes, "no layer was cut during decoding"
    first = 40 if phase == "both" else PROMPT
    for step_sizes in sizes:  # the bound: what the prefill kept (or the budget), plus one interval
        assert max(step_sizes) <= max(first, 24) + 4
    for layer, held in log.items():
        assert all(torch.equal(h[0, :, -1], torch.full((h.shape[1],), PROMPT + s)) for s, h in enumerate(held))
        cut = [h for h in held if h.shape[2] <= 24 + 1]
        assert cut, f"layer {layer} never held the decode budget"
        # the window: the most recent tokens stay
        assert all(torch.equal(h[0, 0, -WINDOW:], torch.arange(h[0, 0, -1] - WINDOW + 1, h[0, 0, -1] + 1)) for h in cut)
    with torch.no_grad(), attention_function("sdpa", oracle(log)):
        expected = model(tokens).logits[0, PROMPT:]  # row PROMPT + s: the step that fed decoded token s
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


def test_a_budget_above_the_answer_changes_nothing(make_model) -> None:
    model = make_model("qwen3", attn="sdpa")
    policy = get_policy("restkv", window=WINDOW)
    plain = generate(model, policy, 40, None)
    roomy = generate(model, policy, 40, DecodeEviction(budget=40 + STEPS + 1, interval=2))
    assert torch.equal(plain[0], roomy[0]) and torch.equal(plain[1], roomy[1])
    assert not roomy[2].decoder.sizes


def test_without_prefill_eviction_the_prompt_stays_whole_until_decoding(make_model) -> None:
    model = make_model("llama")
    _, _, compressor, sizes = generate(model, get_policy("snapkv", window=WINDOW), 40, DecodeEviction(32, 8, "decode"))
    assert compressor.record.kept == [PROMPT, PROMPT]  # the prefill kept everything
    assert sizes[0] == [32, 32]  # the first step already exceeds budget + interval: cut at once


@pytest.mark.parametrize(
    ("knobs", "settings", "message"),
    [
        ("adakv", {}, "keeps a different count per head"),
        ("snapkv", {"layout": "varlen"}, "layout='varlen'"),
        ("snapkv", {"quantization": Quantization(backend="hqq", nbits=4)}, "quantized storage"),
        ("h2o", {}, "reads every query"),
        ("cam", {}, "change what is stored"),
        ("full", {}, "keeps everything"),
    ],
)
def test_what_cannot_be_cut_during_decoding_is_refused(knobs: str, settings: dict, message: str, make_model) -> None:
    model = make_model("llama")
    with pytest.raises((NotImplementedError, ValueError), match=message):
        compress(model, get_policy(knobs, window=WINDOW), 40, decode_eviction=DecodeEviction(24, 4), **settings)


def test_decode_eviction_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="pass no DecodeEviction"):
        DecodeEviction(24, 4, "prefill")
    with pytest.raises(ValueError, match="interval"):
        DecodeEviction(24, 0)
    with pytest.raises(NotImplementedError, match="gqa='expand'"):
        from restkv.decoding.eviction import check_decode_eviction

        check_decode_eviction(get_policy("snapkv", gqa="expand"), DecodeEviction(64, 4), "auto", None)


def test_a_run_records_the_cache_over_time_and_resumes(tmp_path, capsys) -> None:
    import json

    from hydra import compose, initialize_config_dir

    from restkv.eval.harness.runner import RunSettings, run_benchmark
    from restkv.eval.run import CONFIGS

    overrides = [
        "bench=micro",
        "bench.lengths=[1024]",
        "bench.samples=1",
        "bench.tasks=[passkey]",
        "limit=2",
        "compression.phase=decode",
        "compression.decode_budget=64",
        "compression.decode_interval=4",
    ]

    def run() -> dict:
        with initialize_config_dir(config_dir=CONFIGS, version_base=None):
            cfg = compose(config_name="config", overrides=[*overrides, f"out_dir={tmp_path}"])
        return run_benchmark(cfg, RunSettings("micro", "micro-llama", "restkv", overrides, tmp_path))

    summary = run()
    (predictions,) = tmp_path.rglob("predictions.jsonl")
    records = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert summary["ran"]["samples"] == len(records) >= 1
    for record in records:
        assert record["kept_tokens"] == record["context_length"]  # phase=decode: the prompt stays whole
        assert record["decode_cache"] and record["decode_cache"][0] == [1, 64.0]  # cut at the first step
        assert record["decode_path"] == "eager"
    run()
    assert f"{len(records)} of {len(records)} samples already done" in capsys.readouterr().out
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "plot_long_outputs.py"
    spec = importlib.util.spec_from_file_location("plot_long_outputs", script)
    plots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plots)
    runs = plots.finished_runs(tmp_path)
    assert [plots.phase_and_budget(r) for r in runs] == [("decode", 64)]
    assert plots.main(["lengths", "--runs", str(tmp_path), "--out", str(tmp_path / "figures")]) == 0
    assert (tmp_path / "figures" / "long-outputs-lengths.pdf").stat().st_size > 0
