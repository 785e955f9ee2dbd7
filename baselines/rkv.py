"""R-KV (Cai et al., 2025): keep what the recent tokens attend to, minus what other tokens already repeat.

Built for reasoning traces, where a long answer says the same thing many times: R-KV cuts the cache during
decoding (``compression.phase=decode``, `restkv.decoding.eviction`) and scores every cached token, as its
authors' code does (``Zefan-Cai/R-KV``, ``rkv/compression/r1_kv.py`` and ``rkv/utils.py``):

- importance: the last ``window`` (8) queries' attention over the tokens before them, the logits of a
  key/value head's query group reduced by their maximum before the softmax, averaged over the queries and
  max-pooled along positions (kernel 7);
- redundancy: each key's mean cosine similarity to every cached key (itself excluded, and its most recent
  near-duplicate above ``threshold`` 0.5 excluded, so the newest copy of a repeated token survives), turned
  into a distribution over the cache by a softmax;
- the score ``mix_lambda * importance - (1 - mix_lambda) * redundancy``; the window is always kept.

``mix_lambda`` is 0.07, their script's default (their README's table says 0.1). The similarity matrix is
``L x L`` per key/value head: cheap at decode-time budgets, large on a long prompt evicted at prefill.

``cache_order`` says in which order a cut leaves the cache: ``score`` (the default, as the authors' ``update_kv``
does) keeps the past tokens in descending score order, then the window; the next cut's max-pooling and its
"newest copy" rule then read that order as neighbourhood and recency, as theirs do. ``position`` keeps tokens in
prompt order, so that pooling pools real neighbours (a cleaner reading of the method; the same first cut). With
``compression.decode_schedule=length`` and ``decode_interval=128`` (preset ``experiment=rivals/rkv_authors``) a run cuts
when the authors' loop cuts; the recorded cases of `tests/test_rival_golden.py` replay their loop cut for cut.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from restkv import spatial
from restkv.checks import check_choice, check_number
from restkv.head_selection import HeadSelection
from restkv.policy import LayerInputs, Policy
from restkv.registry import register_policy
from restkv.select import Budget, keep_in_score_order, reduce_groups

CACHE_ORDERS = ("score", "position")


def rkv_importance(inputs: LayerInputs, window: int, kernel: int) -> torch.Tensor:
    """Attention of the last ``window`` queries over the tokens before them, per key/value head: ``[b, h_kv, P]``."""
    queries, keys = inputs.queries[..., -window:, :], inputs.keys
    b, heads, w, d = queries.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    grouped = queries.float().reshape(b, kv_heads, heads // kv_heads, w, d)
    logits = grouped @ keys.float().unsqueeze(2).transpose(-1, -2)
    if inputs.scaling is None or inputs.scaling == d**-0.5:
        logits = logits / math.sqrt(d)  # the authors' arithmetic, to the last bit (their models scale so)
    else:
        logits = logits * inputs.scaling  # a model with its own scaling (Gemma's query_pre_attn_scalar)
    logits = logits.amax(dim=2)  # [b, kv, w, L]
    if inputs.softcap is not None:
        logits = torch.tanh(logits / inputs.softcap) * inputs.softcap
    attention = logits[..., : length - window].softmax(dim=-1).mean(dim=-2)
    return spatial.maxpool(attention, kernel)


def rkv_redundancy(keys: torch.Tensor, window: int, threshold: float) -> torch.Tensor:
    """Each past token's share of the cache's mutual key similarity: ``[b, h_kv, P]`` (sums to < 1 over P)."""
    unit = keys.float() / (keys.float().norm(dim=-1, keepdim=True) + 1e-8)
    similarity = unit @ unit.transpose(-1, -2)  # [b, kv, L, L]
    similarity.diagonal(dim1=-2, dim2=-1).zero_()
    positions = torch.arange(similarity.shape[-1], device=keys.device)
    newest_twin = ((similarity > threshold) * positions).argmax(dim=-1, keepdim=True)  # 0 when there is none
    similarity.scatter_(-1, newest_twin, 0.0)
    return similarity.mean(dim=-2).softmax(dim=-1)[..., : keys.shape[2] - window]


@register_policy("rkv")
@dataclass
class RKV(Policy):
    """R-KV with its authors' defaults: window 8, max-pooling kernel 7, ``mix_lambda`` 0.07, similarity threshold
    0.5; one selection per key/value head (the group's logits reduced by their maximum: ``gqa`` stays ``max``)."""

    window: int = 8
    gqa: str = "max"
    kernel: int = 7
    mix_lambda: float = 0.07
    threshold: float = 0.5
    cache_order: str = "score"

    knobs_before_they_existed: ClassVar[dict[str, Any]] = {"cache_order": "position"}

    def validate(self) -> None:
        super().validate()
        owner = type(self).__name__
        check_number(owner, "kernel", self.kernel, low=1, low_open=False, integer=True)
        check_number(owner, "mix_lambda", self.mix_lambda, low=0, high=1, low_open=False)
        check_number(owner, "threshold", self.threshold, low=-1, high=1, low_open=False)
        check_choice(owner, "cache_order", self.cache_order, CACHE_ORDERS)
        if self.kernel % 2 == 0:
            raise ValueError(f"{owner}.kernel={self.kernel} is not allowed; the pooling kernel must be odd")
        if self.gqa != "max":
            raise ValueError(
                f"{owner}.gqa={self.gqa!r} is not allowed: R-KV reduces a query group's logits by their maximum "
                "before the softmax, so gqa stays 'max'"
            )

    def score(self, inputs: LayerInputs, keep: int) -> torch.Tensor:
        """Scores ``[b, h_kv, P]`` (one per key/value head)."""
        importance = rkv_importance(inputs, self.window, self.kernel)
        redundancy = rkv_redundancy(inputs.keys, self.window, self.threshold)
        return self.mix_lambda * importance - (1 - self.mix_lambda) * redundancy

    def select(self, inputs: LayerInputs, budget: Budget) -> torch.Tensor | HeadSelection | None:
        """As `Policy.select`; under ``cache_order='score'`` the kept past tokens come in descending score order,
        and a cache that holds exactly the budget is still re-ranked (the authors cut from ``length >= budget``)."""
        if self.cache_order == "position" or self.stages.allocation.headwise or not self.evicts:
            return super().select(inputs, budget)
        scored = self.layer_scores(inputs, budget)
        if scored is None:
            if self.check_budget(budget, inputs.length) != inputs.length:
                return None  # a cache below the budget is left as it is
            scores = reduce_groups(self.score(inputs, inputs.length), inputs.num_kv_heads, self.gqa)
            scored = scores, inputs.length
        scores, keep = scored
        return keep_in_score_order(scores, keep, self.window)
