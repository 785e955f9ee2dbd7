"""Parity with the ReST-KV authors' AdaKV and HeadKV on recorded cases (``official_headwise.*``).

The folder comes from ``RESTKV_GOLDEN`` (default: the subset in ``tests/golden``), so any fixture set of the
same format is checked the same way. Each case runs our policy end to end (`Policy.select` on the
case's layer inputs) and must keep, per head, the same number of tokens at the same positions,
except where two scores tie (to rounding) at a head's cut-off.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from golden_source import golden_folder

from restkv.baselines import AdaKV, HeadKV
from restkv.policy import LayerInputs
from restkv.select import Budget
from restkv.stages.allocation import HeadSelection, adakv_capacities, headkv_capacities

REPO = Path(__file__).resolve().parents[1]
GOLDEN = golden_folder()
INDEX = GOLDEN / "official_headwise.json"

if not INDEX.exists():
    pytest.skip(f"{INDEX} is missing: this fixture folder holds no such cases", allow_module_level=True)

CASES = [c for c in json.loads(INDEX.read_text())["cases"] if c["policy"] in ("adakv", "headkv")]


@pytest.fixture(scope="module")
def tensors() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(GOLDEN / "official_headwise.safetensors")


def inputs_for(case: dict, tensors: dict[str, torch.Tensor]) -> LayerInputs:
    name = case["name"]
    return LayerInputs(
        queries=tensors[f"{name}.query"],
        keys=tensors[f"{name}.key"],
        values=tensors[f"{name}.value"],
        layer=case.get("layer", 0),
        num_layers=case.get("num_layers", 1),
    )


def policy_for(case: dict, tensors: dict[str, torch.Tensor], tmp: Path) -> AdaKV | HeadKV:
    common = {"window": case["window_size"], "gqa": "expand", "spatial": case["pooling"], "kernel": case["kernel_size"]}
    if case["policy"] == "adakv":
        return AdaKV(**common, floor=case["floor"], allocation_normalize=case["normalize"])
    # the head file in HeadKV's format, one score per (layer, head): the case's recorded importances
    importance = tensors[f"{case['name']}.head_scores"].view(case["num_layers"], case["heads"])
    path = tmp / "heads.json"
    path.write_text(
        json.dumps(
            {f"{i}-{h}": [float(importance[i, h])] for i in range(case["num_layers"]) for h in range(case["heads"])}
        )
    )
    return HeadKV(**common, head_scores=str(path), head_beta=case["head_beta"])


def assert_same_heads(
    ours: HeadSelection, kept: torch.Tensor, lengths: list[int], scores: torch.Tensor, window: int
) -> None:
    """Same per-head lengths; same positions except swaps between scores tied at a head's cut-off."""
    assert ours.lengths.tolist() == lengths
    theirs = kept.split(lengths)
    for head, (a, b) in enumerate(zip(ours.per_head(), theirs, strict=True)):
        if torch.equal(a, b):
            continue
        past_b = [p for p in b.tolist() if p < scores.shape[-1]]
        cutoff = scores[head, past_b].min()
        for position in set(a.tolist()) ^ set(b.tolist()):
            assert torch.isclose(scores[head, position], cutoff, rtol=1e-4), (
                f"head {head}: position {position} differs and is not tied at the cut-off"
            )


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_headwise_case_matches_reference(case: dict, tensors: dict[str, torch.Tensor], tmp_path: Path) -> None:
    policy = policy_for(case, tensors, tmp_path)
    inputs = inputs_for(case, tensors)
    budget = Budget(case["max_capacity_prompt"])
    keep = policy.layer_keep(inputs.length, budget, inputs.layer, inputs.num_layers)
    scores = policy.score(inputs, keep)[0]
    if f"{case['name']}.scores" in tensors:
        torch.testing.assert_close(scores, tensors[f"{case['name']}.scores"][0], rtol=1e-4, atol=1e-7)
    selection = policy.select(inputs, budget)
    if selection is None:  # nothing evicted: the reference kept every head whole
        assert case["head_lens"] == [inputs.length] * case["heads"]
        return
    assert isinstance(selection, HeadSelection)
    assert_same_heads(selection, tensors[f"{case['name']}.kept"], case["head_lens"], scores, case["window_size"])


@pytest.mark.parametrize("case", [c for c in CASES if c["policy"] == "headkv"], ids=lambda c: c["name"])
def test_headkv_budgets_match_reference(case: dict, tensors: dict[str, torch.Tensor]) -> None:
    importance = tensors[f"{case['name']}.head_scores"].view(case["num_layers"], case["heads"])
    capacities = headkv_capacities(importance, case["max_capacity_prompt"], case["head_beta"])
    assert capacities.tolist() == case["head_capacity"]


@pytest.mark.parametrize("case", [c for c in CASES if c["policy"] == "adakv"], ids=lambda c: c["name"])
def test_adakv_shares_the_layer_budget(case: dict, tensors: dict[str, torch.Tensor]) -> None:
    """The allocation alone, on the recorded scores: the recorded lengths, and every head's floor."""
    scores = tensors[f"{case['name']}.scores"][0]
    base = case["max_capacity_prompt"] - case["window_size"]
    if base > scores.shape[-1]:
        pytest.skip("the reference keeps everything for this case")
    capacities = adakv_capacities(scores, base, case["floor"], case["normalize"])
    assert (capacities + case["window_size"]).tolist() == case["head_lens"]
    assert (capacities >= int(base * case["floor"])).all()
    assert abs(int(capacities.sum()) - case["heads"] * base) <= case["heads"]  # rounding only


L2NORM_CASES = [c for c in json.loads(INDEX.read_text())["cases"] if c["policy"] == "l2norm"]


@pytest.mark.parametrize("case", L2NORM_CASES, ids=[c["name"] for c in L2NORM_CASES])
def test_l2norm_case_matches_reference(case: dict, tensors: dict[str, torch.Tensor]) -> None:
    """The authors' L2Norm: each head's ``budget`` smallest-norm keys, no window reserved."""
    from restkv.baselines import L2Norm

    keys = tensors[f"{case['name']}.key"]
    inputs = LayerInputs(
        queries=keys[:, :, -1:], keys=keys, values=tensors[f"{case['name']}.value"], layer=0, num_layers=1
    )
    kept = L2Norm(gqa="expand").select(inputs, Budget(case["max_capacity_prompt"]))
    assert kept is not None and kept.shape[-1] == case["kept_len"]
    assert torch.equal(kept, tensors[f"{case['name']}.kept"])
