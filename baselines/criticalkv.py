"""CriticalKV and CriticalAdaKV (Feng et al., 2025): attention weighted by ``||W_o^h v||_1``, in two stages.

CriticalKV bounds the change of a head's projected output when tokens are evicted: both the
attention a token gets and how far its value moves the output through ``W_o`` count. Its
selection, as its authors' code and kvpress run it: a head's first ``first_stage`` share of its
budget goes to the tokens with the highest base score (any scorer's; SnapKV's by default), the
rest to the highest ``(score + epsilon) * ||W_o^h v_j||_1`` among the others. Under
``allocation='adakv'`` (CriticalAdaKV) the head budgets come from the base scores, then each head
runs the two stages on its own budget. With grouped key/value heads the scores and the norms are
reduced over the group (``gqa``), as one selection is made per key/value head.

Differences from kvpress's CriticalKVPress: its first stage counts ``int(kept x first_stage)``
with the window inside ``kept``, where here the window is kept apart and the share is of the past
budget; it floors the first stage to one token, here ``int`` of the share may be 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from restkv.checks import check_number
from restkv.policy import LayerInputs
from restkv.registry import register_policy, register_preset
from restkv.scoring_policy import ScoringPolicy
from restkv.select import Budget, keep_indices, leading, reduce_groups
from restkv.stages.allocation import HeadSelection, top_positions


def projected_value_norms(values: torch.Tensor, weight: torch.Tensor, heads: int, past: int) -> torch.Tensor:
    """``||W_o^h v_j||_1`` of past tokens for every query head ``[b, h, P]`` (``weight``: ``[hidden, h * d]``)."""
    kv_heads, dim = values.shape[1], values.shape[3]
    per_head = weight.float().view(weight.shape[0], heads, dim)  # [hidden, h, d]
    v = values[:, :, :past].float()
    norms = [v[:, head * kv_heads // heads] @ per_head[:, head].T for head in range(heads)]  # [b, P, hidden] each
    return torch.stack([n.abs().sum(dim=-1) for n in norms], dim=1)


def two_stage(base: torch.Tensor, weighted: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """Scores ``[H, P]`` ranking each head's top ``first[h]`` base scores first, then by ``weighted``."""
    return torch.where(leading(base, first), torch.full_like(weighted, float("inf")), weighted)


@register_policy("criticalkv")
@dataclass
class CriticalKV(ScoringPolicy):
    """SnapKV's scores (window attention summed, average-pooled, kernel 5) re-ranked by CriticalKV's two stages;
    ``first_stage`` is the share of each head's budget chosen by the base score, ``epsilon`` keeps tokens of
    zero score comparable."""

    indicator: str = "attention"
    temporal: str = "sum"
    spatial: str = "avgpool"
    kernel: int = 5
    first_stage: float = 0.5
    epsilon: float = 1e-4

    def validate(self) -> None:
        super().validate()
        owner = type(self).__name__
        check_number(owner, "first_stage", self.first_stage, low=0, high=1, low_open=False)
        check_number(owner, "epsilon", self.epsilon, low=0, low_open=False)

    def select(self, inputs: LayerInputs, budget: Budget) -> torch.Tensor | HeadSelection | None:
        keep = self.layer_keep(inputs.length, budget, inputs.layer, inputs.num_layers)
        if keep >= inputs.length:
            return None
        if inputs.output_weight is None:
            raise ValueError(f"{type(self).__name__} needs the layer's output projection (LayerInputs.output_weight)")
        if inputs.queries.shape[0] != 1:
            raise NotImplementedError(f"{type(self).__name__} runs on batch size 1; got {inputs.queries.shape[0]}")
        past, base_budget = inputs.length - self.window, keep - self.window
        base = reduce_groups(self.score(inputs, keep), inputs.num_kv_heads, self.gqa)[0]  # [H, P]
        norms = projected_value_norms(inputs.values, inputs.output_weight(), inputs.num_heads, past)
        norms = reduce_groups(norms, inputs.num_kv_heads, "mean" if self.gqa == "max" else self.gqa)[0]
        allocation = self.stages.allocation  # head budgets from the base scores
        capacities = allocation.capacities(base, base_budget, inputs, budget)
        scores = two_stage(base, (base + self.epsilon) * norms, (capacities * self.first_stage).long())
        if not allocation.headwise:
            return keep_indices(scores.unsqueeze(0), keep, self.window)
        return top_positions(scores, capacities, self.window)


# CriticalAdaKV: CriticalKV's two stages on AdaKV's head budgets (shared out from the base scores)
register_preset("critical_adakv", "criticalkv", allocation="adakv")
