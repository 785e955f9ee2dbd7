"""DefensiveKV, Layer-DefensiveKV, the defensive temporal stage, the global allocation and CAOTE.

The references below are written from the DefensiveKV authors' code read step by step (one eviction call of
``efficient_defensivekv_press.py`` and the flattened top-k of its head-wise base class), loop by loop and in
float32, independently of `restkv.baselines.defensivekv`; CAOTE's from its definition (a base score normalised
to sum to one, ``h / (1 - h) * ||o - v||``).
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from restkv import compress, get_policy
from restkv.baselines import CAOTE, DefensiveKV
from restkv.policy import LayerInputs
from restkv.scoring import aggregate, output_gram
from restkv.select import Budget
from restkv.stages.allocation import HeadSelection, global_capacities

HEADS, KV_HEADS, DIM, HIDDEN = 4, 2, 8, 16


def constructed(length: int, seed: int, layer: int = 0, num_layers: int = 1) -> LayerInputs:
    generator = torch.Generator().manual_seed(seed)
    queries = torch.randn(1, HEADS, length, DIM, generator=generator) * 2
    keys = torch.randn(1, KV_HEADS, length, DIM, generator=generator) * 2
    values = torch.randn(1, KV_HEADS, length, DIM, generator=generator)
    weight = torch.randn(HIDDEN, HEADS * DIM, generator=generator)
    gram = output_gram(weight, HEADS)
    return LayerInputs(queries, keys, values, layer, num_layers, output_gram=lambda: gram, output_weight=lambda: weight)


def authors_scores(inputs: LayerInputs, keep: int, window: int = 32, kernel: int = 5) -> torch.Tensor:
    """One layer's DefensiveKV scores ``[H, L]`` (window included, padded with the maximum), step by step."""
    q, k, v = inputs.queries[0], inputs.keys[0], inputs.values[0]
    n, group = inputs.length, HEADS // KV_HEADS
    past, ratio = n - window, 1 - keep / n
    rows = torch.zeros(HEADS, window, past)
    for head in range(HEADS):
        for i in range(window):
            logits = (q[head, past + i] @ k[head // group].T) / math.sqrt(DIM)
            logits[past + i + 1 :] = float("-inf")
            rows[head, i] = logits.softmax(-1)[:past]
    mean_attention = rows.view(KV_HEADS, group, window, past).mean(dim=(1, 2))
    mass = rows.sum(-1, keepdim=True)
    pooled = torch.nn.functional.avg_pool1d(rows, kernel, 1, kernel // 2)  # count_include_pad by default
    pooled = pooled / pooled.sum(-1, keepdim=True) * mass
    scores = pooled.view(KV_HEADS, group * window, past).max(dim=1).values
    scores = scores.clamp(min=scores.mean(-1, keepdim=True))
    weight = inputs.output_weight()
    norms = torch.zeros(KV_HEADS, past)
    for kv in range(KV_HEADS):
        for g in range(group):
            head = kv * group + g
            norms[kv] += (v[kv, :past] @ weight[:, head * DIM : (head + 1) * DIM].T).abs().sum(-1) / group
    scores = scores * norms / norms.sum(0, keepdim=True)
    bias = rows[..., -window:].sum(-1).mean().item()
    share = mean_attention / mean_attention.sum(-1, keepdim=True)
    order = share.sort(-1, descending=True)
    cumulative = order.values.cumsum(-1)
    cap = int(past * (1 - ratio) - window)
    top = scores.max().item()
    for kv in range(KV_HEADS):
        count = int((cumulative[kv] >= 0.9 - bias).int().argmax())
        scores[kv, order.indices[kv, : min(count, max(cap, 0))]] = top
    return torch.cat([scores, torch.full((KV_HEADS, window), top)], dim=-1)


def kept_sets(selection: HeadSelection) -> list[set[int]]:
    return [set(head.tolist()) for head in selection.per_head()]


def flat_top(scores: torch.Tensor, total: int) -> list[set[int]]:
    winners = scores.reshape(-1).topk(total).indices
    return [set((winners[winners // scores.shape[1] == h] % scores.shape[1]).tolist()) for h in range(scores.shape[0])]


@pytest.mark.parametrize(
    "length,keep,seed",
    [(300, 96, 0), (500, 64, 1), (257, 200, 2), (400, 48, 3), (350, 128, 7), (600, 96, 8), (320, 160, 9)],
)
def test_defensivekv_keeps_what_the_authors_algorithm_keeps(length: int, keep: int, seed: int) -> None:
    inputs = constructed(length, seed)
    selection = DefensiveKV().select(inputs, Budget(keep))
    reference = authors_scores(inputs, keep)
    assert selection.total == keep * KV_HEADS  # the layer's budget, shared unevenly by its heads
    assert kept_sets(selection) == flat_top(reference, keep * KV_HEADS)


def test_the_defensive_floor_and_the_worst_case() -> None:
    rows = torch.tensor([[[0.1, 0.5, 0.0, 0.2], [0.3, 0.1, 0.0, 0.2]]])  # [1, w=2, P=4]
    # max over queries: [0.3, 0.5, 0.0, 0.2]; mean 0.25 floors the two smallest
    torch.testing.assert_close(aggregate(rows, "defensive", 0.3), torch.tensor([[0.3, 0.5, 0.25, 0.25]]))


def test_the_first_stage_cap_below_zero_protects_nothing() -> None:
    """The authors' slice with a negative bound would protect nearly every token (a deliberate difference)."""
    inputs = constructed(90, 4)  # past 58 tokens: int(58 * 40 / 90 - 32) < 0
    scores = DefensiveKV().score(inputs, keep=40)
    assert int((scores == scores.max()).sum()) <= 2


def test_restkv_with_the_defensive_stage_differs_from_restkv_and_keeps_the_budget() -> None:
    inputs = constructed(400, 5)
    plain = get_policy("restkv", gqa="max").select(inputs, Budget(64))
    defensive = get_policy("restkv_defensive", gqa="max").select(inputs, Budget(64))
    assert defensive.shape == plain.shape == (1, KV_HEADS, 64)
    assert not torch.equal(defensive, plain)


def test_global_capacities_are_one_ranking_of_every_layer() -> None:
    layers = [torch.tensor([[5.0, 1.0, 0.0], [4.0, 3.0, 2.0]]), torch.tensor([[9.0, 8.0, 7.0], [0.5, 0.4, 0.3]])]
    counts = global_capacities(layers, [1, 1])  # 4 winners of 12: 9, 8, 7, 5
    assert [c.tolist() for c in counts] == [[1, 0], [3, 0]]


@pytest.fixture(scope="module")
def micro():
    return AutoModelForCausalLM.from_pretrained("models/micro-llama").eval()


@pytest.mark.parametrize("allocation", ["global_window", "global"])
def test_layer_defensivekv_shares_one_budget_by_all_layers(micro, allocation: str) -> None:
    """Both rankings share the model's budget unevenly; 'global' (window always kept) keeps every head's window, the
    authors' 'global_window' (the preset's) ranks windows with the rest (its decisions: tests/test_rival_golden.py)."""
    ids = torch.randint(10, 8000, (1, 600), generator=torch.Generator().manual_seed(0))
    with compress(micro, get_policy("defensivekv"), budget=64) as per_layer:
        micro(ids)
    with compress(micro, get_policy("layer_defensivekv", allocation=allocation), budget=64) as shared:
        micro(ids)
    kv_heads, layers = micro.config.num_key_value_heads, micro.config.num_hidden_layers
    totals = [sum(lengths) for lengths in shared.record.head_lengths]
    assert sum(totals) == layers * kv_heads * 64  # the model's budget, window included
    assert len(set(totals)) > 1  # shared unevenly by the layers
    if allocation == "global":
        assert all(min(lengths) >= 32 for lengths in shared.record.head_lengths)  # every head keeps the window
    assert [sum(lengths) for lengths in per_layer.record.head_lengths] == [kv_heads * 64] * layers


def test_the_global_allocation_refuses_what_cannot_share_a_ranking() -> None:
    with pytest.raises(ValueError, match="schedule='uniform'"):
        get_policy("layer_defensivekv", schedule="pyramid")
    with pytest.raises(ValueError, match="chooses each layer's positions its own way"):
        get_policy("criticalkv", allocation="global")
    with pytest.raises(ValueError, match="gqa stays 'max'"):
        DefensiveKV(gqa="mean")


def test_caote_scores_are_its_definition() -> None:
    inputs = constructed(200, 6)
    scores = CAOTE().score(inputs, keep=64)  # [b, h, P], per query head
    past = inputs.length - 32
    attention = torch.zeros(HEADS, 32, past)
    for head in range(HEADS):
        logits = (inputs.queries[0, head, past:] @ inputs.keys[0, head // 2].T) / math.sqrt(DIM)
        logits = logits.masked_fill(torch.ones(32, 200, dtype=torch.bool).triu(past + 1), float("-inf"))
        attention[head] = logits.softmax(-1)[:, :past]
    base = attention.mean(1)
    h = base / base.sum(-1, keepdim=True)
    for head in range(HEADS):
        v = inputs.values[0, head // 2, :past]
        output = h[head] @ v
        expected = h[head] / (1 - h[head]) * (output - v).norm(dim=-1)
        torch.testing.assert_close(scores[0, head], expected, rtol=1e-4, atol=1e-7)
