"""Chunked prefill with eviction between chunks (`restkv.chunked_prefill`, ``compression.prefill_chunk``).

A chunk longer than the prompt is today's one-shot prefill, byte for byte; smaller chunks never let a layer's
cache hold more than ``budget + window + chunk`` tokens, measured by a hook on every attention module that reads
the layer's cache right after the chunk was appended to it (before the compressor cuts it), on four
architectures (Llama, Qwen2, Gemma 3 with its sliding layers, Phi-3's fused projections), dense and head-wise.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import tiny_model
from test_model_families import family
from transformers import DynamicCache

from restkv import compress, get_policy
from restkv.chunked_prefill import chunk_bounds, chunked_prefill, enable_chunked_prefill
from restkv.decoding.eviction import DecodeEviction
from restkv.eval.evaluation.decoding import prefill
from restkv.eval.evaluation.prompting import PromptTokens
from restkv.stages.allocation import HeadSelection
from restkv.storage.quantize import Quantization

PROMPT, WINDOW, BUDGET, CHUNK = 160, 8, 40, 24


def model_of(arch: str) -> torch.nn.Module:
    return tiny_model(arch, attn="eager") if arch in ("llama", "qwen2") else family(arch, "eager")


def ids_of(length: int = PROMPT, seed: int = 1) -> list[int]:
    return torch.randint(3, 128, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def run(model, policy, ids: list[int], chunk: int | None, layout: str = "auto", quantization=None, budget=BUDGET):
    """Prefill ``ids`` (in chunks of ``chunk``) and decode two tokens: (last logits per step, record, peaks),
    ``peaks`` the most tokens each layer's cache held at any attention call, read by a hook that runs before
    the compressor's (registered first)."""
    cache = DynamicCache(config=model.config)
    peaks: dict[int, int] = {}

    def measure(module, args, kwargs, output) -> None:
        layer = cache.layers[module.layer_idx]
        keys = getattr(layer, "keys", None)
        if type(layer).__name__ == "DynamicLayer" and keys is not None and keys.dim() == 4:
            peaks[module.layer_idx] = max(peaks.get(module.layer_idx, 0), keys.shape[2])

    layers = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "o_proj")]
    hooks = [m.register_forward_hook(measure, with_kwargs=True) for m in layers]
    steps = []
    try:
        with torch.no_grad(), compress(model, policy, budget, layout=layout, quantization=quantization) as compressor:
            enable_chunked_prefill(compressor, chunk)

            def forward(part: list[int], start: int) -> torch.Tensor:
                positions = torch.arange(start, start + len(part))[None]
                return model(torch.tensor([part]), cache=cache, position_ids=positions).logits[0, -1]

            last = chunked_prefill(compressor, ids, forward)
            for step in range(2):
                steps.append(last)
                token = last.argmax().view(1, 1)
                last = model(token, cache=cache, position_ids=torch.tensor([[len(ids) + step]])).logits[0, -1]
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(steps), compressor, peaks


def same_selection(a, b) -> bool:
    if isinstance(a, HeadSelection):
        return torch.equal(a.positions, b.positions) and torch.equal(a.lengths, b.lengths)
    return (a is None and b is None) or torch.equal(a, b)


def test_chunk_bounds_end_with_a_whole_window() -> None:
    assert chunk_bounds(100, 40, 8) == [(0, 40), (40, 80), (80, 100)]
    assert chunk_bounds(85, 40, 8) == [(0, 40), (40, 85)]  # a last piece of 5 joins the one before
    assert chunk_bounds(30, 40, 8) == [(0, 30)]


@pytest.mark.parametrize("name", ["snapkv", "adakv", "restkv", "pyramidkv"])
def test_a_chunk_longer_than_the_prompt_is_the_one_shot_prefill(name: str) -> None:
    model = tiny_model("llama", attn="eager")
    ids = ids_of()
    one, one_shot, _ = run(model, get_policy(name, window=WINDOW), ids, None)
    chunked, long_chunk, _ = run(model, get_policy(name, window=WINDOW), ids, PROMPT + 10)
    assert torch.equal(one, chunked)
    assert all(same_selection(a, b) for a, b in zip(one_shot.record.indices, long_chunk.record.indices, strict=True))
    assert one_shot.record.kept == long_chunk.record.kept


@pytest.mark.parametrize("name", ["snapkv", "adakv"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3", "phi3"])
def test_the_cache_never_holds_more_than_budget_window_and_chunk(arch: str, name: str) -> None:
    model = model_of(arch)
    ids = ids_of()
    logits, compressor, peaks = run(model, get_policy(name, window=WINDOW), ids, CHUNK)
    full_layers = [n for n in range(len(compressor.layers)) if n not in compressor.windowed]
    assert full_layers and set(full_layers) <= set(peaks)
    for layer in full_layers:
        assert BUDGET < peaks[layer] <= BUDGET + WINDOW + CHUNK, (layer, peaks[layer])
        assert compressor.chunked.peak_tokens[layer] == peaks[layer]
    record = compressor.record
    assert record.prompt_length == PROMPT and torch.isfinite(logits).all()
    for layer in full_layers:  # kept tokens are prompt positions, the prompt's last window among them per head
        kept = record.indices[layer]
        per_head = kept.per_head() if isinstance(kept, HeadSelection) else list(kept[0])
        for positions in per_head:
            assert torch.equal(positions[-WINDOW:], torch.arange(PROMPT - WINDOW, PROMPT))
            assert positions.unique().numel() == positions.numel() and int(positions.max()) < PROMPT
        if name == "adakv":
            assert isinstance(kept, HeadSelection) and abs(kept.total - 2 * BUDGET) <= 2
        else:
            assert kept.shape[-1] == BUDGET
    _, _, one_peaks = run(model, get_policy(name, window=WINDOW), ids, None)
    assert max(one_peaks[n] for n in full_layers) == PROMPT  # what chunking saves: the whole prompt at once


def test_varlen_layout_and_quantized_storage_act_on_the_last_chunk() -> None:
    model = tiny_model("llama", attn="eager")
    ids = ids_of()
    _, varlen, peaks = run(model, get_policy("adakv", window=WINDOW), ids, CHUNK, layout="varlen")
    assert max(peaks.values()) <= BUDGET + WINDOW + CHUNK
    assert all(type(s).__name__ == "LayerSize" for s in varlen.record.sizes)
    quantization = Quantization("hqq", nbits=4, group_size=16)
    logits, quantized, peaks = run(model, get_policy("snapkv", window=WINDOW), ids, CHUNK, quantization=quantization)
    plain, unquantized, _ = run(model, get_policy("snapkv", window=WINDOW), ids, CHUNK)
    assert max(peaks.values()) <= BUDGET + WINDOW + CHUNK
    assert all(torch.equal(a, b) for a, b in zip(quantized.record.indices, unquantized.record.indices, strict=True))
    assert sum(s.allocated_bytes for s in quantized.record.sizes) < sum(
        s.allocated_bytes for s in unquantized.record.sizes
    )
    assert torch.isfinite(logits).all() and not torch.equal(logits, plain)


def test_both_protocols_chunk_the_compressed_part_and_a_ratio_budget_counts_the_whole_prompt() -> None:
    model = tiny_model("llama", attn="eager")
    prompt = PromptTokens(ids_of(140), ids_of(20, seed=2))
    for protocol, compressed in (("query_aware", 160), ("query_agnostic", 140)):
        with torch.no_grad(), compress(model, get_policy("snapkv", window=WINDOW), 0.25) as compressor:
            enable_chunked_prefill(compressor, CHUNK)
            cache, _, kept = prefill(model, prompt, protocol, compressor)
        assert compressor.record.prompt_length == compressed
        assert kept == int(0.25 * compressed)
        assert cache.get_seq_length() == kept + (20 if protocol == "query_agnostic" else 0)


def test_what_cannot_be_chunked_is_refused_by_name() -> None:
    model = tiny_model("llama", attn="eager")
    refusals = [
        (get_policy("h2o", window=WINDOW), CHUNK, None, "every query of the whole prompt"),
        (get_policy("kvzip"), CHUNK, None, "a scoring pass"),
        (get_policy("snapkv", window=WINDOW, gqa="expand"), CHUNK, None, "gqa='expand'"),
        (get_policy("snapkv", window=WINDOW), WINDOW, None, "longer than the window"),
        (get_policy("snapkv", window=WINDOW), 0, None, "prefill_chunk=0"),
        (get_policy("snapkv", window=WINDOW), CHUNK, DecodeEviction(64, 4), "decode-time eviction"),
    ]
    for policy, chunk, eviction, message in refusals:
        with (
            compress(model, policy, BUDGET, decode_eviction=eviction) as compressor,
            pytest.raises((ValueError, NotImplementedError), match=re.escape(message)),
        ):
            enable_chunked_prefill(compressor, chunk)


def test_a_chunked_run_states_its_chunk_and_resumes(tmp_path, capsys) -> None:
    from hydra import compose, initialize_config_dir

    from restkv.eval.harness.runner import RunSettings, run_benchmark
    from restkv.eval.run import CONFIGS

    overrides = [
        "bench=micro",
        "bench.lengths=[1024]",
        "bench.samples=2",
        "bench.tasks=[passkey]",
        "budget=128",
        "compression.prefill_chunk=256",
    ]

    def run_limit(limit: int) -> dict:
        with initialize_config_dir(config_dir=CONFIGS, version_base=None):
            cfg = compose(config_name="config", overrides=[*overrides, f"limit={limit}", f"out_dir={tmp_path}"])
        return run_benchmark(cfg, RunSettings("micro", "micro-llama", "snapkv", overrides, tmp_path))

    first = run_limit(1)
    assert first["prefill_chunk"] == 256
    summary = run_limit(2)
    assert "1 of 2 samples already done" in capsys.readouterr().out
    (predictions,) = tmp_path.rglob("predictions.jsonl")
    records = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert len(records) == summary["ran"]["samples"] == 2
    assert all(r["prefill_chunk"] == 256 and r["kept_tokens"] <= 128 for r in records)
    assert summary["prefill_chunk"] == 256


def test_the_setting_is_checked_before_any_work() -> None:
    from restkv.eval.harness.settings import CHECKS, Settings

    assert Settings.of({}).compression.prefill_chunk is None
    CHECKS["compression"]({"prefill_chunk": None})
    assert Settings.of({"compression": {"prefill_chunk": 512}}).compression.prefill_chunk == 512
    for bad in (0, -4, 1.5, "512", True):
        with pytest.raises(ValueError, match=r"compression\.prefill_chunk"):
            CHECKS["compression"]({"prefill_chunk": bad})


def test_the_latency_mode_measures_one_shot_against_chunked(tmp_path) -> None:
    from restkv.eval.latency.cli import run as run_latency
    from restkv.eval.latency.settings import Settings

    settings = Settings(
        name="chunked-test",
        shape="tiny-llama",
        mode="chunked",
        device="cpu",
        threads=1,
        contexts=[512],
        policies=["full", "snapkv"],
        budgets=[64],
        prefill_chunks=[128],
        warmup=0,
        repeats=1,
        out_dir=str(tmp_path),
    )
    record = run_latency(settings, "test")
    by_mode = {(e["policy"], e["chunk"]): e for e in record["entries"]}
    assert set(by_mode) == {("full", None), ("snapkv", None), ("snapkv", 128)}
    window = get_policy("snapkv").window
    assert by_mode[("snapkv", None)]["kv_peak_tokens"] == by_mode[("full", None)]["kv_peak_tokens"] == 512
    assert 64 < by_mode[("snapkv", 128)]["kv_peak_tokens"] <= 64 + window + 128
    assert all(e["ttft_seconds"] > 0 and e["peak_bytes"] >= 0 and not e["oom"] for e in record["entries"])
    table = (tmp_path / "chunked-test.md").read_text()
    assert "| 512 | snapkv | 64 | chunk 128 |" in table and (tmp_path / "chunked-test.png").stat().st_size > 1000
