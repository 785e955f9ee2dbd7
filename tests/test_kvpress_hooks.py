"""kvpress presses on the hooks route (`restkv.interop.press_hooks`): kvpress's own hooks around our prefill.

Each press of `HOOKED` runs on the micro model (CI's kvpress leg; skipped without kvpress; those that load
per-model files in tests/test_kvpress_hub_presses.py, from a local hub cache): the prefill is compressed
by the press (KVzip-style presses mask head-wise, the others shrink the cache), decoding goes on over what
it left, and the record says what was kept and which route ran.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import prefill_and_decode
from transformers import AutoModelForCausalLM, DynamicCache

from restkv.integrate import compress
from restkv.interop.kvpress_policy import KVPressPolicy
from restkv.interop.press_catalogue import FILE_HOOKED
from restkv.interop.press_hooks import DECODING, HOOKED, HOOKED_WRAPPERS, SIZED, press_hooks
from restkv.select import Budget

MICRO = Path(__file__).resolve().parents[1] / "models" / "micro-llama"
LENGTH, BUDGET, STEPS = 200, 100, 6


@pytest.fixture(scope="module")
def model():
    pytest.importorskip("kvpress", reason="kvpress is not installed (CI's kvpress leg)")
    return AutoModelForCausalLM.from_pretrained(MICRO, dtype=torch.float32, attn_implementation="sdpa").eval()


def knobs_for(press: str) -> dict:
    knobs: dict = {"press": press}
    if press in HOOKED_WRAPPERS:
        knobs["inner"] = "KnormPress"
    if "chunk_size" in HOOKED[press]:
        knobs["chunk_size"] = 64
    if "compression_interval" in HOOKED[press]:
        knobs["compression_interval"] = 4
    return knobs


def run(model, policy: KVPressPolicy):
    ids = torch.randint(3, 8000, (1, LENGTH), generator=torch.Generator().manual_seed(0))
    record, cache, logits, _ = prefill_and_decode(model, policy, BUDGET, ids, STEPS)
    return record, cache, logits


MORE = (
    "KVComposePress",
    "FinchPress",
    "ThinKPress",
    "SimLayerKVPress",
    "PerLayerCompressionPress",
    "ComposedPress",
    "DMSPress",
)
"""Hooked presses that need settings of their own (or the question): tests/test_kvpress_more_presses.py runs them."""


@pytest.mark.parametrize("press", sorted(set(HOOKED) - set(FILE_HOOKED) - set(MORE)))
def test_every_hooked_press_runs_and_says_its_route(model, press: str) -> None:
    policy = KVPressPolicy(**knobs_for(press))
    assert policy.route == "kvpress_hooks" and not policy.evicts
    record, cache, logits = run(model, policy)
    assert torch.isfinite(logits).all()
    assert record.notes["kvpress_route"] == "kvpress_hooks" and record.prompt_length == LENGTH
    lengths = [layer.keys.shape[2] for layer in cache.layers]
    if press in SIZED:  # the prompt whole, then cut to the budget every 4 decoding steps
        assert record.kept == [LENGTH] * 4 and lengths == [BUDGET + STEPS % 4] * 4
    elif press in DECODING:  # cut at the budget's ratio every 4 decoding steps
        assert record.kept == [LENGTH] * 4 and all(length < LENGTH for length in lengths)
    elif record.notes["kvpress_cache"] == "masked":  # kvpress masks head-wise: the cache keeps its length
        assert lengths == [LENGTH + STEPS] * 4
        assert sum(sum(heads) for heads in record.head_lengths) == 4 * 2 * BUDGET
    else:
        assert record.kept == [BUDGET] * 4 and lengths == [BUDGET + STEPS] * 4


def test_a_hooked_decoding_press_refuses_a_fractional_budget(model) -> None:
    policy = KVPressPolicy(**knobs_for("DecodingPress"))
    ids = torch.randint(3, 8000, (1, LENGTH), generator=torch.Generator().manual_seed(0))
    with press_hooks(model, policy, Budget(0.5)), pytest.raises(ValueError, match="give budget as tokens"):
        model(input_ids=ids, cache=DynamicCache(config=model.config))


def test_the_runner_records_and_metrics_say_the_route(model, tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir

    from restkv.eval.harness.runner import RunSettings, run_benchmark
    from restkv.eval.run import CONFIGS

    overrides = ["model=micro-llama", "bench=micro", "bench.lengths=[512]", "bench.samples=1", "bench.tasks=[passkey]"]
    overrides += ["policy=kvpress", "policy.press=KVzipPress", "budget=128"]
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=[*overrides, f"out_dir={tmp_path}"])
    metrics = run_benchmark(cfg, RunSettings("micro", "micro-llama", "kvpress", overrides, tmp_path))
    assert metrics["cache"]["kvpress_route"] == "kvpress_hooks" and metrics["cache"]["kvpress_cache"] == ["masked"]
    record = json.loads(next(tmp_path.rglob("predictions.jsonl")).read_text().splitlines()[0])
    assert record["kvpress_route"] == "kvpress_hooks" and record["kept_tokens"] == 128


def test_chunked_prefill_refuses_the_hooks_route(model) -> None:
    """kvpress's hooks compress at the end of the first forward from an empty cache: a first chunk is not the
    prompt, so chunked prefill refuses the route by name before any work."""
    from restkv.chunked_prefill import enable_chunked_prefill

    policy = KVPressPolicy(**knobs_for("KVzipPress"))
    with compress(model, policy, budget=BUDGET) as compressor, pytest.raises(NotImplementedError, match="KVzipPress"):
        enable_chunked_prefill(compressor, 128)
