"""CAOTE (Goel et al., 2025): evict the tokens whose removal changes the attention output least, without ``W_o``.

Removing token ``j`` renormalises the others, so the head's output moves by ``a_j / (1 - a_j) * ||o - v_j||``.
That is ReST-KV's indicator without the output projection (``use_wo=False``): the row that shows what ``W_o``
adds. Applied to a base method's scores, CAOTE first divides them by their sum, and uses the result both as
the weights and to rebuild the output ``o``; here the base is the window's attention averaged over its
queries (SnapKV-CAOTE, so ``o`` is the window's average output), past tokens only, with no smoothing.

Which variant runs: the end-of-prefill one. The paper (arXiv 2504.14051) processes a long prompt block by block
and evicts as the cache fills, so each block is scored against an already compressed cache; here, as for every
other policy of this harness, the whole prompt is prefilled and evicted once at its end, from the same scores.
By default results of ``policy=caote`` are the end-of-prefill variant's. ``compression.prefill_chunk=N``
(`restkv.chunked_prefill`) gives the block-wise protocol's shape: the prompt prefilled N tokens at a time, each
block attending to and scored against the cache already compressed, CAOTE's scores over what each layer holds
with the block's last ``window`` queries, cut to the budget after every block. Whether its block size and the
queries that score a block are the paper's cannot be checked: the authors' code is not public, so no recorded
call is replayed; `tests/test_defensivekv.py` checks the scores against the written equation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from restkv import scoring
from restkv.policy import LayerInputs
from restkv.registry import register_policy
from restkv.scoring_policy import ScoringPolicy


@register_policy("caote")
@dataclass
class CAOTE(ScoringPolicy):
    """CAOTE on window attention: ``h / (1 - h) * ||o - v||`` with ``h`` the window's mean attention over the past
    tokens divided by its sum (``normalize_base``) and ``o = sum_j h_j v_j``; no spatial smoothing."""

    indicator: str = "reconstruction"
    temporal: str = "mean"
    use_wo: bool = False
    spatial: str = "none"
    normalize_base: bool = True

    def indicator_scores(self, attention: torch.Tensor, inputs: LayerInputs) -> torch.Tensor:
        if not (self.normalize_base and self.indicator == "reconstruction" and self.order == "after"):
            return super().indicator_scores(attention, inputs)
        past = inputs.length - self.window
        weights = scoring.aggregate(attention[..., :past], self.temporal, self.alpha)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return self._raised(scoring.reconstruction_after(weights, inputs.values, self.gram_of(inputs), self.tau))
