"""ReST-KV as a kvpress press, for kvpress's pipeline and evaluation (needs kvpress installed).

    from kvpress import KVPressTextGenerationPipeline  # registers "kv-press-text-generation"
    from restkv.interop import ReSTKVPress
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    pipe(context, question=question, press=ReSTKVPress(compression_ratio=0.9))["answer"]

The press's scores are our policy's (`ReSTKV` by default; any policy of ours that implements
``score``: ``ReSTKVPress(policy=get_policy("snapkv"))``), computed from what kvpress hands a press:
the window's queries are rebuilt from the layer's input hidden states (its query projection, norm and
rotary embedding, as the model computes them), the keys and values are the layer's cache, ``keep`` is
kvpress's kept count ``int(L * (1 - compression_ratio))``. Scores are reduced to one per key/value head
(``policy.gqa``: ``mean`` or ``max``; kvpress keeps one selection per key/value head) and the window gets
a score above every other, so kvpress's top-k keeps the window plus the ``keep - window`` best past tokens:
the positions our policy keeps under `restkv.compress` with ``budget=keep``.
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass, field

import torch
from kvpress import ScorerPress
from kvpress.utils import get_prerope_query_states
from torch import nn

from restkv.interop import kvpress_kept
from restkv.policy import LayerInputs, Policy
from restkv.restkv import ReSTKV
from restkv.scoring import output_gram
from restkv.select import Budget, reduce_groups


def model_queries(module: nn.Module, hidden_states: torch.Tensor, position_embeddings: tuple, count: int):
    """The last ``count`` queries of an attention layer ``[b, h, count, d]``, position-encoded as in its forward."""
    queries = get_prerope_query_states(module, hidden_states[:, -count:])
    cos, sin = (t[:, -count:] for t in position_embeddings)
    rotated, _ = sys.modules[type(module).__module__].apply_rotary_pos_emb(queries, queries, cos, sin)
    return rotated


@dataclass
class ReSTKVPress(ScorerPress):
    """A kvpress scorer press whose scores are ``policy``'s (ReST-KV with the paper's defaults)."""

    compression_ratio: float = 0.0
    policy: Policy = field(default_factory=ReSTKV)

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self.policy).__name__
        if not isinstance(self.policy, Policy) or type(self.policy).score is Policy.score:
            raise ValueError(f"ReSTKVPress needs a policy of ours that implements score(); got {name}")
        if type(self.policy).select is not Policy.select:
            raise ValueError(
                f"ReSTKVPress: {name} selects by its own rule (it overrides select()), which a scorer press, ranking "
                "tokens by score() alone, would not follow; run it through restkv.compress"
            )
        stages = self.policy.stages
        if stages.merge.active or stages.key_pruning.active:
            raise ValueError(
                f"ReSTKVPress: {name}.{stages.merge.setting} / {stages.key_pruning.setting} change the "
                "stored values or keys, which a scorer press cannot; run them through restkv.compress (kvpress has "
                "its own ThinKPress to compose with)"
            )
        if self.policy.gqa not in ("mean", "max"):
            raise ValueError(
                f"ReSTKVPress: {name}.gqa={self.policy.gqa!r} is not allowed: kvpress keeps one selection per "
                "key/value head, so gqa must be 'mean' or 'max'"
            )
        if stages.schedule.varies_by_layer:
            raise ValueError(
                f"ReSTKVPress: {name}.{stages.schedule.setting} is not allowed: kvpress applies one "
                "compression ratio to every layer (schedule must be 'uniform')"
            )
        if stages.allocation.headwise:
            raise ValueError(
                f"ReSTKVPress: {name}.{stages.allocation.setting} is not allowed: a scorer press keeps "
                "the same number of tokens in every head; for kvpress's head-wise budgets wrap this press in its "
                "AdaKVPress, or run policy.allocation=adakv through restkv.compress"
            )
        self._grams: weakref.WeakKeyDictionary[nn.Module, torch.Tensor] = weakref.WeakKeyDictionary()

    def post_init_from_model(self, model: nn.Module) -> None:
        self._grams = weakref.WeakKeyDictionary()  # the weights may have changed since the last use

    def _gram(self, module: nn.Module) -> torch.Tensor:
        if module not in self._grams:
            self._grams[module] = output_gram(module.o_proj.weight, module.config.num_attention_heads)
        return self._grams[module]

    def layer_inputs(self, module: nn.Module, hidden_states: torch.Tensor, keys, values, kwargs) -> LayerInputs:
        """What our policy sees of this layer (`LayerInputs`), from kvpress's arguments."""
        count = keys.shape[2] if self.policy.needs_all_queries else self.policy.window
        needs_gram = self.policy.needs_output_gram
        return LayerInputs(
            queries=model_queries(module, hidden_states, kwargs["position_embeddings"], count),
            keys=keys,
            values=values,
            layer=module.layer_idx,
            num_layers=module.config.num_hidden_layers,
            scaling=getattr(module, "scaling", None),
            output_gram=(lambda: self._gram(module)) if needs_gram else None,
            output_weight=lambda: module.o_proj.weight,
        )

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        """Scores ``[b, h_kv, L]``: the policy's for past tokens, then the window above them all."""
        length, window = keys.shape[2], self.policy.window
        keep = kvpress_kept(length, self.compression_ratio)
        try:
            self.policy.check_budget(Budget(keep))
        except ValueError as error:
            ratio = self.compression_ratio
            raise ValueError(f"compression_ratio={ratio} keeps {keep} of {length} tokens: {error}") from None
        past = self.policy.score(self.layer_inputs(module, hidden_states, keys, values, kwargs), keep).float()
        reduced = reduce_groups(past, keys.shape[1], self.policy.gqa)
        top = reduced.amax() + 1 if reduced.numel() else reduced.new_ones(())
        return torch.cat([reduced, top.expand(*reduced.shape[:2], window)], dim=-1)
