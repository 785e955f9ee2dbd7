"""The decode step a GPU records and replays (`restkv.decoding.static_decoder`), run eagerly on a CPU.

``decode=static`` runs exactly the step function a CUDA graph records (static-shape layers, tokens,
positions, the stop flag and the write index on the device, decoders kept per signature), with the
``exact`` attention kernel on a CPU: its answers must be the eager loop's, token for token, for every
architecture, layout, policy family and protocol. The recorded kernels (``masked`` everywhere,
``flash`` on CUDA) are checked against the eager loop's logits.
"""

from __future__ import annotations

import pytest
import torch
from conftest import attention_reader
from transformers import DynamicCache

import restkv.decoding.static_decoder as graphs
import restkv.eval.evaluation.decoding as decoding
from restkv import compress
from restkv.decoding.static_layers import StaticLayer, flash_static_attention, masked_static_attention, static_layer
from restkv.eval.evaluation.decoding import answer, check_decode
from restkv.eval.evaluation.prompting import PromptTokens
from restkv.registry import get_policy
from restkv.storage.quantize import Quantization

ARCHS = ("llama", "mistral", "qwen2", "qwen3")
PROMPT = PromptTokens(context=[i * 7 % 120 + 3 for i in range(220)], query=[7, 9, 11, 13])
CASES = [  # (policy, knobs, layout)
    ("snapkv", {}, "auto"),
    ("pyramidkv", {}, "auto"),
    ("restkv", {"gqa": "expand"}, "auto"),
    ("adakv", {}, "auto"),  # head-wise: varlen
    ("adakv", {}, "masked"),
    ("full", {}, "auto"),
    ("cam", {}, "auto"),
]


def decoded(model, policy, layout: str, protocol: str, decode: str, eos: set[int], steps: int = 12):
    with compress(model, policy, 64, layout=layout) as compressor:
        return answer(model, PROMPT, compressor, protocol, steps, eos, decode)


@pytest.mark.parametrize("protocol", ["query_aware", "query_agnostic"])
@pytest.mark.parametrize(("name", "knobs", "layout"), CASES)
@pytest.mark.parametrize("arch", ARCHS)
def test_the_static_step_answers_as_the_eager_loop(make_model, arch, name, knobs, layout, protocol):
    model = make_model(arch)
    policy = get_policy(name, window=8, **knobs)
    eager = decoded(model, policy, layout, protocol, "eager", set())
    static = decoded(model, policy, layout, protocol, "static", set())
    assert static.decode_path == "static" and eager.decode_path == "eager"
    assert static.tokens == eager.tokens and static.decode_steps == eager.decode_steps == 11
    eos = {eager.tokens[5]}  # an EOS met mid-answer: the same cut, the same steps run
    cut = decoded(model, policy, layout, protocol, "eager", eos)
    assert decoded(model, policy, layout, protocol, "static", eos).tokens == cut.tokens


@pytest.mark.parametrize("every", [1, 4])
def test_the_stop_flag_is_read_at_the_eager_loops_steps(make_model, monkeypatch, every):
    monkeypatch.setitem(decoding.STOP_CHECK_STEPS, "cpu", every)  # every=4: a GPU's delayed check
    model = make_model("llama")
    free = decoded(model, get_policy("snapkv", window=8), "auto", "query_aware", "eager", set(), 24)
    eos = {free.tokens[9]}
    runs = [
        decoded(model, get_policy("snapkv", window=8), "auto", "query_aware", d, eos, 24) for d in ("eager", "static")
    ]
    assert runs[0].tokens == runs[1].tokens and runs[0].decode_steps == runs[1].decode_steps


def test_decoders_are_kept_per_signature_and_reused(make_model):
    graphs._DECODERS.clear()
    model = make_model("llama")
    policy = get_policy("snapkv", window=8)
    first = decoded(model, policy, "auto", "query_aware", "static", set())
    assert len(graphs._DECODERS) == 1
    (decoder,) = graphs._DECODERS.values()
    buffers = [layer.keys.data_ptr() for layer in decoder.cache.layers]
    again = decoded(model, policy, "auto", "query_aware", "static", set())  # same shapes: same buffers
    assert again.tokens == first.tokens and len(graphs._DECODERS) == 1
    assert [layer.keys.data_ptr() for layer in decoder.cache.layers] == buffers
    decoded(model, get_policy("full"), "auto", "query_aware", "static", set())  # another capacity
    decoded(model, policy, "auto", "query_aware", "static", set(), steps=100)  # another answer length bucket
    assert len(graphs._DECODERS) == graphs.KEPT_DECODERS


def test_auto_decodes_eagerly_on_a_cpu_and_what_has_no_static_form(make_model):
    model = make_model("llama")
    assert decoded(model, get_policy("snapkv", window=8), "auto", "query_aware", "auto", set()).decode_path == "eager"
    quantization = Quantization(backend="hqq", nbits=4, group_size=16, residual_length=8)
    policy = get_policy("snapkv", window=8)
    refused = pytest.raises(NotImplementedError, match=r"decode=static: .*QuantizedLayer has no static form")
    with compress(model, policy, 64, quantization=quantization) as compressor, refused:
        answer(model, PROMPT, compressor, "query_aware", 4, set(), "static")
    with pytest.raises(ValueError, match=r"decode=graph records the decode step as a CUDA graph; .* 'cpu'"):
        check_decode("graph", torch.device("cpu"))
    with pytest.raises(ValueError, match=r"decode='fast' is not allowed; choose one of: auto, eager, static, graph"):
        check_decode("fast", torch.device("cpu"))


def _static_layers(model, policy, layout: str, steps: int = 3) -> tuple[list[StaticLayer], torch.Tensor]:
    """The static layers of a prefilled cache (with ``steps`` free slots) and a query for their width."""
    ids = torch.tensor([PROMPT.context])
    with compress(model, policy, 64, layout=layout), torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, cache=cache)
    layers = [static_layer(layer, 256) for layer in cache.layers]
    query = torch.randn(1, model.config.num_attention_heads, 1, model.config.head_dim, generator=_seed())
    return layers, query


def _seed() -> torch.Generator:
    return torch.Generator().manual_seed(3)


def _reference(query: torch.Tensor, layer: StaticLayer, scaling: float) -> torch.Tensor:
    """Attention of ``query`` over each head's filled, visible slots, one head at a time (restated independently)."""
    heads, stored = query.shape[1], layer.heads
    outputs = []
    for head in range(heads):
        kv = head // (heads // stored)
        visible = torch.arange(layer.capacity) < layer.lengths[0, kv]
        if layer.visible is not None:
            visible &= layer.visible[0, head if layer.visible.shape[1] == heads else kv]
        weights = ((layer.keys[0, kv, visible] @ query[0, head, 0]) * scaling).softmax(-1)
        outputs.append(weights @ layer.values[0, kv, visible])
    return torch.stack(outputs)[None, None]


@pytest.mark.parametrize(
    ("name", "layout"), [("snapkv", "auto"), ("adakv", "auto"), ("adakv", "masked"), ("full", "auto")]
)
def test_the_recorded_kernels_compute_attention_over_the_filled_slots(make_model, name, layout):
    model = make_model("qwen3")
    layers, query = _static_layers(model, get_policy(name, window=8), layout)
    for layer in layers:
        expected = _reference(query, layer, 0.25)
        torch.testing.assert_close(masked_static_attention(query, layer, 0.25), expected, rtol=1e-5, atol=1e-6)
        if layer.visible is None:  # the flash path's packing, against varlen_attn's documented contract
            got = flash_static_attention(query, layer, 0.25, function=_varlen_attn_contract)
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def _varlen_attn_contract(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, scale, seqused_k, enable_gqa=False):
    """``torch.nn.attention.varlen.varlen_attn`` as documented, for one query token per sequence: sequence ``i``'s
    queries ``q[cu_seq_q[i]:cu_seq_q[i+1]]`` attend to the first ``seqused_k[i]`` of its keys
    ``k[cu_seq_k[i]:cu_seq_k[i+1]]``; a sequence's query heads share its key heads (here one: ``enable_gqa``)."""
    assert enable_gqa == (q.shape[1] != k.shape[1]), "varlen_attn needs enable_gqa for fewer key than query heads"
    out = torch.empty_like(q)
    for i in range(len(cu_seq_q) - 1):
        start, used = int(cu_seq_k[i]), int(seqused_k[i])
        keys, values = k[start : start + used, 0], v[start : start + used, 0]  # [n, d]
        for t in range(int(cu_seq_q[i]), int(cu_seq_q[i + 1])):
            weights = ((q[t] @ keys.T) * scale).softmax(-1)  # [heads, n]
            out[t] = weights @ values
    return out


def test_a_static_layer_grows_each_head_in_place():
    layer = StaticLayer(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4), capacity=8, lengths=[3, 5])
    before = layer.keys.data_ptr()
    new = torch.randn(1, 2, 1, 4)
    with attention_reader():
        layer.update(new, new)
    assert layer.lengths.tolist() == [[4, 6]] and layer.keys.data_ptr() == before
    assert torch.equal(layer.keys[0, 0, 3], new[0, 0, 0]) and torch.equal(layer.keys[0, 1, 5], new[0, 1, 0])
    assert layer.head_tokens == 10 and layer.filled_tokens == 6


@pytest.mark.parametrize(
    ("name", "layout"), [("snapkv", "auto"), ("adakv", "auto"), ("adakv", "masked"), ("full", "auto")]
)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_static_step_answers_as_the_eager_loop_under_eager_attention(make_model, arch, name, layout):
    model = make_model(arch, attn="eager")
    policy = get_policy(name, window=8)
    eager = decoded(model, policy, layout, "query_aware", "eager", set())
    assert decoded(model, policy, layout, "query_aware", "static", set()).tokens == eager.tokens


def test_a_run_records_its_decode_path_and_predicts_the_same(tmp_path):
    """``eval/run.py``: ``decode`` is not part of the identity (one folder), predictions are equal timing aside."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from restkv.eval.harness.run_folder import TIMING_FIELDS

    root = Path(__file__).resolve().parents[1]
    base = [sys.executable, "eval/run.py", "bench=micro", "bench.lengths=[1024]", "limit=3", "budget=64"]
    records, folders = {}, set()
    for decode in ("eager", "static"):
        out = tmp_path / decode
        run = subprocess.run([*base, f"decode={decode}", f"out_dir={out}"], cwd=root, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-2000:]
        (metrics,) = out.rglob("metrics.json")
        summary = json.loads(metrics.read_text())["decode"]
        assert summary["setting"] == decode and summary["paths"] == {decode: 3}
        lines = (metrics.parent / "predictions.jsonl").read_text().splitlines()
        records[decode] = [{k: v for k, v in json.loads(line).items() if k not in TIMING_FIELDS} for line in lines]
        folders.add(metrics.parent.relative_to(out))
    assert records["eager"] == records["static"]
    assert len(folders) == 1  # decode is not in the folder's name
