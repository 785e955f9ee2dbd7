"""ReST-KV's distances on a GPU's path (``direct``), run on a CPU against the CPU's (``expanded``).

The direct path computes ``||W_o^h (o - v_j)||`` from the difference itself, a chunk of tokens at a time, with no
host read; the expanded one expands the square and recomputes where it cancels. Same scores to float32 rounding,
the same kept tokens (`tests/test_golden.py` also replays every recorded case through both).
"""

from __future__ import annotations

import pytest
import torch
from test_worksizes import GPU_FREE, _eviction_operators

from restkv import compress, scoring
from restkv.registry import get_policy
from restkv.scoring import output_gram, reconstruction_after, scoring_path


def _layer(heads: int, kv_heads: int, length: int, seed: int, dim: int = 16):
    generator = torch.Generator().manual_seed(seed)
    attention = torch.rand(1, heads, length, generator=generator).pow(8).softmax(-1)  # peaked rows
    values = torch.randn(1, kv_heads, length + 8, dim, generator=generator)
    gram = output_gram(torch.randn(48, heads * dim, generator=generator), heads)
    return attention, values, gram


def _both(attention, values, gram, tau=1.0, **direct):
    expanded = reconstruction_after(attention, values, gram, tau)
    with scoring_path("direct"):
        return expanded, reconstruction_after(attention, values, gram, tau, **direct)


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 2), (4, 4), (6, 1)])
@pytest.mark.parametrize("length", [17, 300, 2100])
@pytest.mark.parametrize("use_wo", [True, False])
def test_direct_distances_equal_the_expanded_ones(heads, kv_heads, length, use_wo):
    attention, values, gram = _layer(heads, kv_heads, length, seed=length + heads)
    expanded, direct = _both(attention, values, gram if use_wo else None, tau=0.7)
    torch.testing.assert_close(direct, expanded, rtol=1e-5, atol=1e-7)
    keep = min(40, length)
    assert torch.equal(direct.topk(keep).indices.sort().values, expanded.topk(keep).indices.sort().values)


def test_chunks_do_not_change_the_scores():
    attention, values, gram = _layer(8, 2, 3000, seed=1)
    _, whole = _both(attention, values, gram, chunk=3000)
    for chunk in (1, 7, 1024):
        _, chunked = _both(attention, values, gram, chunk=chunk)
        torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-7)


def test_a_saturated_token_ranks_first_on_both_paths():
    """A head whose attention is all on one token: its distance is ``||W_o^h v_j||`` (not a 0 or a NaN)."""
    attention, values, gram = _layer(4, 2, 50, seed=3)
    attention[0, 1] = 0.0
    attention[0, 1, 17] = 1.0  # head 1 saturated on token 17
    expanded, direct = _both(attention, values, gram)
    assert torch.isfinite(direct).all() and direct[0, 1].argmax() == 17 == expanded[0, 1].argmax()
    torch.testing.assert_close(direct, expanded, rtol=1e-5, atol=1e-7)


def test_tied_values_tie_on_both_paths():
    attention, values, gram = _layer(4, 2, 64, seed=4)
    values[:, :, 10] = values[:, :, 20]
    attention[..., 20] = attention[..., 10]
    expanded, direct = _both(attention, values, gram)
    assert torch.equal(direct[..., 10], direct[..., 20]) and torch.equal(expanded[..., 10], expanded[..., 20])


@pytest.mark.parametrize("gqa", ["mean", "max", "expand"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_restkv_keeps_the_same_tokens_through_either_path(make_model, arch, gqa):
    model = make_model(arch)
    ids = torch.randint(0, 128, (1, 400), generator=torch.Generator().manual_seed(9))
    kept = []
    for path in ("expanded", "direct"):
        with scoring_path(path), compress(model, get_policy("restkv", gqa=gqa), 64) as compressor, torch.no_grad():
            model(ids)
            kept.append([selection.clone() for selection in compressor.record.indices])
    assert all(torch.equal(a, b) for a, b in zip(*kept, strict=True))


def test_the_direct_path_launches_a_fixed_number_of_chunks(make_model, monkeypatch):
    """At most about `DIRECT_CHUNKS` chunks whatever the length (here with a small minimum chunk, so both lengths
    are cut into that many): one layer's eviction launches as many operators at 600 tokens as at 2400."""
    monkeypatch.setattr(scoring, "DIRECT_MIN_CHUNK", 8)
    model = make_model("llama")
    with scoring_path("direct"):
        short, long = (_eviction_operators(model, "restkv", length, GPU_FREE) for length in (600, 2400))
    assert long == short


def test_scoring_paths_are_named():
    with (
        pytest.raises(ValueError, match=r"scoring path 'fast' is not one of: auto, expanded, direct"),
        scoring_path("fast"),
    ):
        pass
    assert scoring.pick_scoring_path(torch.device("cpu")) == "expanded"
    assert scoring.pick_scoring_path(torch.device("cuda")) == "direct"
