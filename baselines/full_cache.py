"""The full cache: no eviction, the reference every policy is compared with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from restkv.policy import Policy
from restkv.registry import register_policy


@register_policy("full")
@dataclass
class FullCache(Policy):
    """Keeps every token; the budget is ignored."""

    evicts: ClassVar[bool] = False
