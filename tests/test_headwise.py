"""Head-wise budgets in real (tiny, random-weight) models: decoding over each head's kept tokens.

The oracle is computed here from scratch: a full forward over prompt + decoded tokens whose
attention lets each decoded row see, per head, only the prompt positions that head kept (from the
record), plus every decoded token. The compressed run must equal it for every layout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import attention_function
from transformers import DynamicCache

from restkv import ReSTKV, compress
from restkv.baselines import AdaKV, DefensiveKV, HeadKV, SnapKV
from restkv.cache import CompressedLayer
from restkv.policy import Policy
from restkv.stages.allocation import HeadSelection
from restkv.storage.layouts import MaskedLayer, VarlenLayer, layer_size

ARCHS = ["llama", "mistral", "qwen2", "qwen3"]
PROMPT, WINDOW, BUDGET, STEPS = 96, 8, 40, 3


def head_file(path: Path, layers: int = 2, heads: int = 4, seed: int = 0) -> str:
    """A HeadKV head file with random scores for the tiny models (layers x query heads)."""
    generator = torch.Generator().manual_seed(seed)
    scores = {
        f"{layer}-{head}": torch.rand(3, generator=generator).tolist()
        for layer in range(layers)
        for head in range(heads)
    }
    path.write_text(json.dumps(scores))
    return str(path)


def policies(tmp: Path) -> dict[str, Policy]:
    return {
        "adakv": AdaKV(window=WINDOW),
        "ada-restkv-expand": ReSTKV(window=WINDOW, gqa="expand", allocation="adakv"),
        "ada-pyramid-max": SnapKV(window=WINDOW, gqa="max", schedule="pyramid", allocation="adakv", floor=0.0),
        "headkv": HeadKV(window=WINDOW, head_scores=head_file(tmp / "heads.json")),
        "defensivekv": DefensiveKV(window=WINDOW),
        "layer-defensivekv": DefensiveKV(window=WINDOW, allocation="global"),
    }


POLICY_NAMES = ["adakv", "ada-restkv-expand", "ada-pyramid-max", "headkv", "defensivekv", "layer-defensivekv"]


def prompt(length: int = PROMPT, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 128, (1, length), generator=torch.Generator().manual_seed(seed))


def kept_per_head(selection: torch.Tensor | HeadSelection) -> list[torch.Tensor]:
    if isinstance(selection, HeadSelection):
        return selection.per_head()
    return list(selection[0])


def oracle_attention(record_indices: list, prompt_length: int):
    """Causal attention where rows past the prompt see, per head, the kept prompt keys only."""

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        heads, length = query.shape[1], key.shape[2]
        key = key.repeat_interleave(heads // key.shape[1], dim=1).float()
        value = value.repeat_interleave(heads // value.shape[1], dim=1).float()
        logits = (query.float() @ key.transpose(-1, -2)) * scaling
        rows = torch.arange(query.shape[2]) + length - query.shape[2]
        allowed = (torch.arange(length)[None, :] <= rows[:, None]).expand(heads, -1, -1).clone()
        per_head = kept_per_head(record_indices[module.layer_idx])
        visible = torch.zeros(len(per_head), length, dtype=torch.bool)
        for head, positions in enumerate(per_head):
            visible[head, positions] = True
        visible[:, prompt_length:] = True
        visible = visible.repeat_interleave(heads // len(per_head), dim=0)
        decode_rows = rows >= prompt_length
        allowed[:, decode_rows] &= visible[:, None, :]
        weights = logits.masked_fill(~allowed, float("-inf")).softmax(-1)
        return (weights @ value).to(query.dtype).transpose(1, 2).contiguous(), weights

    return attention


def oracle_logits(model, attn: str, indices: list, tokens: torch.Tensor, rows: int) -> torch.Tensor:
    with torch.no_grad(), attention_function(attn, oracle_attention(indices, PROMPT)):
        return model(tokens).logits[0, -rows:]


def decode(model, policy: Policy, layout: str = "auto", reserve: int = 0, steps: int = STEPS):
    """Prefill + ``steps`` greedy steps under compression; (all tokens, per-step logits, record, cache)."""
    ids = prompt()
    cache = DynamicCache(config=model.config)
    tokens, logits = ids, []
    with torch.no_grad(), compress(model, policy, BUDGET, decode_reserve=reserve, layout=layout) as compressor:
        last = model(ids, cache=cache).logits[0, -1]
        for step in range(steps):
            token = last.argmax().view(1, 1)
            tokens = torch.cat([tokens, token], dim=1)
            last = model(token, cache=cache, position_ids=torch.tensor([[PROMPT + step]])).logits[0, -1]
            logits.append(last)
    return tokens, torch.stack(logits), compressor.record, cache


@pytest.mark.parametrize("reserve", [0, 2], ids=["no-reserve", "reserve"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", POLICY_NAMES)
def test_decoding_over_a_varlen_cache_equals_the_oracle(
    name: str, arch: str, attn: str, reserve: int, make_model, tmp_path: Path
) -> None:
    model = make_model(arch, attn=attn)
    policy = policies(tmp_path)[name]
    tokens, logits, record, cache = decode(model, policy, reserve=reserve)
    assert any(lengths is not None and len(set(lengths)) > 1 for lengths in record.head_lengths), "not head-wise"
    for layer, lengths in enumerate(record.head_lengths):
        stored = cache.layers[layer]
        assert isinstance(stored, VarlenLayer)
        assert stored.lengths == [n + STEPS for n in lengths]
        heads = model.config.num_attention_heads if policy.gqa == "expand" else model.config.num_key_value_heads
        assert len(lengths) == heads
        # memory: what the heads keep, plus the reserve; a full reserve grows by another one
        spare = reserve - STEPS if reserve >= STEPS else reserve - (STEPS - reserve - 1) % (reserve + 1)
        assert layer_size(stored).allocated_bytes == (sum(lengths) + heads * (STEPS + spare)) * 16 * 4 * 2
        for positions in kept_per_head(record.indices[layer]):
            assert (positions.diff() > 0).all() and torch.equal(
                positions[-WINDOW:], torch.arange(PROMPT - WINDOW, PROMPT)
            )
    # the oracle: each step's logits from a full forward where decoded rows see only kept prompt tokens
    for step in range(STEPS):
        expected = oracle_logits(model, attn, record.indices, tokens[:, : PROMPT + step + 1], 1)[0]
        torch.testing.assert_close(logits[step], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_masked_layout_makes_the_same_decisions_and_logits(arch: str, attn: str, make_model, tmp_path: Path) -> None:
    model = make_model(arch, attn=attn)
    policy = AdaKV(window=WINDOW)
    tokens_v, logits_v, record_v, _ = decode(model, policy, layout="varlen", reserve=4)
    tokens_m, logits_m, record_m, cache_m = decode(model, policy, layout="masked", reserve=4)
    assert record_v.head_lengths == record_m.head_lengths
    assert torch.equal(tokens_v, tokens_m)
    torch.testing.assert_close(logits_v, logits_m, rtol=1e-4, atol=1e-4)
    full_bytes = (PROMPT + 4) * model.config.num_key_value_heads * 16 * 4 * 2
    for varlen, masked in zip(record_v.sizes, record_m.sizes, strict=True):
        assert masked.head_tokens == varlen.head_tokens  # same tokens kept...
        assert masked.allocated_bytes >= full_bytes > varlen.allocated_bytes  # ...the full cache's memory
    assert all(isinstance(layer, MaskedLayer) for layer in cache_m.layers)


@pytest.mark.parametrize("gqa", ["mean", "expand"])
def test_varlen_layout_of_a_uniform_selection_equals_the_dense_cache(gqa: str, make_model) -> None:
    model = make_model("mistral")
    policy = ReSTKV(window=WINDOW, gqa=gqa)
    tokens_d, logits_d, record_d, cache_d = decode(model, policy, layout="auto", reserve=2)
    tokens_v, logits_v, record_v, cache_v = decode(model, policy, layout="varlen", reserve=2)
    assert isinstance(cache_d.layers[0], CompressedLayer) and isinstance(cache_v.layers[0], VarlenLayer)
    assert torch.equal(tokens_d, tokens_v)
    torch.testing.assert_close(logits_d, logits_v, rtol=1e-5, atol=1e-5)
    assert [s.head_tokens for s in record_d.sizes] == [s.head_tokens for s in record_v.sizes]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_tokens_appended_after_a_headwise_eviction_see_each_other_causally(attn: str, make_model) -> None:
    """A multi-token step (a question appended after eviction) over varlen and masked layers."""
    model = make_model("qwen2", attn=attn)
    ids, extra = prompt(), prompt(5, seed=3)
    for layout in ("auto", "masked"):
        cache = DynamicCache(config=model.config)
        with torch.no_grad(), compress(model, AdaKV(window=WINDOW), BUDGET, layout=layout) as compressor:
            model(ids, cache=cache)
            step = model(extra, cache=cache, position_ids=torch.arange(PROMPT, PROMPT + 5)[None]).logits[0]
        expected = oracle_logits(model, attn, compressor.record.indices, torch.cat([ids, extra], dim=1), 5)
        torch.testing.assert_close(step, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["auto", "masked"])
def test_generate_over_a_headwise_cache_matches_our_decoding_loop(layout: str, make_model) -> None:
    model = make_model("llama")
    ids = prompt()
    tokens, _, _, _ = decode(model, AdaKV(window=WINDOW), layout=layout, reserve=2, steps=4)
    with torch.no_grad(), compress(model, AdaKV(window=WINDOW), BUDGET, layout=layout, decode_reserve=2):
        generated = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(generated, tokens)


def test_a_layer_built_by_hand_refuses_updates_without_restkv_attention() -> None:
    layer = VarlenLayer(torch.zeros(6, 4), torch.zeros(6, 4), [2, 4])
    with pytest.raises(RuntimeError, match="only restkv's attention function can read"):
        layer.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))


def test_a_headwise_cache_refuses_to_decode_outside_its_block(make_model) -> None:
    model = make_model("llama")
    cache = DynamicCache(config=model.config)
    with torch.no_grad(), compress(model, AdaKV(window=WINDOW), BUDGET):
        model(prompt(), cache=cache)
    with torch.no_grad(), pytest.raises(RuntimeError, match="head-wise compressed layers"):
        model(prompt(1), cache=cache, position_ids=torch.tensor([[PROMPT]]))


def test_masked_layout_needs_a_masked_kernel(make_model) -> None:
    model = make_model("llama")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="layout='masked' needs a masked attention kernel"):
        compress(model, AdaKV(window=WINDOW), BUDGET, layout="masked")
    with pytest.raises(
        ValueError, match=r"compress.layout='paged' is not allowed; choose one of: auto, varlen, masked"
    ):
        compress(make_model("llama"), AdaKV(window=WINDOW), BUDGET, layout="paged")


def fake_flash_varlen(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=None, causal=False):
    """flash_attn_varlen_func's contract, in plain torch: sequence i is rows cu[i]:cu[i+1]; a
    sequence's query heads share its key/value heads; causal alignment is bottom-right."""
    assert q.dtype == k.dtype and q.is_contiguous() and cu_q.dtype == cu_k.dtype == torch.int32
    out = torch.empty_like(q)
    for i in range(cu_q.numel() - 1):
        qs, ks, vs = q[cu_q[i] : cu_q[i + 1]], k[cu_k[i] : cu_k[i + 1]], v[cu_k[i] : cu_k[i + 1]]
        rep = qs.shape[1] // ks.shape[1]
        ks, vs = ks.repeat_interleave(rep, dim=1), vs.repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qs.float(), ks.float()) * softmax_scale
        if causal:
            n_q, n_k = qs.shape[0], ks.shape[0]
            scores = scores.masked_fill(~torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q), float("-inf"))
        out[cu_q[i] : cu_q[i + 1]] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vs.float()).to(q.dtype)
    return out


@pytest.mark.parametrize("new_tokens", [1, 3])
@pytest.mark.parametrize("reserve", [0, 5])
def test_flash_varlen_arguments_compute_the_reference_attention(new_tokens: int, reserve: int) -> None:
    """The flash path's packing (queries per key/value head, cumulative lengths, gaps compacted)
    checked against the reference path with a kernel that follows flash-attn's documented contract."""
    from restkv.storage.varlen import flash_attention, reference_attention

    generator = torch.Generator().manual_seed(0)
    lengths = [7, 12, 3, 9]
    keys = torch.randn(sum(lengths), 16, generator=generator)
    values = torch.randn(sum(lengths), 16, generator=generator)
    layer = VarlenLayer(keys, values, lengths, reserve=reserve, guard=lambda: None)  # updated by hand here
    layer.update(torch.randn(1, 4, 2, 16, generator=generator), torch.randn(1, 4, 2, 16, generator=generator))
    assert layer.has_gaps == (reserve > 2)
    query = torch.randn(1, 8, new_tokens, 16, generator=generator)
    expected = reference_attention(query, layer, 0.25)
    got = flash_attention(query, layer, 0.25, function=fake_flash_varlen)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def torch_varlen_new(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False):
    """PyTorch's ``varlen_attn`` as 2.13 documents it: causal is ``window_size=(-1, 0)``, fewer key/value heads than
    query heads need ``enable_gqa``."""
    assert enable_gqa == (q.shape[1] != k.shape[1]) and max_q == int((cu_q[1:] - cu_q[:-1]).max())
    return fake_flash_varlen(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scale, causal=window_size == (-1, 0))


def torch_varlen_old(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, return_aux=None, *, scale=None):
    """``varlen_attn`` as its first releases take it: an ``is_causal`` flag, key/value heads shared by query groups."""
    return fake_flash_varlen(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scale, causal=is_causal)


@pytest.mark.parametrize("new_tokens", [1, 3])
@pytest.mark.parametrize("kernel", [torch_varlen_new, torch_varlen_old])
def test_torch_varlen_arguments_compute_the_reference_attention(new_tokens: int, kernel) -> None:
    """``varlen_kernel='torch'``: PyTorch's own varlen kernel, called as each of its API generations takes it."""
    from restkv.storage.varlen import reference_attention, torch_attention

    generator = torch.Generator().manual_seed(1)
    lengths = [7, 12, 3, 9]
    keys = torch.randn(sum(lengths), 16, generator=generator)
    values = torch.randn(sum(lengths), 16, generator=generator)
    layer = VarlenLayer(keys, values, lengths, reserve=5, guard=lambda: None)
    layer.update(torch.randn(1, 4, 2, 16, generator=generator), torch.randn(1, 4, 2, 16, generator=generator))
    query = torch.randn(1, 8, new_tokens, 16, generator=generator)
    expected = reference_attention(query, layer, 0.25)
    torch.testing.assert_close(torch_attention(query, layer, 0.25, function=kernel), expected, rtol=1e-5, atol=1e-5)


def test_varlen_kernels_fall_back_in_order_and_refuse_where_they_cannot_run(monkeypatch) -> None:
    """``auto``: PyTorch's varlen kernel, then flash-attn, then the reference; a named kernel that cannot run is
    refused with what it needs."""
    from restkv.storage import varlen
    from restkv.storage.varlen import pick_kernel

    assert pick_kernel("auto", torch.zeros(1, 2, 1, 4)) == "reference"  # a CPU tensor: no fused kernel
    with pytest.raises(RuntimeError, match="varlen_kernel='flash' needs the flash_attn package and a CUDA"):
        pick_kernel("flash", torch.zeros(1, 2, 1, 4))
    with pytest.raises(RuntimeError, match=r"varlen_kernel='torch' needs PyTorch's varlen_attn \(PyTorch >= 2.9\)"):
        pick_kernel("torch", torch.zeros(1, 2, 1, 4))

    class CudaHalf:  # what pick_kernel reads of a query: where it is and its dtype
        is_cuda, dtype, device = True, torch.bfloat16, "cuda:0"

    for has_torch, has_flash, expected in [(True, True, "torch"), (False, True, "flash"), (False, False, "reference")]:
        monkeypatch.setattr(varlen, "torch_varlen", lambda has=has_torch: torch_varlen_new if has else None)
        monkeypatch.setattr(varlen, "flash_available", lambda has=has_flash: has)
        assert pick_kernel("auto", CudaHalf()) == expected


def test_head_file_must_match_the_model(make_model, tmp_path: Path) -> None:
    model = make_model("llama")
    wrong = HeadKV(window=WINDOW, head_scores=head_file(tmp_path / "h.json", layers=3, heads=4))
    with torch.no_grad(), compress(model, wrong, BUDGET), pytest.raises(ValueError, match="covers 3 layers x 4 heads"):
        model(prompt(), cache=DynamicCache(config=model.config))
    with pytest.raises(FileNotFoundError, match=r"head_scores='missing.json': no such file"):
        HeadKV(window=WINDOW, head_scores="missing.json")
    with pytest.raises(ValueError, match="allocation='headkv' needs head_scores"):
        ReSTKV(allocation="headkv")
    with pytest.raises(ValueError, match=r"schedule='pyramid' cannot apply"):
        HeadKV(head_scores=str(tmp_path / "h.json"), schedule="pyramid")
    (tmp_path / "bad.json").write_text('{"0-0": []}')
    with pytest.raises(ValueError, match="must map to a non-empty list of finite numbers >= 0"):
        from restkv.stages.allocation import load_head_scores

        load_head_scores(tmp_path / "bad.json", 1, 1)


@pytest.mark.parametrize("floor", [-0.1, 1.5, "high"])
def test_floor_outside_zero_one_is_refused(floor: object) -> None:
    with pytest.raises(ValueError, match=rf"AdaKV.floor={floor!r} is not allowed; it must be a number in \[0, 1\]"):
        AdaKV(floor=floor)


@pytest.mark.parametrize("name", ["streamingllm", "full"])
def test_allocation_with_a_policy_that_cannot_use_it_is_refused(name: str) -> None:
    from restkv import get_policy

    with pytest.raises(ValueError, match=r"allocation='adakv' is not allowed: .* cannot share a budget across heads"):
        get_policy(name, allocation="adakv")
