"""Where a run stands in its stages, and what follows from it: stage lengths, learning rate, task mixture.

Every function takes the run's stages explicitly (a recipe's, possibly scaled or reduced by
:class:`~restkv.microtrain.options.RunOptions`) with the :class:`State`, which a checkpoint stores.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from restkv.microtrain.recipes import ADAPT_FROM, FINAL_LR_FRACTION, TASK_WEIGHTS, WARMUP, Stage


@dataclass
class State:
    """The run's position and history (saved in the checkpoint as a dict of these fields)."""

    step: int = 0
    stage: int = 0
    stage_step: int = 0
    final_steps: int = 0  # steps of a phase's final stage, fixed when it starts
    final_stage: int = -1  # the stage final_steps belongs to
    saved_seconds: float = 0.0  # estimated seconds of unused steps in earlier stages
    elapsed: float = 0.0  # training wall-clock seconds, over all sessions
    log: list[dict[str, Any]] = field(default_factory=list)


def stage_steps(stages: tuple[Stage, ...], state: State) -> int:
    """Steps of the current stage: a phase's final stage also gets the unused time of earlier ones."""
    stage = stages[min(state.stage, len(stages) - 1)]
    return state.final_steps if stage.final and state.final_stage == state.stage else stage.max_steps


def lr_at(stages: tuple[Stage, ...], state: State) -> float:
    """The learning rate of the current step: linear warm-up, then the stage's rate (cosine-decayed if set)."""
    stage = stages[min(state.stage, len(stages) - 1)]
    if state.step < WARMUP:
        return stage.lr * (state.step + 1) / WARMUP
    if stage.cosine:
        progress = min(1.0, state.stage_step / stage_steps(stages, state))
        return stage.lr * (FINAL_LR_FRACTION + (1 - FINAL_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress)))
    return stage.lr


def task_weights(stages: tuple[Stage, ...], state: State, length: int) -> dict[str, float]:
    """:data:`~restkv.microtrain.recipes.TASK_WEIGHTS`, scaled from stage
    :data:`~restkv.microtrain.recipes.ADAPT_FROM` on.

    A task's weight is multiplied by ``0.25 + 1.5 * (1 - exact)``, ``exact`` being its latest
    held-out exact match at ``length`` (at any length if there is none yet): mastered tasks keep a
    quarter of their share, failing ones get up to 1.75 times theirs. The log lives in the
    checkpoint, so this is as deterministic as the rest.
    """
    names = [s.name for s in stages]
    if ADAPT_FROM not in names or state.stage < names.index(ADAPT_FROM):
        return dict(TASK_WEIGHTS)
    latest: dict[str, float] = {}
    at_length: dict[str, float] = {}
    for row in state.log:
        if row.get("kind") in ("heldout", "sweep") and "exact" in row:
            latest[row["task"]] = row["exact"]
            if row["length"] == length:
                at_length[row["task"]] = row["exact"]
    weights = {}
    for task, weight in TASK_WEIGHTS.items():
        exact = at_length.get(task, latest.get(task))
        weights[task] = weight if exact is None else weight * (0.25 + 1.5 * (1 - exact))
    return weights


def pick_tasks(rng: random.Random, count: int, weights: dict[str, float] | None = None) -> list[str]:
    """``count`` task names drawn from ``weights`` (default: the default mixture), with replacement."""
    weights = weights or TASK_WEIGHTS
    names = list(weights)
    return rng.choices(names, weights=[weights[n] for n in names], k=count)


def begin_stage(stages: tuple[Stage, ...], state: State, final_steps: int | None = None) -> None:
    """A phase's final stage takes over the estimated time left unused by the phase's earlier stages.

    ``final_steps`` (``--final-steps``) sets its length instead, e.g. to fit the time left.
    """
    if state.stage < len(stages) and stages[state.stage].final:
        last = stages[state.stage]
        state.final_steps = final_steps or last.max_steps + int(state.saved_seconds / last.seconds_per_step)
        state.final_stage = state.stage
        state.saved_seconds = 0.0
        print(f"final stage of the phase: {state.final_steps} steps", flush=True)
    print(f"=== stage {stages[state.stage].name} at step {state.step}", flush=True)
