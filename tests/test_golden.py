"""Parity with the ReST-KV authors' code on recorded cases (the fixture format: tests/golden/README.md).

The fixture folder comes from ``RESTKV_GOLDEN`` (default: the subset in ``tests/golden``) so that any
fixture set of the same format can be checked. Each case maps the authors' knobs to ours.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from golden_source import golden_folder

from restkv.baselines import SnapKV, StreamingLLM
from restkv.policy import LayerInputs, Policy
from restkv.scoring import output_gram, scoring_path
from restkv.scoring_policy import ScoringPolicy
from restkv.select import Budget
from restkv.stages.schedule import pyramid_budgets

REPO = Path(__file__).resolve().parents[1]
GOLDEN = golden_folder()
INDEX = GOLDEN / "official_selection.json"

if not INDEX.exists():
    pytest.skip(f"{INDEX} is missing: this fixture folder holds no such cases", allow_module_level=True)

META = json.loads(INDEX.read_text())
TEMPORAL = {"ema": "ema", "mean": "mean", "inv-ema": "inv_ema", "none": "last"}


@pytest.fixture(scope="module")
def tensors() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(GOLDEN / "official_selection.safetensors")


def policy_for(case: dict) -> Policy:
    """Our policy equivalent to one recorded call of the authors' code (per-query-head selection)."""
    common = {"window": case["window_size"], "gqa": "expand"}
    kind = case["policy"]
    if kind == "restkv":
        return ScoringPolicy(
            **common,
            temporal="ema" if case["use_ema"] else "mean",
            alpha=case["alpha"],
            order=case["metric_mode"],
            use_wo=case["use_wo"],
            tau=case["tau"],
            normalize=case["use_norm"],
            spatial=case["pooling"],
            kernel=case["kernel_size"],
            scale=case["scale"],
        )
    if kind == "ablation":
        # The authors' AblationCluster ignores the temporal/spatial switches for the attention
        # indicators: it always sums the window's rows and average-pools with kernel 5.
        if case["indicator"] in ("attn", "attn-v"):
            indicator = "attention" if case["indicator"] == "attn" else "attention_value"
            return ScoringPolicy(**common, indicator=indicator, temporal="sum", spatial="avgpool", kernel=5)
        return ScoringPolicy(
            **common, temporal=TEMPORAL[case["temporal"]], spatial=case["spatial"], alpha=0.3, scale=2000, kernel=5
        )
    if kind == "snapkv":
        return SnapKV(**common, kernel=case["kernel_size"], spatial=case["pooling"])
    if kind == "streamingllm":
        return StreamingLLM(**common, variant="prefix")
    raise AssertionError(f"fixture has a policy this test does not know: {kind}")


def layer_inputs(case: dict, tensors: dict[str, torch.Tensor]) -> LayerInputs:
    name = case["name"]
    queries = tensors[f"{name}.query"]
    weight = tensors.get(f"{name}.o_proj_weight")
    return LayerInputs(
        queries=queries,
        keys=tensors[f"{name}.key"],
        values=tensors[f"{name}.value"],
        layer=0,
        num_layers=1,
        output_gram=None if weight is None else (lambda: output_gram(weight, queries.shape[1])),
    )


def assert_same_selection(ours: torch.Tensor, theirs: torch.Tensor, scores: torch.Tensor | None, window: int) -> None:
    """Identical kept positions, except swaps between scores tied (to rounding) at the cut-off."""
    assert ours.shape == theirs.shape
    if torch.equal(ours, theirs):
        return
    assert scores is not None, "kept positions differ and the case has no scores to explain a tie"
    for head in range(ours.shape[1]):
        a, b = set(ours[0, head].tolist()), set(theirs[0, head].tolist())
        if a == b:
            continue
        cutoff = scores[0, head, [p for p in b if p < scores.shape[-1]]].min()
        for position in a ^ b:
            assert torch.isclose(scores[0, head, position], cutoff, rtol=1e-4), (
                f"head {head}: position {position} differs and is not tied at the cut-off"
            )


@pytest.mark.parametrize("path", ["expanded", "direct"])
@pytest.mark.parametrize("case", META["cases"], ids=[c["name"] for c in META["cases"]])
def test_case_matches_reference(case: dict, tensors: dict[str, torch.Tensor], path: str) -> None:
    """Every case, through the CPU's distances (``expanded``) and a GPU's (``direct``, run here on the CPU)."""
    with scoring_path(path):
        check_case(case, tensors)


def check_case(case: dict, tensors: dict[str, torch.Tensor]) -> None:
    policy = policy_for(case)
    inputs = layer_inputs(case, tensors)
    budget = Budget(case["max_capacity_prompt"])
    keep = policy.layer_keep(inputs.length, budget, 0, 1)
    ours = policy.score(inputs, keep) if case["has_scores"] else None
    if ours is not None:
        theirs = tensors[f"{case['name']}.scores"]
        assert ours.shape == theirs.shape
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=0)
    kept = policy.select(inputs, budget)
    assert kept is not None
    assert kept.shape[-1] == case["kept_len"]
    assert_same_selection(kept, tensors[f"{case['name']}.kept"], ours, case["window_size"])


@pytest.mark.parametrize(
    "case", META["pyramidkv_layer_budgets"], ids=lambda c: f"L{c['seq_len']}-B{c['max_capacity_prompt']}"
)
def test_pyramid_budgets_match_reference(case: dict) -> None:
    budgets = pyramid_budgets(
        case["seq_len"], case["max_capacity_prompt"], case["window_size"], case["beta"], case["num_layers"]
    )
    assert budgets == case["kept_per_layer"]
