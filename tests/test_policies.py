"""Budgets, selection and every policy's knob checking."""

from __future__ import annotations

import math
import pkgutil
import re
from pathlib import Path

import pytest
import torch

from restkv import Budget, LayerInputs, ReSTKV, ScoringPolicy, get_policy, policy_names
from restkv.baselines import H2O, FullCache, PyramidKV, RandomEviction, SnapKV, StreamingLLM
from restkv.baselines.h2o import accumulated_attention
from restkv.eval.run import CONFIGS as CONFIG_DIR
from restkv.registry import resolve_policy
from restkv.select import keep_indices, reduce_groups
from restkv.stages.schedule import pyramid_budgets

CONFIGS = Path(CONFIG_DIR)


def inputs(length: int = 64, heads: int = 4, kv_heads: int = 2, d: int = 8, queries: int = 8) -> LayerInputs:
    g = torch.Generator().manual_seed(0)
    return LayerInputs(
        queries=torch.randn(1, heads, queries, d, generator=g),
        keys=torch.randn(1, kv_heads, length, d, generator=g),
        values=torch.randn(1, kv_heads, length, d, generator=g),
        layer=0,
        num_layers=1,
        output_gram=lambda: torch.eye(d).expand(heads, d, d),
    )


def test_registry_knows_every_policy() -> None:
    """Every module of ``baselines/`` registers a policy (found by the registry, not listed), every registered
    policy has its config, and the package exports each policy class by name."""
    import restkv.baselines as baselines

    registered = {resolve_policy(name)[0] for name in policy_names()}
    for module in pkgutil.iter_modules(baselines.__path__):
        owned = [cls for cls in registered if cls.__module__ == f"restkv.baselines.{module.name}"]
        assert owned, f"baselines/{module.name}.py registers no policy"
        assert all(getattr(baselines, cls.__name__) is cls for cls in owned)
    assert all((CONFIGS / "policy" / f"{name}.yaml").is_file() for name in policy_names())
    assert policy_names() == sorted(policy_names())
    assert get_policy("restkv", alpha=0.5).alpha == 0.5


def test_registry_errors_name_the_value_and_the_choices() -> None:
    registered = re.escape(", ".join(policy_names()))
    with pytest.raises(ValueError, match=f"unknown policy 'snap'; registered policies: {registered}"):
        get_policy("snap")
    with pytest.raises(
        ValueError, match="policy 'snapkv' has no knob colour; its knobs: allocation, allocation_normalize, alpha, beta"
    ):
        get_policy("snapkv", colour=1)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ReSTKV(window=0), r"ReSTKV.window=0 is not allowed; it must be an integer in \[1"),
        (lambda: ReSTKV(window=2.5), r"ReSTKV.window=2.5 is not allowed"),
        (lambda: ReSTKV(alpha=math.nan), r"ReSTKV.alpha=nan is not allowed; it must be a number in \(0, 1\]"),
        (lambda: ReSTKV(alpha=-0.1), r"ReSTKV.alpha=-0.1 is not allowed"),
        (lambda: ReSTKV(scale=-1), r"ReSTKV.scale=-1 is not allowed"),
        (lambda: ReSTKV(tau=float("inf")), r"ReSTKV.tau=inf is not allowed"),
        (lambda: ReSTKV(kernel=4), r"ReSTKV.kernel=4 is not allowed; the smoothing kernel must be odd"),
        (lambda: ReSTKV(indicator="attn"), r"ReSTKV.indicator='attn' is not allowed; choose one of: attention, "),
        (lambda: ReSTKV(temporal="median"), r"choose one of: sum, mean, ema, inv_ema, last"),
        (lambda: ReSTKV(spatial="gauss"), r"choose one of: none, avgpool, maxpool, adaptive"),
        (lambda: ReSTKV(order="during"), r"choose one of: after, before"),
        (lambda: ReSTKV(gqa="sum"), r"ReSTKV.gqa='sum' is not allowed; choose one of: mean, max, expand"),
        (lambda: ReSTKV(schedule="cone"), r"choose one of: uniform, pyramid"),
        (lambda: ReSTKV(normalize=True), r"normalize=True only applies with order='before'"),
        (lambda: PyramidKV(beta=0), r"PyramidKV.beta=0 is not allowed"),
        (lambda: StreamingLLM(variant="sink"), r"choose one of: sinks, prefix"),
        (lambda: StreamingLLM(sinks=-1), r"StreamingLLM.sinks=-1 is not allowed"),
        (lambda: RandomEviction(seed=-3), r"RandomEviction.seed=-3 is not allowed"),
        (lambda: H2O(max_elements=0), r"H2O.max_elements=0 is not allowed"),
    ],
)
def test_bad_knobs_are_rejected_with_the_value_and_what_is_allowed(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "a token budget must be >= 1"),
        (1.5, r"must lie in \(0, 1\)"),
        (-0.2, r"must lie in \(0, 1\)"),
        (math.nan, r"must lie in \(0, 1\)"),
        ("128", "budget must be an int"),
    ],
)
def test_bad_budgets(value, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        Budget(value)


def test_budget_forms() -> None:
    assert Budget(128).tokens(5000) == 128
    assert Budget(128.0).value == 128 and not Budget(128.0).is_ratio
    assert Budget(0.25).tokens(1000) == 250
    with pytest.raises(ValueError, match="gives 25 tokens for a 100-token prompt, which is not more than the window"):
        ReSTKV(window=32).layer_keep(100, Budget(0.25), 0, 1)


def test_prompt_shorter_than_budget_is_left_alone() -> None:
    assert ReSTKV(window=8).select(inputs(length=64), Budget(64)) is None
    assert ReSTKV(window=8).select(inputs(length=64), Budget(500)) is None
    assert FullCache(window=8).select(inputs(length=64), Budget(16)) is None


def test_keep_indices_takes_the_best_and_the_window() -> None:
    scores = torch.tensor([[[0.1, 0.9, 0.3, 0.8, 0.0]]])
    assert keep_indices(scores, keep=4, window=2).tolist() == [[[1, 3, 5, 6]]]


def test_gqa_reduction() -> None:
    scores = torch.tensor([[[1.0, 0.0], [0.0, 3.0], [2.0, 2.0], [4.0, 0.0]]])
    assert reduce_groups(scores, 2, "mean").tolist() == [[[0.5, 1.5], [3.0, 1.0]]]
    assert reduce_groups(scores, 2, "max").tolist() == [[[1.0, 3.0], [4.0, 2.0]]]
    assert torch.equal(reduce_groups(scores, 2, "expand"), scores)


def test_pyramid_combines_with_any_scorer() -> None:
    # As in the reference code, the integer step makes the average exceed the uniform budget:
    # 188 down to 33 past tokens (mean 110.5) instead of 96 in every layer.
    budgets = pyramid_budgets(4000, 128, 32, 20, 32)
    assert sum(b - 32 for b in budgets) / 32 == 110.5
    policy = ReSTKV(window=8, schedule="pyramid")
    keeps = [policy.layer_keep(400, Budget(40), layer, 4) for layer in range(4)]
    assert keeps == pyramid_budgets(400, 40, 8, 20, 4)
    assert keeps[0] > keeps[-1]


def test_streamingllm_variants() -> None:
    x = inputs(length=64)
    sinks = StreamingLLM(window=8, sinks=4).select(x, Budget(20))
    assert sinks[0, 0].tolist() == [0, 1, 2, 3, *range(48, 64)]
    prefix = StreamingLLM(window=8, variant="prefix").select(x, Budget(20))
    assert prefix[0, 0].tolist() == [*range(12), *range(56, 64)]


def test_random_is_reproducible_and_seed_dependent() -> None:
    x = inputs()
    a = RandomEviction(window=8, seed=1).select(x, Budget(20))
    assert torch.equal(a, RandomEviction(window=8, seed=1).select(x, Budget(20)))
    assert not torch.equal(a, RandomEviction(window=8, seed=2).select(x, Budget(20)))


def test_h2o_blocks_equal_the_full_causal_matrix() -> None:
    queries, keys = torch.randn(1, 4, 50, 8), torch.randn(1, 2, 50, 8)
    full = (queries @ keys.repeat_interleave(2, 1).transpose(-1, -2)) / math.sqrt(8)
    full = full.masked_fill(torch.ones(50, 50, dtype=torch.bool).triu(1), float("-inf")).softmax(-1).sum(-2)
    for block in (1, 7 * 4 * 50, 10**9):
        torch.testing.assert_close(accumulated_attention(queries, keys, None, block), full)


def test_snapkv_is_a_setting_of_the_scoring_policy() -> None:
    x = inputs()
    snap = SnapKV(window=8).score(x, 20)
    same = ScoringPolicy(window=8, indicator="attention", temporal="sum", spatial="avgpool", kernel=5).score(x, 20)
    torch.testing.assert_close(snap, same)


def test_tau_applies_in_before_order_too() -> None:
    """Deliberate difference: the reference code ignores tau in `before` order; we apply it."""
    x = inputs()
    one = ScoringPolicy(window=8, order="before", spatial="none").score(x, 20)
    two = ScoringPolicy(window=8, order="before", spatial="none", tau=2.0).score(x, 20)
    assert not torch.allclose(one, two)


def test_describe_lists_knobs() -> None:
    assert ReSTKV().describe()["alpha"] == 0.3
    assert SnapKV().describe()["policy"] == "SnapKV"
