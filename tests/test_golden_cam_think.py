"""Parity with the ReST-KV authors' CAM and ThinK on recorded cases (``official_headwise.*``).

CAM's merge is random: the cases record the probabilities each step drew from and the draws it
got, so the test checks our probabilities against theirs and replays their draws through our
policy (the draws are injected, nothing else is). ThinK is checked on the channels it drops and
the pruned keys it leaves. The folder comes from ``RESTKV_GOLDEN`` like the other parity tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from golden_source import golden_folder

from restkv.baselines import CAM
from restkv.policy import LayerInputs
from restkv.scoring import window_attention
from restkv.select import Budget, gather_positions
from restkv.stages.channels import channel_mask, prune_keys
from restkv.stages.merge import cam_probabilities, cam_start

REPO = Path(__file__).resolve().parents[1]
GOLDEN = golden_folder()
INDEX = GOLDEN / "official_headwise.json"

if not INDEX.exists():
    pytest.skip(f"{INDEX} is missing: this fixture folder holds no such cases", allow_module_level=True)

ALL_CASES = json.loads(INDEX.read_text())["cases"]
CAM_CASES = [c for c in ALL_CASES if c["policy"] == "cam"]
THINK_CASES = [c for c in ALL_CASES if c["policy"] == "think"]


@pytest.fixture(scope="module")
def tensors() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(GOLDEN / "official_headwise.safetensors")


def cam_inputs(case: dict, tensors: dict[str, torch.Tensor]) -> tuple[CAM, LayerInputs]:
    name = case["name"]
    policy = CAM(window=case["window_size"], gqa="expand", merge_start=case["start_budget_ratio"])
    inputs = LayerInputs(
        queries=tensors[f"{name}.query"][..., -case["window_size"] :, :],
        keys=tensors[f"{name}.key"],
        values=tensors[f"{name}.value"],
        layer=0,
        num_layers=1,
    )
    return policy, inputs


def test_there_are_cases() -> None:
    assert CAM_CASES and THINK_CASES


@pytest.mark.parametrize("case", CAM_CASES, ids=[c["name"] for c in CAM_CASES])
def test_cam_probabilities_match_reference(case: dict, tensors: dict[str, torch.Tensor]) -> None:
    """Every merge step's per-head probability, computed at once, equals the authors' step-by-step one."""
    policy, inputs = cam_inputs(case, tensors)
    attention = window_attention(inputs.queries, inputs.keys)
    start = cam_start(inputs.length, policy.merge_start)
    ours = cam_probabilities(attention[0].mean(dim=-2), start, policy.window)
    theirs = tensors[f"{case['name']}.merge_prob"]
    assert ours.shape == theirs.shape == (case["merge_steps"], case["heads"])
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", CAM_CASES, ids=[c["name"] for c in CAM_CASES])
def test_cam_kept_positions_and_merged_values_match_reference(case: dict, tensors: dict[str, torch.Tensor]) -> None:
    """With the recorded draws replayed, the kept positions and their merged values are the authors'."""
    policy, inputs = cam_inputs(case, tensors)
    name = case["name"]
    kept = policy.select(inputs, Budget(case["max_capacity_prompt"]))
    assert kept is not None and torch.equal(kept, tensors[f"{name}.kept"])
    draws = tensors[f"{name}.merge_mask"]
    assert draws.any(), "the case should merge something"
    merged = policy.merged_values(inputs, kept, draws=draws)
    torch.testing.assert_close(gather_positions(merged, kept), tensors[f"{name}.kept_values"], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(gather_positions(inputs.values, kept), tensors[f"{name}.kept_values"])


@pytest.mark.parametrize("case", CAM_CASES[:1], ids=[c["name"] for c in CAM_CASES[:1]])
def test_other_draws_give_other_values(case: dict, tensors: dict[str, torch.Tensor]) -> None:
    """The parity above depends on the draws: the policy's own seeded draws merge differently (and
    the same seed merges alike)."""
    policy, inputs = cam_inputs(case, tensors)
    kept = policy.select(inputs, Budget(case["max_capacity_prompt"]))
    ours = gather_positions(policy.merged_values(inputs, kept), kept)
    assert torch.equal(ours, gather_positions(policy.merged_values(inputs, kept), kept))
    assert not torch.allclose(ours, tensors[f"{case['name']}.kept_values"])


@pytest.mark.parametrize("case", THINK_CASES, ids=[c["name"] for c in THINK_CASES])
def test_think_pruned_channels_match_reference(case: dict, tensors: dict[str, torch.Tensor]) -> None:
    name = case["name"]
    queries, keys = tensors[f"{name}.query"], tensors[f"{name}.key"]
    mask = channel_mask(queries, keys, case["pruning_ratio"])
    assert torch.equal(mask, tensors[f"{name}.channel_mask"].bool())
    assert int(mask[0, 0].sum()) == case["kept_channels"]
    pruned = keys.clone()
    _, zeroed = prune_keys(pruned, queries, case["pruning_ratio"], case["recent_size"])
    old = case["seq_len"] - case["recent_size"]
    theirs = tensors[f"{name}.pruned_keys"]
    ours = pruned[:, :, :old][mask.unsqueeze(2).expand(-1, -1, old, -1)].view(theirs.shape)
    assert torch.equal(ours, theirs)
    dropped = case["head_dim"] - case["kept_channels"]
    assert zeroed == case["heads"] * old * dropped
    assert not pruned[:, :, :old][~mask.unsqueeze(2).expand(-1, -1, old, -1)].any()  # dropped channels are zero
    assert torch.equal(pruned[:, :, old:], keys[:, :, old:])  # the recent tokens keep every channel
