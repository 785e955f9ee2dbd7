"""CAM (Zhang et al., 2024) as the ReST-KV authors run it: SnapKV-style selection, values merged before it."""

from __future__ import annotations

from dataclasses import dataclass

from restkv.registry import register_policy
from restkv.scoring_policy import ScoringPolicy


@register_policy("cam")
@dataclass
class CAM(ScoringPolicy):
    """Past tokens ranked by the window's attention summed over its queries (no pooling, as the authors'
    ``CAMKVCluster``); values merged by CAM's random merging (`restkv.stages.merge`) before the kept ones are stored.

    Any scorer merges the same way with ``merge='cam'`` (e.g. ``policy=restkv policy.merge=cam``).
    """

    indicator: str = "attention"
    temporal: str = "sum"
    spatial: str = "none"
    merge: str = "cam"
