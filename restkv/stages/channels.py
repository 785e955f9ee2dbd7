"""Key-channel pruning on top of any token policy: ThinK (Xu et al., 2024), query-driven.

ThinK as the ReST-KV authors run it (their ``key_pruner_query_driven``, applied to the tokens a
token policy kept): each channel of each head scores ``mean(q^2 over the last 32 queries) x
mean(k^2 over the kept keys)``; the ``int(d * ratio)`` lowest-scoring channels are dropped from the
keys of every kept token but the last ``recent`` ones, which keep every channel.

Here the dropped channels are set to zero in place rather than cut out: a query's dot product with
a zero-filled key is exactly its dot product over the kept channels, so attention is that of
ThinK, with no kernel of its own. The price is honesty about memory: zero-filled channels still
occupy their bytes. The integration reports them (`restkv.storage.layouts.LayerSize.pruned_bytes`) and
leaves them out of the logical size, never out of the allocated one. `key_pruning_of` resolves a
policy's knobs (``think_ratio``, ``think_recent``) into the stage, `KeyPruning`, once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from restkv.checks import check_number

THINK_QUERIES = 32
"""Queries whose squared channels score the keys' channels (the authors' fixed 32)."""


def pruned_channels(head_dim: int, ratio: float) -> int:
    """Channels dropped per head: ``int(head_dim * ratio)``."""
    return int(head_dim * ratio)


def channel_mask(queries: torch.Tensor, keys: torch.Tensor, ratio: float) -> torch.Tensor:
    """Kept channels ``[b, heads, d]`` (True = kept) for ``keys`` ``[b, heads, n, d]``.

    ``queries`` ``[b, h, q, d]`` (the last `THINK_QUERIES` are read) may have more heads than the
    keys (grouped key/value heads): a key head's query score is then its group's mean.
    """
    query_energy = queries[..., -THINK_QUERIES:, :].pow(2).mean(dim=2)  # [b, h, d]
    heads = keys.shape[1]
    if query_energy.shape[1] != heads:
        query_energy = query_energy.view(query_energy.shape[0], heads, -1, query_energy.shape[-1]).mean(dim=2)
    score = query_energy * keys.pow(2).mean(dim=2)
    dropped = score.topk(pruned_channels(keys.shape[-1], ratio), dim=-1, largest=False).indices
    mask = torch.ones(score.shape, dtype=torch.bool, device=keys.device)
    return mask.scatter_(-1, dropped, False)


def prune_keys(keys: torch.Tensor, queries: torch.Tensor, ratio: float, recent: int) -> tuple[torch.Tensor, int]:
    """Zero, in place, the dropped channels of all of ``keys`` ``[b, heads, n, d]`` but the last ``recent``.

    Returns the channel mask ``[b, heads, d]`` and the number of zeroed entries.
    """
    mask = channel_mask(queries, keys, ratio)
    pruned_tokens = max(keys.shape[2] - recent, 0)
    if pruned_tokens:
        keys[:, :, :pruned_tokens] *= mask.unsqueeze(2).to(keys.dtype)
    return mask, pruned_tokens * int((~mask).sum())


@dataclass(frozen=True)
class KeyPruning:
    """ThinK on a dense layer's kept keys: ``ratio`` of the channels dropped (0 = off) but for the last ``recent``."""

    ratio: float = 0.0
    recent: int = 32

    @property
    def active(self) -> bool:
        return self.ratio > 0

    @property
    def setting(self) -> str:
        return f"think_ratio={self.ratio}"

    def queries_needed(self, window: int) -> int:
        """The last prompt queries a layer must keep for the policy's window and this stage's channel scores."""
        return max(window, THINK_QUERIES) if self.active else window

    def check_layout(self, layout: str) -> None:
        """Refuse a layout whose layers are not dense (ThinK prunes dense layers only)."""
        if self.active and layout != "auto":
            raise ValueError(
                f"think_ratio={self.ratio} prunes key channels of dense layers; layout={layout!r} is not dense: "
                "use layout='auto'"
            )

    def prune(self, kept_keys: torch.Tensor, queries: torch.Tensor) -> int:
        """Prune a dense layer's kept keys ``[1, heads, n, d]`` in place; returns the entries zero-filled."""
        return prune_keys(kept_keys, queries, self.ratio, self.recent)[1] if self.active else 0


def key_pruning_of(owner: str, ratio: float, recent: int) -> KeyPruning:
    """The stage the ThinK knobs of policy ``owner`` name; a bad value is refused by name."""
    check_number(owner, "think_ratio", ratio, low=0, high=1, low_open=False, high_open=True)
    check_number(owner, "think_recent", recent, low=0, low_open=False, integer=True)
    return KeyPruning(ratio, recent)
