"""Eviction inside real (tiny, random-weight) transformers models of every supported class."""

from __future__ import annotations

import pytest
import torch
from conftest import attention_function
from transformers import DynamicCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from restkv import ReSTKV, compress, get_policy
from restkv.baselines import CAOTE, H2O, FullCache, PyramidKV, RandomEviction, SnapKV, StreamingLLM
from restkv.cache import CompressedLayer
from restkv.policy import Policy

ARCHS = ["llama", "mistral", "qwen2", "qwen3"]
PROMPT = 96
WINDOW = 8
BUDGET = 40


def policies() -> list[Policy]:
    return [
        ReSTKV(window=WINDOW),
        ReSTKV(window=WINDOW, gqa="expand"),
        ReSTKV(window=WINDOW, gqa="max", schedule="pyramid"),
        SnapKV(window=WINDOW),
        PyramidKV(window=WINDOW),
        H2O(window=WINDOW, max_elements=500),
        StreamingLLM(window=WINDOW),
        RandomEviction(window=WINDOW),
        get_policy("restkv_defensive", window=WINDOW),
        CAOTE(window=WINDOW),
    ]


def prompt(length: int = PROMPT, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 128, (1, length), generator=torch.Generator().manual_seed(seed))


def oracle_attention(kept: list[torch.Tensor], prompt_length: int):
    """Attention computed from scratch: causal, and rows past the prompt see only kept prompt keys."""

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        heads, length = query.shape[1], key.shape[2]
        key = key.repeat_interleave(heads // key.shape[1], dim=1)
        value = value.repeat_interleave(heads // value.shape[1], dim=1)
        logits = (query.float() @ key.float().transpose(-1, -2)) * scaling
        rows = torch.arange(query.shape[2]) + length - query.shape[2]
        allowed = torch.arange(length)[None, :] <= rows[:, None]  # causal [q, L]
        allowed = allowed.expand(heads, -1, -1).clone()
        selection = kept[module.layer_idx][0]  # [selection heads, keep]
        visible = torch.zeros(selection.shape[0], length, dtype=torch.bool)
        visible.scatter_(1, selection, True)
        visible[:, prompt_length:] = True
        visible = visible.repeat_interleave(heads // selection.shape[0], dim=0)  # [heads, L]
        decode_rows = rows >= prompt_length
        allowed[:, decode_rows] &= visible[:, None, :]
        weights = logits.masked_fill(~allowed, float("-inf")).softmax(-1)
        return (weights @ value.float()).to(query.dtype).transpose(1, 2).contiguous(), weights

    return attention


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("policy", policies(), ids=lambda p: f"{type(p).__name__}-{p.gqa}-{p.schedule}")
def test_decode_equals_attention_over_kept_tokens(arch: str, policy: Policy, make_model) -> None:
    model = make_model(arch, attn="sdpa")
    ids = prompt()
    cache = DynamicCache(config=model.config)
    with torch.no_grad(), compress(model, policy, BUDGET) as compressor:
        logits = model(ids, cache=cache).logits
        token = logits[:, -1:].argmax(-1)
        step = model(token, cache=cache, position_ids=torch.tensor([[PROMPT]])).logits[0, -1]
    record = compressor.record
    expected = [min(PROMPT, k) for k in policy_budgets(policy, model.config.num_hidden_layers)]
    assert record.kept == expected
    for layer, (indices, keep) in enumerate(zip(record.indices, expected, strict=True)):
        layer_cache = cache.layers[layer]
        assert isinstance(layer_cache, CompressedLayer)
        heads = model.config.num_attention_heads if policy.gqa == "expand" else model.config.num_key_value_heads
        assert layer_cache.keys.shape == (1, heads, keep + 1, 16)  # kept + the decoded token
        window = torch.arange(PROMPT - WINDOW, PROMPT)
        assert torch.equal(indices[0, :, -WINDOW:], window.expand(heads, -1))
        assert (indices[0].diff(dim=-1) > 0).all(), "kept positions must be distinct and ascending"

    with torch.no_grad(), attention_function("sdpa", oracle_attention(record.indices, PROMPT)):
        reference = model(torch.cat([ids, token], dim=1)).logits[0, -1]
    torch.testing.assert_close(step, reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize(
    "policy",
    [PyramidKV(window=WINDOW), ReSTKV(window=WINDOW, schedule="pyramid"), SnapKV(window=WINDOW)],
    ids=lambda p: f"{type(p).__name__}-{p.schedule}",
)
def test_several_tokens_after_eviction_see_kept_tokens_and_each_other_causally(
    arch: str, attn: str, policy: Policy, make_model
) -> None:
    """A multi-token step after eviction (teacher forcing, a question appended) gets a correct mask in
    every layer, also when layers keep different numbers of tokens (the model builds one mask from
    layer 0's length)."""
    model = make_model(arch, attn=attn)
    ids, extra = prompt(), prompt(5, seed=3)
    cache = DynamicCache(config=model.config)
    with torch.no_grad(), compress(model, policy, BUDGET) as compressor:
        model(ids, cache=cache)
        positions = torch.arange(PROMPT, PROMPT + 5)[None]
        step = model(extra, cache=cache, position_ids=positions).logits[0]
    assert len(set(compressor.record.kept)) > 1 or policy.schedule == "uniform"
    with torch.no_grad(), attention_function(attn, oracle_attention(compressor.record.indices, PROMPT)):
        reference = model(torch.cat([ids, extra], dim=1)).logits[0, -5:]
    torch.testing.assert_close(step, reference, rtol=1e-4, atol=1e-4)


def policy_budgets(policy: Policy, layers: int) -> list[int]:
    from restkv.select import Budget

    return [policy.layer_keep(PROMPT, Budget(BUDGET), layer, layers) for layer in range(layers)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_budget_at_least_prompt_changes_nothing(arch: str, dtype: torch.dtype, attn: str, make_model) -> None:
    model = make_model(arch, dtype=dtype, attn=attn)
    ids = prompt(40)
    full = model.generate(ids, max_new_tokens=6, do_sample=False, return_dict_in_generate=True)
    with compress(model, ReSTKV(window=WINDOW), budget=40):
        same = model.generate(ids, max_new_tokens=6, do_sample=False, return_dict_in_generate=True)
    assert torch.equal(full.sequences, same.sequences)
    for a, b in zip(full.cache.layers, same.cache.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_generate_inside_compression(arch: str, dtype: torch.dtype, attn: str, make_model) -> None:
    model = make_model(arch, dtype=dtype, attn=attn)
    with compress(model, ReSTKV(window=WINDOW), budget=BUDGET, decode_reserve=8) as compressor:
        out = model.generate(prompt(), max_new_tokens=5, do_sample=False, return_dict_in_generate=True)
    assert out.sequences.shape == (1, PROMPT + 5)
    assert compressor.record.kept == [BUDGET, BUDGET]
    assert all(layer.get_seq_length() == BUDGET + 4 for layer in out.cache.layers)
    assert all(torch.isfinite(layer.keys).all() for layer in out.cache.layers)


def test_full_cache_policy_keeps_everything(make_model) -> None:
    model = make_model()
    with compress(model, FullCache(window=WINDOW), budget=BUDGET) as compressor:
        out = model.generate(prompt(), max_new_tokens=2, do_sample=False, return_dict_in_generate=True)
    assert compressor.record.kept == [PROMPT, PROMPT]
    assert all(type(layer).__name__ == "DynamicLayer" for layer in out.cache.layers)


def test_question_appended_after_eviction_is_not_evicted(make_model) -> None:
    model = make_model()
    cache = DynamicCache(config=model.config)
    with torch.no_grad(), compress(model, SnapKV(window=WINDOW), budget=BUDGET):
        model(prompt(), cache=cache)
        model(prompt(10, seed=2), cache=cache, position_ids=torch.arange(PROMPT, PROMPT + 10)[None])
    assert cache.get_seq_length() == BUDGET + 10


def test_context_restores_attention_functions(make_model) -> None:
    model = make_model(attn="eager")
    before = dict(ALL_ATTENTION_FUNCTIONS._local_mapping)
    with compress(model, ReSTKV(window=WINDOW), budget=BUDGET):
        assert "eager" in ALL_ATTENTION_FUNCTIONS._local_mapping
    assert ALL_ATTENTION_FUNCTIONS._local_mapping == before
    assert not model.model.layers[0].self_attn._forward_hooks


def test_unsupported_model_class_is_rejected() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(ValueError, match="GPT2LMHeadModel is not supported; supported: LlamaForCausalLM"):
        compress(model, ReSTKV(), budget=64)


def test_budget_not_above_window_is_rejected(make_model) -> None:
    with pytest.raises(ValueError, match=r"budget=32 is not more than the window \(policy.window=32\)"):
        compress(make_model(), ReSTKV(window=32), budget=32)


def test_ratio_budget(make_model) -> None:
    model = make_model()
    with compress(model, SnapKV(window=WINDOW), budget=0.5) as compressor:
        model.generate(prompt(), max_new_tokens=1, do_sample=False)
    assert compressor.record.kept == [PROMPT // 2] * 2


def test_paused_compressor_keeps_the_full_cache(make_model) -> None:
    model = make_model()
    with compress(model, SnapKV(window=WINDOW), budget=BUDGET) as compressor:
        with compressor.paused():
            full = model.generate(prompt(), max_new_tokens=1, do_sample=False, return_dict_in_generate=True)
        evicted = model.generate(prompt(), max_new_tokens=1, do_sample=False, return_dict_in_generate=True)
    assert full.cache.get_seq_length() == PROMPT
    assert evicted.cache.get_seq_length() == BUDGET


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gemm_decode_kernel_matches_the_model_kernel(arch: str, attn: str, dtype: torch.dtype, make_model) -> None:
    model = make_model(arch, dtype=dtype, attn=attn)
    runs = {}
    for kernel in ("model", "gemm"):
        with compress(model, SnapKV(window=WINDOW), budget=BUDGET, decode_reserve=4, decode_kernel=kernel):
            runs[kernel] = model.generate(
                prompt(), max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True
            )
    assert torch.equal(runs["model"].sequences, runs["gemm"].sequences)
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    for a, b in zip(runs["model"].logits, runs["gemm"].logits, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=tolerance, atol=tolerance)


def test_unknown_decode_kernel_is_rejected(make_model) -> None:
    with pytest.raises(ValueError, match="decode_kernel='fast' is not allowed; choose one of: model, gemm"):
        compress(make_model(), ReSTKV(window=WINDOW), budget=BUDGET, decode_kernel="fast")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("gqa", ["mean", "expand"])
@pytest.mark.parametrize("name", ["knorm", "l2norm", "tova"])
def test_norm_and_last_query_policies_decode_over_their_kept_tokens(arch: str, gqa: str, name: str, make_model) -> None:
    """KNorm, L2Norm (no window reserved) and TOVA: the right counts, and decoding equals the oracle."""
    from restkv import get_policy

    model = make_model(arch)
    policy = get_policy(name, gqa=gqa, window=1 if name == "tova" else WINDOW)
    ids = prompt()
    cache = DynamicCache(config=model.config)
    with torch.no_grad(), compress(model, policy, BUDGET) as compressor:
        token = model(ids, cache=cache).logits[:, -1:].argmax(-1)
        step = model(token, cache=cache, position_ids=torch.tensor([[PROMPT]])).logits[0, -1]
    heads = model.config.num_attention_heads if gqa == "expand" else model.config.num_key_value_heads
    for indices in compressor.record.indices:
        assert indices.shape == (1, heads, BUDGET) and (indices[0].diff(dim=-1) > 0).all()
        if name == "tova":  # one choice for the whole layer, and the last token kept
            assert (indices[0] == indices[0, :1]).all() and (indices[0, :, -1] == PROMPT - 1).all()
    with torch.no_grad(), attention_function("sdpa", oracle_attention(compressor.record.indices, PROMPT)):
        reference = model(torch.cat([ids, token], dim=1)).logits[0, -1]
    torch.testing.assert_close(step, reference, rtol=1e-4, atol=1e-4)
