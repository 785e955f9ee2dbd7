"""The budget schedule across layers, a policy stage: how many tokens each layer keeps.

``schedule='uniform'`` keeps the budget in every layer; ``schedule='pyramid'`` is PyramidKV's
per-layer progression (``beta``), combinable with any scorer. `schedule_of` resolves the knobs
into a stage object once, with its checks; the policy asks it `layer_keep` per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from restkv.checks import check_choice, check_number

SCHEDULES = ("uniform", "pyramid")


class Schedule(Protocol):
    """Tokens each layer keeps (window included) from the prompt's token budget."""

    setting: str
    """The knobs that chose it, as a user would write them (for messages)."""
    varies_by_layer: bool

    def layer_keep(self, prompt_length: int, tokens: int, window: int, layer: int, num_layers: int) -> int: ...


@dataclass(frozen=True)
class UniformSchedule:
    """Every layer keeps the budget (or the whole prompt when it is shorter)."""

    setting: str = "schedule='uniform'"
    varies_by_layer: bool = False

    def layer_keep(self, prompt_length: int, tokens: int, window: int, layer: int, num_layers: int) -> int:
        return min(tokens, prompt_length)


@dataclass(frozen=True)
class PyramidSchedule:
    """PyramidKV's budgets, decreasing with depth (`pyramid_budgets`)."""

    beta: float
    varies_by_layer: bool = True

    @property
    def setting(self) -> str:
        return "schedule='pyramid'"

    def layer_keep(self, prompt_length: int, tokens: int, window: int, layer: int, num_layers: int) -> int:
        return pyramid_budgets(prompt_length, tokens, window, self.beta, num_layers)[layer]


def schedule_of(owner: str, schedule: str, beta: float) -> Schedule:
    """The stage the knobs ``schedule`` and ``beta`` of policy ``owner`` name; a bad value is refused by name."""
    check_choice(owner, "schedule", schedule, SCHEDULES)
    check_number(owner, "beta", beta, low=0)
    return PyramidSchedule(beta) if schedule == "pyramid" else UniformSchedule()


def pyramid_budgets(prompt_length: int, budget: int, window: int, beta: float, num_layers: int) -> list[int]:
    """PyramidKV's per-layer token counts (window included), as the reference code computes them.

    The layers share ``num_layers * (budget - window)`` past tokens in an arithmetic
    progression from ``2 * (budget - window) - min`` (first layer) down towards
    ``min = (budget - window) // beta``; the top is capped at the prompt's past length. Prompts
    shorter than ``budget`` are not compressed, and prompts shorter than
    ``2 * (budget - window)`` keep ``budget`` in every layer.
    """
    if prompt_length <= budget:
        return [prompt_length] * num_layers
    past_budget = budget - window
    if prompt_length < 2 * past_budget or num_layers == 1:
        return [budget] * num_layers
    low = int(past_budget // beta)
    high = 2 * past_budget - low
    if high >= prompt_length - window:
        high = prompt_length - window
        low = 2 * past_budget - high
    step = (high - low) // (num_layers - 1)
    return [high - layer * step + window for layer in range(num_layers)]
