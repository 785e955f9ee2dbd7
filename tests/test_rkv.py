"""R-KV's scores against a step-by-step reading of its authors' code (``rkv/compression/r1_kv.py``, ``rkv/utils.py``),
written loop by loop here, and its checks (the newest-copy rule, the cache order and the cut timing:
`tests/test_rival_rules.py`; the authors' recorded calls: `tests/test_rival_golden.py`)."""

from __future__ import annotations

import math

import pytest
import torch

from restkv.baselines import RKV
from restkv.policy import LayerInputs

HEADS, KV_HEADS, DIM = 4, 2, 8


def constructed(length: int, seed: int, duplicate: tuple[int, int] | None = None) -> LayerInputs:
    generator = torch.Generator().manual_seed(seed)
    queries = torch.randn(1, HEADS, length, DIM, generator=generator) * 2
    keys = torch.randn(1, KV_HEADS, length, DIM, generator=generator)
    if duplicate is not None:  # a near-copy of an earlier key
        first, second = duplicate
        keys[:, :, second] = keys[:, :, first] + 0.01 * torch.randn(1, KV_HEADS, DIM, generator=generator)
    values = torch.randn(1, KV_HEADS, length, DIM, generator=generator)
    return LayerInputs(queries, keys, values, 0, 1)


def authors_scores(inputs: LayerInputs, window: int = 8, kernel: int = 7, lam: float = 0.07) -> torch.Tensor:
    q, k = inputs.queries[0], inputs.keys[0]
    length, group, past = k.shape[1], HEADS // KV_HEADS, inputs.length - window
    scores = torch.zeros(KV_HEADS, past)
    for kv in range(KV_HEADS):
        logits = torch.stack([q[kv * group + g, -window:] @ k[kv].T / math.sqrt(DIM) for g in range(group)])
        attention = logits.max(dim=0).values[:, :past].softmax(-1).mean(0)  # group max before the softmax
        importance = torch.nn.functional.max_pool1d(attention[None], kernel, 1, kernel // 2)[0]
        unit = k[kv] / (k[kv].norm(dim=-1, keepdim=True) + 1e-8)
        similarity = unit @ unit.T
        similarity.fill_diagonal_(0)
        for i in range(length):
            twins = [j for j in range(length) if similarity[i, j] > 0.5]
            similarity[i, max(twins) if twins else 0] = 0
        redundancy = similarity.mean(0).softmax(-1)[:past]
        scores[kv] = lam * importance - (1 - lam) * redundancy
    return scores


@pytest.mark.parametrize(("length", "seed", "duplicate"), [(64, 0, None), (100, 1, (10, 40)), (57, 2, (3, 50))])
def test_scores_are_the_authors(length: int, seed: int, duplicate) -> None:
    inputs = constructed(length, seed, duplicate)
    torch.testing.assert_close(RKV().score(inputs, keep=32)[0], authors_scores(inputs), rtol=1e-5, atol=1e-7)


def test_knobs_are_checked() -> None:
    with pytest.raises(ValueError, match="gqa stays 'max'"):
        RKV(gqa="mean")
    with pytest.raises(ValueError, match="must be odd"):
        RKV(kernel=6)
    with pytest.raises(ValueError, match="mix_lambda"):
        RKV(mix_lambda=1.5)
    with pytest.raises(ValueError, match="cache_order"):
        RKV(cache_order="sorted")
