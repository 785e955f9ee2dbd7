"""ReST-KV (An et al., ICLR 2026): evict the tokens whose removal changes the layer output least."""

from __future__ import annotations

from dataclasses import dataclass

from restkv.registry import register_policy
from restkv.scoring_policy import ScoringPolicy


@register_policy("restkv")
@dataclass
class ReSTKV(ScoringPolicy):
    """ReST-KV with the paper's defaults.

    Output-reconstruction indicator through ``W_o`` (``tau`` 1), attention aggregated over the
    32-query window by an EMA with ``alpha`` 0.3 before scoring (``after`` order), adaptive
    spatial smoothing with ``scale`` 2000 and minimum kernel 5. Every knob of `ScoringPolicy`
    stays available for ablations. (These are `ScoringPolicy`'s defaults; this class gives them
    the paper's name.)
    """
