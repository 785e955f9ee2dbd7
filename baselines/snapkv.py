"""SnapKV (Li et al., 2024): keep the tokens the observation window attends to most."""

from __future__ import annotations

from dataclasses import dataclass

from restkv.registry import register_policy, register_preset
from restkv.scoring_policy import ScoringPolicy


@register_policy("snapkv")
@dataclass
class SnapKV(ScoringPolicy):
    """Window attention summed over the window's queries, smoothed by a centred average.

    As in the ReST-KV authors' framework: sum (not mean; the ranking is the same), average
    pooling with kernel 5 counting the zero padding; ``spatial='maxpool'`` gives the max-pooling
    variant.
    """

    indicator: str = "attention"
    temporal: str = "sum"
    spatial: str = "avgpool"
    kernel: int = 5


# Ada-SnapKV: the same scores under AdaKV's head-wise allocation
register_preset("ada_snapkv", "snapkv", allocation="adakv")
# ThinK on SnapKV, as the ReST-KV authors pair them: 40 % of key channels dropped, the last 32 kept tokens whole
register_preset("think", "snapkv", think_ratio=0.4)
