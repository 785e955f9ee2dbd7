"""AdaKV (Feng et al., 2024): SnapKV-style scores with the layer's budget shared unevenly by heads."""

from __future__ import annotations

from dataclasses import dataclass

from restkv.registry import register_policy
from restkv.scoring_policy import ScoringPolicy


@register_policy("adakv")
@dataclass
class AdaKV(ScoringPolicy):
    """The ReST-KV authors' AdaKV: mean window attention, pooled, under the ``adakv`` allocation.

    Their run scripts' defaults: average pooling with kernel 5, ``floor`` 0.2, ``normalize`` on
    (here ``allocation_normalize``). The allocation alone combines with any scorer:
    ``policy=restkv policy.allocation=adakv`` is Ada-ReST-KV, ``policy=snapkv
    policy.allocation=adakv`` Ada-SnapKV, ``policy=pyramidkv policy.allocation=adakv`` Ada-PyramidKV.
    """

    indicator: str = "attention"
    temporal: str = "mean"
    spatial: str = "avgpool"
    kernel: int = 5
    allocation: str = "adakv"
