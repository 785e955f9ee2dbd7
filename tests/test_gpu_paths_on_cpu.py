"""The code paths written for GPUs, checked on a CPU: the device-side decode loop, the bounded decode
reserve, fidelity references in bounded host memory, ``model.device_map`` and untimed evictions."""

from __future__ import annotations

import pytest
import torch
from conftest import attention_reader
from transformers import DynamicCache

import restkv.eval.evaluation.decoding as generation
from restkv import compress
from restkv.cache import DECODE_RESERVE_CHUNK, CompressedLayer
from restkv.eval.evaluation import fidelity
from restkv.eval.evaluation.decoding import answer
from restkv.eval.evaluation.prompting import PromptTokens
from restkv.eval.harness.identity import run_identity
from restkv.eval.models.loading import load_model
from restkv.eval.models.placement import check_device_map
from restkv.eval.models.spec import ModelSpec
from restkv.registry import get_policy

CPU = torch.device("cpu")


def reference_answer(model, prompt: PromptTokens, budget: int, max_new_tokens: int, eos: set[int]) -> list[int]:
    """Greedy decoding as the harness did before tokens stayed on the device: a host read per step."""
    with compress(model, get_policy("snapkv"), budget) as compressor, torch.no_grad():
        compressor.reserve_decode(max_new_tokens)
        cache = DynamicCache(config=model.config)
        ids = prompt.context + prompt.query
        logits = model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True).logits[0, -1]
        tokens: list[int] = []
        for step in range(max_new_tokens):
            token = int(logits.argmax())
            if token in eos:
                break
            tokens.append(token)
            if step + 1 < max_new_tokens:
                position = torch.tensor([[len(ids) + step]])
                out = model(input_ids=torch.tensor([[token]]), cache=cache, position_ids=position)
                logits = out.logits[0, -1]
    return tokens


@pytest.mark.parametrize("every", [1, 4])
def test_device_side_decoding_gives_the_same_tokens(make_model, monkeypatch, every):
    model = make_model("llama")
    prompt = PromptTokens(context=[i % 120 + 3 for i in range(200)], query=[7, 9, 11])
    free_run = reference_answer(model, prompt, 64, 24, set())
    eos = {free_run[9]}  # an EOS the answer meets at step 9 (or earlier, if that token repeats)
    expected = reference_answer(model, prompt, 64, 24, eos)
    assert len(expected) < 24
    monkeypatch.setitem(generation.STOP_CHECK_STEPS, "cpu", every)  # every=4: a GPU's delayed stop check
    with compress(model, get_policy("snapkv"), 64) as compressor:
        got = answer(model, prompt, compressor, "query_aware", 24, eos)
        unstopped = answer(model, prompt, compressor, "query_aware", 24, set())
    assert got.tokens == expected
    assert unstopped.tokens == free_run and unstopped.decode_steps == 23
    assert len(expected) <= got.decode_steps < len(expected) + every


def test_the_decode_reserve_is_capped_and_grows_by_chunks():
    keys, values = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    layer = CompressedLayer(keys, values, reserve=3)
    grown = []
    for _ in range(8):
        layer.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
        grown.append(layer.capacity)
    assert grown == [8, 8, 8, 12, 12, 12, 12, 16]  # 5 + 3, then 3 more each time it fills
    assert layer.keys.shape[2] == 13 and torch.equal(layer.keys[:, :, :5], keys)


def test_a_long_generation_preallocates_one_chunk(make_model):
    model = make_model("llama")
    with compress(model, get_policy("snapkv"), 48) as compressor, torch.no_grad():
        compressor.reserve_decode(30_000)
        model(input_ids=torch.arange(100)[None], cache=DynamicCache(config=model.config))
    assert all(size.reserve_bytes == 2 * 2 * 16 * 4 * DECODE_RESERVE_CHUNK for size in compressor.record.sizes)


def test_untimed_eviction_reports_no_seconds(make_model):
    model = make_model("llama")
    with compress(model, get_policy("snapkv"), 48) as compressor, torch.no_grad():
        model(input_ids=torch.arange(100)[None], cache=DynamicCache(config=model.config))
    assert compressor.record.eviction_seconds is None


def test_fidelity_references_stay_in_bounded_host_memory(monkeypatch):
    cached = fidelity.OrderedDict()
    reference = (torch.zeros(10, 100), [1], [2])  # 4,000 bytes each
    for index in range(7):
        fidelity._remember(cached, index, reference, limit=10_000)
    assert list(cached) == [5, 6]  # the oldest dropped first, two fit
    fidelity._remember(cached, "huge", (torch.zeros(100, 100), [1], [2]), limit=10_000)
    assert "huge" not in cached


def test_fidelity_keeps_references_on_the_host(make_model, tmp_path):
    from restkv.eval.benchmarks.contract.sample import Sample
    from restkv.eval.evaluation.base import Session

    class Tokenizer:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) % 128 for c in text]}

        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(97 + i % 26) for i in ids)

    model = make_model("llama")
    prompt = PromptTokens(context=[i % 120 + 3 for i in range(150)], query=[5])
    sample = Sample(id="a", task="t", context="c", question="q", references=["answer"], max_new_tokens=4, metric="m")
    with compress(model, get_policy("snapkv"), 48) as compressor:
        session = Session(model, Tokenizer(), compressor, "query_aware", set())
        record = fidelity.Fidelity(tokens=3).evaluate(None, session, sample, prompt)
    stored = fidelity._FULL_CACHE_REFERENCES[model]
    assert record["kl"] > 0 and len(stored) == 1
    assert all(entry[0].device.type == "cpu" for entry in stored.values())
    assert fidelity.reference_bytes(model) == 7 * 128 * 4  # " answer": 7 tokens x vocab 128, float32


def test_device_map_loads_where_asked_and_is_not_identity():
    spec = ModelSpec(name="t", path="models/tiny-random-llama", dtype="float32", random_init=True)
    mapped = ModelSpec(**{**spec.__dict__, "device_map": "cpu"})
    a, b = load_model(spec, CPU), load_model(mapped, CPU)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    identity = run_identity({"model": {"name": "t", "device_map": "auto"}, "budget": 1}, None)
    assert identity["config"]["model"] == {"name": "t"}


def test_device_map_auto_needs_gpus():
    spec = ModelSpec(name="t", path="models/tiny-random-llama", random_init=True, device_map="auto")
    with pytest.raises(ValueError, match=r"model.device_map=auto splits the model over GPUs and this run's device"):
        check_device_map(spec.device_map, CPU)


@pytest.mark.parametrize("value", ["gpu", "cuda:x", ""])
def test_a_bad_device_map_is_named(value):
    with pytest.raises(ValueError, match=rf"model.device_map={value!r} is not allowed; use null, auto"):
        ModelSpec(name="t", path="models/tiny-random-llama", device_map=value)


def test_flash_attention_3_is_refused_as_untested():
    with pytest.raises(ValueError, match=r"flash_attention_3' is not supported: no test runs it"):
        ModelSpec(name="t", path="models/tiny-random-llama", attn_implementation="flash_attention_3")


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_static_shape_cache_decodes_as_the_dynamic_one(make_model, arch, attn):
    from restkv.decoding.static_layers import StaticLayer, to_static
    from restkv.eval.latency.timing import decode, decode_static, forward
    from restkv.storage.layouts import layer_size

    model = make_model(arch, attn=attn)
    ids = torch.randint(0, 128, (1, 300), generator=torch.Generator().manual_seed(0))
    runs = []
    for static in (False, True):
        with compress(model, get_policy("snapkv"), 64, decode_reserve=8), torch.no_grad():
            cache = DynamicCache(config=model.config)
            logits = [forward(model, ids, cache, 0)]
            if static:
                cache = to_static(cache, 8)
                assert all(isinstance(layer, StaticLayer) for layer in cache.layers)
                assert layer_size(cache.layers[0]).logical_bytes == 2 * 64 * 16 * 4 * 2  # kept tokens, not slots
            for step in range(6):
                logits.append(forward(model, logits[-1].argmax().view(1, 1), cache, 300 + step))
        runs.append(torch.stack(logits))
    torch.testing.assert_close(runs[1], runs[0], rtol=1e-5, atol=1e-5)
    with compress(model, get_policy("snapkv"), 64), torch.no_grad():  # the benchmark's loop runs on it too
        cache = DynamicCache(config=model.config)
        forward(model, ids, cache, 0)
        assert len(decode_static(model, to_static(cache, 5), 300, 1, 4)) == 4  # 1 warm-up + 4 steps fill it
        cache = DynamicCache(config=model.config)
        forward(model, ids, cache, 0)
        assert len(decode(model, cache, 300, 1, 4)) == 4


def test_a_static_layer_refuses_a_prefill():
    from restkv.decoding.static_layers import StaticLayer

    layer = StaticLayer(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4), spare=2)
    with pytest.raises(NotImplementedError, match="a static layer decodes one token a step; got 3"), attention_reader():
        layer.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))


def test_a_device_map_that_spills_off_the_gpus_is_refused(make_model):
    from restkv.eval.models.placement import dispatched

    with pytest.raises(ValueError, match=r"model.device_map=auto would put layers on cpu: the GPUs are too small"):
        dispatched(make_model("llama"), "auto")  # no GPU here: every layer would land on the CPU


def test_a_static_layer_is_read_only_by_restkv_attention(make_model):
    from restkv.decoding.static_layers import StaticLayer, to_static

    layer = StaticLayer(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4), spare=2)
    with pytest.raises(RuntimeError, match="only restkv's attention"):
        layer.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
    cache = DynamicCache(config=make_model("llama").config)
    cache.layers[0] = CompressedLayer(torch.randn(1, 4, 5, 4), torch.randn(1, 4, 5, 4), repeat=2)
    with pytest.raises(ValueError, match="layer 1: the layer holds no tokens yet"):
        to_static(cache, 2)
    assert cache.layers[0].repeat == 2  # gqa='expand': converted, incoming heads repeated as before


def test_static_decoding_leaves_the_host_count_right(make_model):
    from restkv.decoding.static_layers import to_static
    from restkv.eval.latency.timing import decode_static, forward

    model = make_model("llama")
    with compress(model, get_policy("snapkv"), 64), torch.no_grad():
        cache = DynamicCache(config=model.config)
        forward(model, torch.randint(0, 128, (1, 200), generator=torch.Generator().manual_seed(1)), cache, 0)
        static = to_static(cache, 6)
        decode_static(model, static, 200, 2, 4)
    assert all(layer.filled_tokens == 64 + 6 == int(layer.length) for layer in static.layers)


def test_latency_refuses_masked_caches_with_flash_attention():
    from restkv.eval.latency.settings import Settings

    with pytest.raises(ValueError, match=r"static need a per-slot mask, which attn_implementation=flash_attention_2"):
        Settings(name="x", shape="tiny-llama", attn_implementation="flash_attention_2", decode_caches=["static"])
