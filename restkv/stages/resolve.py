"""A policy's stages, resolved once from its flat knobs: the schedule, the allocation, the merge and ThinK.

The knobs stay flat (``policy.allocation=adakv policy.floor=0.1``: one Hydra override per ablation, the
run's identity unchanged); inside the core each concern is one object with its own checks, in its
own module: `restkv.stages.schedule`, `restkv.stages.allocation`, `restkv.stages.merge`,
`restkv.stages.channels`. Only those modules and `resolve_stages` read the knobs; everything else asks the
stage. The rules that span two stages, or a stage and the policy's kind, are here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from restkv.stages.allocation import Allocation, allocation_of
from restkv.stages.channels import KeyPruning, key_pruning_of
from restkv.stages.merge import Merge, merge_of
from restkv.stages.schedule import Schedule, schedule_of

STAGE_KNOBS = (
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
)
"""The knobs the stages are made of (``gqa`` reduces head importance for HeadKV)."""


class PolicyKnobs(Protocol):
    """What the stages are resolved from: a policy's knobs and what kind of policy it is (`restkv.policy.Policy`)."""

    gqa: str
    schedule: str
    beta: float
    allocation: str
    floor: float
    allocation_normalize: bool
    head_scores: str | None
    head_beta: float
    merge: str
    merge_start: float
    merge_seed: int
    think_ratio: float
    think_recent: int
    evicts: bool
    allows_allocation: bool


@dataclass(frozen=True)
class Stages:
    """What a policy does besides scoring: budgets per layer, per head, and what happens to the kept tokens."""

    schedule: Schedule
    allocation: Allocation
    merge: Merge
    key_pruning: KeyPruning


def resolve_stages(policy: PolicyKnobs) -> Stages:
    """The stages ``policy``'s knobs name, each checked by its own module, then the rules across stages."""
    owner = type(policy).__name__
    schedule = schedule_of(owner, policy.schedule, policy.beta)
    stages = Stages(
        schedule=schedule,
        allocation=allocation_of(
            owner,
            policy.allocation,
            policy.floor,
            policy.allocation_normalize,
            policy.head_scores,
            policy.head_beta,
            policy.gqa,
            policy.fraction_counted_per_layer and not schedule.varies_by_layer,  # a pyramid's layers: their own keep
        ),
        merge=merge_of(owner, policy.merge, policy.merge_start, policy.merge_seed),
        key_pruning=key_pruning_of(owner, policy.think_ratio, policy.think_recent),
    )
    check_combination(owner, stages, policy)
    return stages


def check_combination(owner: str, stages: Stages, policy: PolicyKnobs) -> None:
    """Refuse stages that cannot work together, or with a policy that keeps everything or cannot rank heads.

    ``policy.evicts`` is read only where a stage needs eviction (for ``policy=kvpress`` asking it imports kvpress).
    """
    if (stages.merge.active or stages.key_pruning.active) and not policy.evicts:
        raise ValueError(
            f"{owner} keeps every token: {stages.merge.setting} and {stages.key_pruning.setting} need eviction"
        )
    if stages.key_pruning.active and stages.allocation.headwise:
        raise NotImplementedError(
            f"{owner}.{stages.key_pruning.setting} with {stages.allocation.setting} is not built: ThinK prunes dense "
            "caches (every head the same length); use allocation='uniform'"
        )
    if stages.allocation.headwise and not (policy.allows_allocation and policy.evicts):
        raise ValueError(
            f"{owner}.{stages.allocation.setting} is not allowed: {owner} cannot share a budget across heads (it keeps "
            "everything, or its scores are the same for every head); use allocation='uniform'"
        )
    if stages.allocation.across_layers and stages.schedule.varies_by_layer:
        raise ValueError(
            f"{owner}.{stages.allocation.setting} shares one budget by all layers from their scores, so "
            f"{stages.schedule.setting} cannot apply; use schedule='uniform'"
        )
    if stages.allocation.fixed_per_head and stages.schedule.varies_by_layer:
        raise ValueError(
            f"{owner}.{stages.allocation.setting} fixes every (layer, head)'s budget from the head file, so "
            f"{stages.schedule.setting} cannot apply; use schedule='uniform'"
        )
