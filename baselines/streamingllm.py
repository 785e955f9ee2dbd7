"""StreamingLLM (Xiao et al., 2024): attention sinks plus the most recent tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from restkv.checks import check_choice, check_number
from restkv.policy import LayerInputs, Policy
from restkv.registry import register_policy, register_preset

VARIANTS = ("sinks", "prefix")


@register_policy("streamingllm")
@dataclass
class StreamingLLM(Policy):
    """Position-only eviction; no attention is read.

    ``variant='sinks'`` (the StreamingLLM paper): the first ``sinks`` tokens plus the most
    recent ones. ``variant='prefix'`` (what the ReST-KV authors' framework runs): the first
    ``budget - window`` tokens plus the window.
    """

    variant: str = "sinks"
    sinks: int = 4

    allows_allocation: ClassVar[bool] = False  # every head has the same scores

    def validate(self) -> None:
        super().validate()
        check_choice(type(self).__name__, "variant", self.variant, VARIANTS)
        check_number(type(self).__name__, "sinks", self.sinks, low=0, low_open=False, integer=True)

    def score(self, inputs: LayerInputs, keep: int) -> torch.Tensor:
        past = inputs.length - self.window
        position = torch.arange(past, device=inputs.keys.device, dtype=torch.float32)
        # "prefix": earliest first; "sinks": the sinks first, then the most recent
        scores = -position if self.variant == "prefix" else torch.where(position < self.sinks, past + 1.0, position)
        b, h = inputs.queries.shape[:2]
        return scores.expand(b, h, past)


# The ReST-KV authors' Needle-in-a-Haystack script gives StreamingLLM a 32-token window (their LongBench,
# RULER and InfiniteBench drivers use budget - 4, which is variant="sinks" with 4 sinks).
register_preset("streamingllm_niah", "streamingllm", variant="prefix")
