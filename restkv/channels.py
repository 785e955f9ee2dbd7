"""Key-channel pruning on top of any token policy: ThinK (Xu et al., 2024), query-driven.

ThinK as the ReST-KV authors run it (their ``key_pruner_query_driven``, applied to the tokens a
token policy kept): each channel of each head scores ``mean(q^2 over the last 32 queries) x
mean(k^2 over the kept keys)``; the ``int(d * ratio)`` lowest-scoring channels are dropped from the
keys of every kept token but the last ``recent`` ones, which keep every channel.

Here the dropped channels are set to zero in place rather than cut out: a query's dot product with
a zero-filled key is exactly its dot product over the kept channels, so attention is that of
ThinK, with no kernel of its own. The price is honesty about memory: zero-filled channels still
occupy their bytes. The integration reports them (`restkv.layouts.LayerSize.pruned_bytes`) and
leaves them out of the logical size, never out of the allocated one.
"""

from __future__ import annotations

import torch

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
