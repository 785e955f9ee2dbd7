"""R-KV (Cai et al., 2025): keep what the recent tokens attend to, minus what other tokens already repeat.

Built for reasoning traces, where a long answer says the same thing many times: R-KV cuts the cache during
decoding (``compression.phase=decode``, `restkv.decode_eviction`) and scores every cached token, as its
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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from restkv import scoring
from restkv.checks import check_number
from restkv.policy import LayerInputs, Policy
from restkv.registry import register_policy


def rkv_importance(inputs: LayerInputs, window: int, kernel: int) -> torch.Tensor:
    """Attention of the last ``window`` queries over the tokens before them, per key/value head: ``[b, h_kv, P]``."""
    queries, keys = inputs.queries[..., -window:, :], inputs.keys
    b, heads, w, d = queries.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    scaling = d**-0.5 if inputs.scaling is None else inputs.scaling
    grouped = (queries.float() * scaling).reshape(b, kv_heads, heads // kv_heads, w, d)
    logits = (grouped @ keys.float().unsqueeze(2).transpose(-1, -2)).amax(dim=2)  # [b, kv, w, L]
    if inputs.softcap is not None:
        logits = torch.tanh(logits / inputs.softcap) * inputs.softcap
    attention = logits[..., : length - window].softmax(dim=-1).mean(dim=-2)
    return scoring.maxpool(attention, kernel)


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

    def validate(self) -> None:
        super().validate()
        owner = type(self).__name__
        check_number(owner, "kernel", self.kernel, low=1, low_open=False, integer=True)
        check_number(owner, "mix_lambda", self.mix_lambda, low=0, high=1, low_open=False)
        check_number(owner, "threshold", self.threshold, low=-1, high=1, low_open=False)
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
