"""What a layer keeps when its heads keep different numbers of tokens: `HeadSelection`."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class HeadSelection:
    """Kept positions when heads keep different numbers of tokens (batch 1).

    ``positions`` is int64 ``[sum(lengths)]``: head 0's kept positions ascending, then head 1's...;
    ``lengths`` is int64 ``[heads]`` (window included). The same layout as AdaKV's flattened cache.
    """

    positions: torch.Tensor
    lengths: torch.Tensor

    def __post_init__(self) -> None:
        if self.positions.dim() != 1 or self.lengths.dim() != 1:
            raise ValueError("HeadSelection holds flat positions [sum(lengths)] and lengths [heads]")
        if int(self.lengths.sum()) != self.positions.numel():
            raise ValueError(
                f"HeadSelection: lengths sum to {int(self.lengths.sum())} but {self.positions.numel()} positions given"
            )

    @property
    def heads(self) -> int:
        return self.lengths.numel()

    @property
    def total(self) -> int:
        """Tokens kept over all heads."""
        return self.positions.numel()

    def per_head(self) -> list[torch.Tensor]:
        """Each head's kept positions, ascending."""
        return list(self.positions.split(self.lengths.tolist()))

    @classmethod
    def from_heads(cls, heads: list[torch.Tensor]) -> HeadSelection:
        lengths = torch.tensor([h.numel() for h in heads], dtype=torch.long, device=heads[0].device)
        return cls(torch.cat(heads).long(), lengths)
