"""PyramidKV (Cai et al., 2024): SnapKV scores with a budget that shrinks layer by layer."""

from __future__ import annotations

from dataclasses import dataclass

from restkv.baselines.snapkv import SnapKV
from restkv.registry import register_policy, register_preset


@register_policy("pyramidkv")
@dataclass
class PyramidKV(SnapKV):
    """SnapKV with PyramidKV's per-layer schedule (``beta`` sets the slope).

    The schedule alone combines with any scorer: ``ReSTKV(schedule="pyramid")``.
    """

    schedule: str = "pyramid"
    beta: float = 20.0


# Ada-PyramidKV: the layer schedule and AdaKV's head-wise allocation together
register_preset("ada_pyramidkv", "pyramidkv", allocation="adakv")
