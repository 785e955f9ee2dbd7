"""DefensiveKV (Feng et al., ICLR 2026): score a token by its worst case over the window, not its average.

As its authors' code computes it (``FFY0/DefensiveKV``, ``efficient_defensivekv_press.py``), per layer:

1. the window's attention over the past tokens (softmax over all keys, window columns dropped),
   average-pooled along positions (kernel 5, zero padding counted), each query's row rescaled to
   its mass before pooling;
2. the *defensive* aggregation: the maximum over the window's queries and over the query heads of
   a key/value head's group, floored at that head's mean over the past tokens;
3. CriticalKV's value factor: ``||W_o^h v_j||_1``, averaged over the group, divided by its sum over
   the key/value heads for the same token (across heads, not across tokens: the authors' choice);
4. a first stage that protects, per head, the tokens holding the top ``protect_mass`` of the
   (group- and window-averaged, unpooled) attention, less the mass of the 32 tokens just before the
   window (the authors' code measures that slice, though it means the window), at most
   ``int((P) * keep / L - window)`` tokens, by raising them to the layer's top score;
5. one top-k over all heads x positions of the layer (``allocation='adakv'`` with no floor and no
   normalisation is exactly that), the window always kept; a fractional budget ``f`` keeps
   ``int(L * f * heads)`` tokens per layer, as the authors count it (``fraction_count='layer'``; ``'head'``:
   ``heads x round(f * L)``, what runs of earlier restkv versions did, and what a pyramid schedule always does).

Layer-DefensiveKV (preset ``layer_defensivekv``) is the same score under its authors' global selection
(``allocation='global_window'``): each layer's window ranked at the layer's top score, one top-k of
``int(L * f * heads * layers)`` over every layer, then each layer's own top-k of its share; a layer can lose its
window. Both replay calls recorded from the authors' code (`tests/test_rival_golden.py`, docs/fidelity.md).

Deliberate differences, each tested: scores stay float32 (the authors cast the attention to the
model's bfloat16 after the softmax); a first-stage cap below zero protects nothing (their slice with
a negative bound protects almost every token, on prompts shorter than about ``window / (keep / L)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from restkv import scoring, spatial
from restkv.baselines.criticalkv import projected_value_norms
from restkv.checks import check_choice, check_number
from restkv.policy import LayerInputs, Policy
from restkv.rankings import kept_share
from restkv.registry import register_policy, register_preset
from restkv.select import leading


def mass_preserving_pool(attention: torch.Tensor, kernel: int) -> torch.Tensor:
    """Average-pool each row of ``[b, h, w, P]`` along positions, rescaled to the row's mass before pooling."""
    b, h, w, past = attention.shape
    rows = attention.reshape(b, h * w, past)
    pooled = spatial.avgpool(rows, kernel)
    pooled = pooled / pooled.sum(dim=-1, keepdim=True) * rows.sum(dim=-1, keepdim=True)
    return pooled.view(b, h, w, past)


def first_stage_counts(mean_attention: torch.Tensor, threshold: float, cap: int) -> torch.Tensor:
    """Per head, how many top tokens of ``[b, H, P]`` come before the cumulative share reaches ``threshold``.

    The count is the first sorted index where the running share reaches the threshold (0 when it never does),
    capped at ``cap`` (below zero: 0).
    """
    share = mean_attention / mean_attention.sum(dim=-1, keepdim=True)
    running = share.sort(dim=-1, descending=True).values.cumsum(dim=-1)
    counts = (running >= threshold).int().argmax(dim=-1)
    return counts.clamp(max=max(cap, 0))


def protect_first_stage(scores: torch.Tensor, mean_attention: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``scores`` ``[b, H, P]`` with each head's top ``counts`` tokens by ``mean_attention`` raised to the maximum."""
    return torch.where(leading(mean_attention, counts), scores.max(), scores)


@register_policy("defensivekv")
@dataclass
class DefensiveKV(Policy):
    """DefensiveKV with its authors' defaults: window 32, pooling kernel 5, first stage protecting 90 % of the
    attention mass, the layer's budget shared by its heads with no floor (``allocation='adakv'``, ``floor`` 0)."""

    kernel: int = 5
    protect_mass: float = 0.9
    gqa: str = "max"
    allocation: str = "adakv"
    floor: float = 0.0
    allocation_normalize: bool = False
    fraction_count: str = "layer"

    knobs_before_they_existed: ClassVar[dict[str, Any]] = {"fraction_count": "head"}

    def validate(self) -> None:
        super().validate()
        owner = type(self).__name__
        check_number(owner, "kernel", self.kernel, low=1, low_open=False, integer=True)
        check_number(owner, "protect_mass", self.protect_mass, low=0, high=1, low_open=False)
        check_choice(owner, "fraction_count", self.fraction_count, ("layer", "head"))
        if self.gqa != "max":
            raise ValueError(
                f"{owner}.gqa={self.gqa!r} is not allowed: the defensive aggregation takes the maximum over a "
                "key/value head's query group before its floor, so gqa stays 'max'"
            )

    @property
    def fraction_counted_per_layer(self) -> bool:
        return self.fraction_count == "layer"

    def score(self, inputs: LayerInputs, keep: int) -> torch.Tensor:
        """Scores ``[b, h_kv, P]`` (one per key/value head: the group is reduced inside, before the floor)."""
        if inputs.output_weight is None:
            raise ValueError(f"{type(self).__name__} needs the layer's output projection (LayerInputs.output_weight)")
        past, kv_heads = inputs.length - self.window, inputs.num_kv_heads
        attention = scoring.window_attention(
            inputs.queries[..., -self.window :, :], inputs.keys, inputs.scaling, inputs.softcap
        )
        attention = attention[..., :past]  # [b, h, w, P]
        b, heads, w, _ = attention.shape
        grouped = attention.view(b, kv_heads, heads // kv_heads, w, past)
        pooled = mass_preserving_pool(attention, self.kernel).view(b, kv_heads, (heads // kv_heads) * w, past)
        scores = scoring.aggregate(pooled, "defensive", 0.0)  # the worst case over the group and the window
        norms = projected_value_norms(inputs.values, inputs.output_weight(), heads, past)
        norms = norms.view(b, kv_heads, heads // kv_heads, past).mean(dim=2)
        scores = scores * (norms / norms.sum(dim=1, keepdim=True))
        before_window = float(attention[..., max(past - self.window, 0) :].sum(dim=-1).mean())
        if inputs.fraction is not None and self.fraction_count == "layer":
            share = kept_share(inputs.fraction)  # the authors' arithmetic on their ratio
        else:
            share = keep / inputs.length
        cap = int(past * share - self.window)
        mean_attention = grouped.mean(dim=(2, 3))
        counts = first_stage_counts(mean_attention, self.protect_mass - before_window, cap)
        return protect_first_stage(scores, mean_attention, counts)


# Layer-DefensiveKV: the same scores, one ranking of every layer's tokens, windows included (its authors' selection)
register_preset("layer_defensivekv", "defensivekv", allocation="global_window")
