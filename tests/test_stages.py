"""A policy's stages: the flat knobs (the interface) resolved once into one object per concern.

The schedule, the allocation, the merge and ThinK each live in their own module with their own checks
(`restkv.stages.schedule`, `restkv.stages.allocation`, `restkv.stages.merge`, `restkv.stages.channels`);
`restkv.stages.resolve` composes them and holds the rules across them. The knobs, and so the command line and run
identities, are those of before.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from restkv import ReSTKV, get_policy
from restkv.policy import Policy
from restkv.stages.allocation import AdaKVAllocation, HeadKVAllocation, UniformAllocation
from restkv.stages.channels import KeyPruning
from restkv.stages.merge import CamMerge, NoMerge
from restkv.stages.resolve import STAGE_KNOBS
from restkv.stages.schedule import PyramidSchedule, UniformSchedule

ROOT = Path(__file__).resolve().parents[1]
HEADS = "models/micro-llama/head_scores.json"
STAGE_MODULES = {
    "restkv/stages/resolve.py",
    "restkv/stages/schedule.py",
    "restkv/stages/allocation.py",
    "restkv/stages/merge.py",
    "restkv/stages/channels.py",
}


def test_the_shared_knobs_are_the_interface_they_were() -> None:
    """One Hydra override per knob, as before the stages existed: the dataclass fields are unchanged."""
    assert [f.name for f in dataclasses.fields(Policy)] == [
        "window",
        "gqa",
        "schedule",
        "beta",
        "allocation",
        "floor",
        "allocation_normalize",
        "head_scores",
        "head_beta",
        "merge",
        "merge_start",
        "merge_seed",
        "think_ratio",
        "think_recent",
    ]
    assert set(STAGE_KNOBS) == {f.name for f in dataclasses.fields(Policy)} - {"window"}


@pytest.mark.parametrize(
    ("knobs", "kinds"),
    [
        ({}, (UniformSchedule, UniformAllocation, NoMerge)),
        ({"schedule": "pyramid", "beta": 10.0}, (PyramidSchedule, UniformAllocation, NoMerge)),
        ({"allocation": "adakv", "floor": 0.1}, (UniformSchedule, AdaKVAllocation, NoMerge)),
        ({"allocation": "headkv", "head_scores": HEADS}, (UniformSchedule, HeadKVAllocation, NoMerge)),
        ({"merge": "cam", "merge_start": 0.2}, (UniformSchedule, UniformAllocation, CamMerge)),
        ({"schedule": "pyramid", "allocation": "adakv"}, (PyramidSchedule, AdaKVAllocation, NoMerge)),
    ],
)
def test_knobs_resolve_to_their_stages(knobs: dict, kinds: tuple) -> None:
    stages = ReSTKV(**knobs).stages
    assert tuple(type(s) for s in (stages.schedule, stages.allocation, stages.merge)) == kinds
    assert isinstance(stages.key_pruning, KeyPruning) and not stages.key_pruning.active
    if "beta" in knobs:
        assert stages.schedule.beta == 10.0
    if "floor" in knobs:
        assert stages.allocation.floor == 0.1 and stages.allocation.normalize
    if "merge_start" in knobs:
        assert (stages.merge.start, stages.merge.seed) == (0.2, 0)


def test_stages_are_resolved_once_and_again_when_a_knob_changes() -> None:
    policy = get_policy("snapkv", think_ratio=0.4)
    first = policy.stages
    assert policy.stages is first and first.key_pruning.active
    assert policy.query_count == 32 and first.key_pruning.queries_needed(64) == 64
    policy.schedule = "pyramid"
    assert isinstance(policy.stages.schedule, PyramidSchedule) and policy.stages is not first
    assert "_stages" not in {f.name for f in dataclasses.fields(policy)}  # not a knob: not in describe() or identity
    assert set(policy.describe()) == {"policy", *(f.name for f in dataclasses.fields(policy))}


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"schedule": "wedge"}, r"ReSTKV.schedule='wedge' is not allowed; choose one of: uniform, pyramid"),
        ({"beta": 0}, r"ReSTKV.beta=0 is not allowed"),
        ({"allocation": "adakv", "floor": 1.5}, r"ReSTKV.floor=1.5 is not allowed"),
        ({"merge": "pivot"}, r"ReSTKV.merge='pivot' is not allowed; choose one of: none, cam"),
        ({"merge_seed": -1}, r"ReSTKV.merge_seed=-1 is not allowed"),
        ({"think_ratio": 1.0}, r"ReSTKV.think_ratio=1.0 is not allowed"),
        ({"head_scores": HEADS}, r"head_scores is set but allocation='uniform'"),
        ({"allocation": "headkv"}, r"allocation='headkv' needs head_scores"),
        ({"allocation": "headkv", "head_scores": HEADS, "schedule": "pyramid"}, r"schedule='pyramid' cannot apply"),
    ],
)
def test_each_stage_checks_its_own_knobs(knobs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReSTKV(**knobs)


def test_rules_across_stages_and_policy_kinds() -> None:
    with pytest.raises(NotImplementedError, match=r"think_ratio=0.4 with allocation='adakv' is not built"):
        ReSTKV(think_ratio=0.4, allocation="adakv")
    with pytest.raises(ValueError, match=r"FullCache keeps every token: merge='cam' and think_ratio=0.0 need eviction"):
        get_policy("full", merge="cam")
    with pytest.raises(ValueError, match=r"StreamingLLM.allocation='adakv' is not allowed"):
        get_policy("streamingllm", allocation="adakv")


def _is_policy(node: ast.expr) -> bool:
    """``self``, ``policy`` or ``<anything>.policy``: what a knob is read from (not a stage: ``stages.merge``)."""
    return (isinstance(node, ast.Name) and node.id in ("self", "policy")) or (
        isinstance(node, ast.Attribute) and node.attr == "policy"
    )


def _raw_knob_reads(path: Path) -> list[str]:
    """``policy.<knob>`` / ``self.<knob>`` reads of a stage knob in ``path`` (config strings do not count)."""
    knobs = set(STAGE_KNOBS) - {"gqa"}  # gqa is the selection's own knob (`restkv.select`), read by the policy
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        reads = isinstance(node, ast.Attribute) and node.attr in knobs and isinstance(node.ctx, ast.Load)
        if reads and _is_policy(node.value):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_module_outside_the_stages_reads_their_knobs() -> None:
    """The core and the baselines ask ``policy.stages``; only the stage modules read the knobs themselves."""
    reads = [
        read
        for folder in ("restkv", "baselines")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if str(path.relative_to(ROOT)) not in STAGE_MODULES
        for read in _raw_knob_reads(path)
    ]
    assert not reads, f"stage knobs read outside their stages: {reads}"
