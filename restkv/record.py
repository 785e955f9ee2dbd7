"""What a prefill under compression did, per layer: `PrefillRecord`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from restkv.stages.allocation import HeadSelection
from restkv.storage.layouts import LayerSize


@dataclass
class PrefillRecord:
    """What the last prefill under compression did.

    Per layer: ``kept``, the tokens each head keeps (the mean over heads, rounded to 2 decimals,
    where heads keep different numbers); ``head_lengths``, each stored head's count under a
    head-wise allocation (None where all heads keep ``kept``); ``indices``, the kept positions
    (``[b, heads, kept]``, a `restkv.stages.allocation.HeadSelection` for head-wise ones, None where the
    layer was not compressed); ``sizes``, the cache's logical and allocated size after eviction
    (`restkv.storage.layouts.LayerSize`, decode reserve included in the allocated bytes).
    """

    prompt_length: int = 0
    kept: list[int | float] = field(default_factory=list)
    head_lengths: list[list[int] | None] = field(default_factory=list)
    indices: list[torch.Tensor | HeadSelection | None] = field(default_factory=list)
    sizes: list[LayerSize] = field(default_factory=list)
    eviction_seconds: float | None = None
    """Device time of eviction over all layers; None unless the compressor is ``timed``."""
    scoring_forwards: int = 0
    """Extra forwards a scoring-pass policy ran after the prefill (`restkv.scoring_pass`; 0 for the others)."""
    scoring_tokens: int = 0
    """Tokens those forwards fed."""
    scoring_seconds: float | None = None
    """Their time, the device synchronised around them (None without a scoring pass)."""
    notes: dict[str, Any] = field(default_factory=dict)
    """What else the run's records should say of this prefill (the kvpress route that ran, `restkv.interop`)."""

    def scoring_summary(self) -> dict[str, Any]:
        """The scoring pass's forwards, tokens and seconds, for result files; empty without a scoring pass."""
        if not self.scoring_forwards:
            return {}
        seconds = None if self.scoring_seconds is None else round(self.scoring_seconds, 6)
        return {
            "scoring_pass_forwards": self.scoring_forwards,
            "scoring_pass_tokens": self.scoring_tokens,
            "scoring_pass_seconds": seconds,
        }

    def extras(self) -> dict[str, Any]:
        """`scoring_summary` and ``notes``, for each sample's record."""
        return {**self.scoring_summary(), **self.notes}

    def size_summary(self) -> dict[str, Any]:
        """Totals over layers and the per-layer sizes, for result files."""
        return {
            "head_tokens": sum(s.head_tokens for s in self.sizes),
            "logical_bytes": sum(s.logical_bytes for s in self.sizes),
            "allocated_bytes": sum(s.allocated_bytes for s in self.sizes),
            "per_layer": [s.as_dict() for s in self.sizes],
        }
