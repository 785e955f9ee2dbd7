"""CAM's merging, ThinK's pruning, CriticalKV, DropKV and quantized caches through the integration.

Oracles as for the other policies: the kept positions and counts, what the cache holds after
eviction recomputed independently from a full-cache prefill, and decoding equal to attention over
what is kept (for ThinK: over the kept channels of the pruned tokens).
"""

from __future__ import annotations

import pytest
import torch
from conftest import attention_function
from transformers import DynamicCache

from restkv import compress, get_policy
from restkv.baselines import CAM, CriticalKV, SnapKV
from restkv.cache import CompressedLayer
from restkv.select import gather_positions

PROMPT, WINDOW, BUDGET = 96, 8, 40


def prompt(length: int = PROMPT, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 128, (1, length), generator=torch.Generator().manual_seed(seed))


def full_prefill(model, ids: torch.Tensor) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, cache=cache)
    return cache


def evicted(model, policy, ids: torch.Tensor, **options):
    cache = DynamicCache(config=model.config)
    with torch.no_grad(), compress(model, policy, BUDGET, **options) as compressor:
        model(ids, cache=cache)
    return cache, compressor.record


def reference_cam(values: torch.Tensor, draws: torch.Tensor, start: int, recent: int) -> torch.Tensor:
    """CAM's merging written plainly: token by token, every head, the merged share added to the next ``recent``."""
    merged = values.clone()
    for step in range(draws.shape[0]):
        source = start + step
        for head in range(values.shape[1]):
            if draws[step, head]:
                for target in range(source + 1, min(source + 1 + recent, values.shape[2])):
                    merged[0, head, target] += merged[0, head, source] / recent
    return merged


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_cam_keeps_snapkv_positions_and_stores_merged_values(arch: str, make_model, monkeypatch) -> None:
    model = make_model(arch)
    ids = prompt()
    full = full_prefill(model, ids)
    plain = CAM(window=WINDOW, merge="none")
    _, plain_record = evicted(model, plain, ids)
    import restkv.stages.merge as merge_module

    every_head = lambda probabilities, seed, layer: torch.ones_like(probabilities)  # noqa: E731
    monkeypatch.setattr(merge_module, "draw_merges", every_head)
    cache, record = evicted(model, CAM(window=WINDOW, merge_start=0.25), ids)
    start = -(-PROMPT // 4)
    for layer, indices in enumerate(record.indices):
        assert torch.equal(indices, plain_record.indices[layer]), "merging must not change the kept positions"
        keys, values = full.layers[layer].keys, full.layers[layer].values
        draws = torch.ones(PROMPT - WINDOW - start, values.shape[1])
        expected = gather_positions(reference_cam(values, draws, start, WINDOW), indices)
        torch.testing.assert_close(cache.layers[layer].values, expected, rtol=1e-5, atol=1e-5)
        assert torch.equal(cache.layers[layer].keys, gather_positions(keys, indices))
        assert not torch.allclose(cache.layers[layer].values, gather_positions(values, indices))


def test_cam_draws_are_seeded(make_model) -> None:
    model = make_model("llama")
    ids = prompt()
    first, _ = evicted(model, CAM(window=WINDOW, merge_seed=3), ids)
    again, _ = evicted(model, CAM(window=WINDOW, merge_seed=3), ids)
    other, _ = evicted(model, CAM(window=WINDOW, merge_seed=4), ids)
    assert all(torch.equal(a.values, b.values) for a, b in zip(first.layers, again.layers, strict=True))
    assert any(not torch.equal(a.values, b.values) for a, b in zip(first.layers, other.layers, strict=True))


def test_merge_composes_with_any_scorer_and_refuses_expand_on_grouped_heads(make_model) -> None:
    model = make_model("llama")
    ids = prompt()
    plain, _ = evicted(model, get_policy("restkv", window=WINDOW), ids)
    merged, _ = evicted(model, get_policy("restkv", window=WINDOW, merge="cam"), ids)
    assert any(not torch.equal(a.values, b.values) for a, b in zip(plain.layers, merged.layers, strict=True))
    with pytest.raises(NotImplementedError, match="merge='cam' with gqa='expand' on a model with grouped"):
        evicted(model, get_policy("restkv", window=WINDOW, merge="cam", gqa="expand"), ids)


def think_oracle(kept: list[torch.Tensor], keys_of: list[torch.Tensor], prompt_length: int):
    """Attention from scratch: prompt rows causal over the whole prompt; the decoded rows over the kept
    tokens only, whose keys are the given (channel-pruned) ones, and the decoded tokens."""

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        groups = query.shape[1] // key.shape[1]
        k, v = key.repeat_interleave(groups, dim=1).float(), value.repeat_interleave(groups, dim=1).float()
        length = key.shape[2]
        causal = torch.arange(length)[None, :] <= torch.arange(length)[:, None]
        weights = (query.float() @ k.transpose(-1, -2) * scaling).masked_fill(~causal, float("-inf")).softmax(-1)
        out = weights @ v  # [1, h, L, d]
        layer = module.layer_idx
        kept_keys = torch.cat([keys_of[layer], key[:, :, prompt_length:]], dim=2).repeat_interleave(groups, dim=1)
        kept_values = torch.cat([gather_positions(value, kept[layer]), value[:, :, prompt_length:]], dim=2)
        rows = query[:, :, prompt_length:].float()
        new = length - prompt_length
        allowed = torch.ones(new, kept_keys.shape[2], dtype=torch.bool)
        allowed[:, -new:] = torch.arange(new)[None, :] <= torch.arange(new)[:, None]
        decode = (rows @ kept_keys.float().transpose(-1, -2) * scaling).masked_fill(~allowed, float("-inf")).softmax(-1)
        out[:, :, prompt_length:] = decode @ kept_values.repeat_interleave(groups, dim=1).float()
        return out.to(query.dtype).transpose(1, 2).contiguous(), None

    return attention


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_think_zero_fills_the_dropped_channels_and_decodes_over_the_kept_ones(arch: str, make_model) -> None:
    model = make_model(arch)
    ids = prompt()
    full = full_prefill(model, ids)
    policy = SnapKV(window=WINDOW, think_ratio=0.5, think_recent=4)
    cache = DynamicCache(config=model.config)
    with torch.no_grad(), compress(model, policy, BUDGET) as compressor:
        token = model(ids, cache=cache).logits[:, -1:].argmax(-1)
        stored = [layer.keys[:, :, :BUDGET].clone() for layer in cache.layers]
        step = model(token, cache=cache, position_ids=torch.tensor([[PROMPT]])).logits[0, -1]
    record = compressor.record
    for layer, indices in enumerate(record.indices):
        original = gather_positions(full.layers[layer].keys, indices)
        keys = stored[layer]
        zero_channels = (keys[:, :, : BUDGET - 4] == 0).all(dim=2)  # [1, kv, d]
        assert (zero_channels.sum(-1) == 8).all(), "int(16 x 0.5) channels are dropped per head"
        kept_channels = ~zero_channels.unsqueeze(2)
        assert torch.equal(keys[:, :, : BUDGET - 4] * kept_channels, original[:, :, : BUDGET - 4] * kept_channels)
        assert torch.equal(keys[:, :, BUDGET - 4 :], original[:, :, BUDGET - 4 :]), "recent tokens keep every channel"
        size = record.sizes[layer]
        assert size.pruned_bytes == 2 * (BUDGET - 4) * 8 * 4
        assert size.logical_bytes == size.allocated_bytes - size.pruned_bytes
    with torch.no_grad(), attention_function("sdpa", think_oracle(record.indices, stored, PROMPT)):
        reference = model(torch.cat([ids, token], dim=1)).logits[0, -1]
    torch.testing.assert_close(step, reference, rtol=1e-4, atol=1e-4)


def test_think_needs_dense_layers(make_model) -> None:
    model = make_model("llama")
    with pytest.raises(ValueError, match=r"think_ratio=0\.4 prunes key channels of dense layers; layout='varlen'"):
        compress(model, get_policy("think", window=WINDOW), BUDGET, layout="varlen")
    with pytest.raises(NotImplementedError, match=r"think_ratio=0\.4 with allocation='adakv' is not built"):
        get_policy("think", allocation="adakv")


@pytest.mark.parametrize("name", ["criticalkv", "critical_adakv", "dropkv"])
def test_critical_and_dropkv_policies_keep_their_budget(name: str, make_model) -> None:
    model = make_model("llama")
    ids = prompt()
    cache, record = evicted(model, get_policy(name, window=WINDOW), ids)
    heads = model.config.num_key_value_heads
    for layer, indices in enumerate(record.indices):
        if name == "critical_adakv":
            assert int(indices.lengths.sum()) == heads * BUDGET and (indices.lengths >= WINDOW).all()
        else:
            assert indices.shape == (1, heads, BUDGET) and (indices[0, :, -WINDOW:] == torch.arange(88, 96)).all()
            assert isinstance(cache.layers[layer], CompressedLayer)


def test_criticalkv_first_stage_keeps_the_top_base_scores(make_model) -> None:
    """first_stage=1 is the base scorer alone; 0 ranks every token by score x ||W_o v||_1; they differ."""
    model = make_model("llama")
    ids = prompt()
    _, snap = evicted(model, SnapKV(window=WINDOW), ids)
    _, all_first = evicted(model, CriticalKV(window=WINDOW, first_stage=1.0), ids)
    _, all_second = evicted(model, CriticalKV(window=WINDOW, first_stage=0.0), ids)
    assert all(torch.equal(a, b) for a, b in zip(snap.indices, all_first.indices, strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(snap.indices, all_second.indices, strict=True))


def test_dropkv_is_restkv_without_wo_squared() -> None:
    dropkv = get_policy("dropkv")
    assert (dropkv.use_wo, dropkv.power, dropkv.indicator) == (False, 2.0, "reconstruction")


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"merge": "pivot"}, r"ReSTKV.merge='pivot' is not allowed; choose one of: none, cam"),
        ({"think_ratio": 1.0}, r"ReSTKV.think_ratio=1.0 is not allowed; it must be a number in \[0, 1\)"),
        ({"think_ratio": -0.1}, r"ReSTKV.think_ratio=-0.1 is not allowed; it must be a number in \[0, 1\)"),
        ({"merge_start": 1.5}, r"ReSTKV.merge_start=1.5 is not allowed; it must be a number in \[0, 1\]"),
        ({"power": -1}, r"ReSTKV.power=-1 is not allowed"),
    ],
)
def test_bad_merge_and_think_knobs_are_named(knobs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        get_policy("restkv", **knobs)


def test_merge_and_think_need_a_policy_that_evicts() -> None:
    with pytest.raises(ValueError, match=r"FullCache keeps every token: merge='cam'"):
        get_policy("full", merge="cam")
