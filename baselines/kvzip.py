"""KVzip (Kim et al., 2025): query-agnostic eviction by context reconstruction.

After the prefill, the model is asked to repeat its context: for each chunk of the context a
forward is run over ``repeat prompt + chat suffix + the chunk`` (`restkv.scoring_pass`), and each
cached pair of the chunk is scored by the largest attention any reconstruction query of its
key/value head's query group pays it. The softmax runs over the attention sinks, the chunk's own
cached pairs and the reconstruction tokens (causal among them), as in the authors' code and
kvpress's ``KVzipPress``. The first ``n_sink`` prompt tokens are always kept.

What is kept (``level``):
  ``global`` (kvpress's default, the authors' ``pair``): one budget over every layer and key/value
    head: the lowest scores of the whole model are evicted, so layers and heads keep different numbers;
  ``layer`` (kvpress's ``layerwise=True``): every layer keeps its budget, shared by its heads;
  ``uniform`` (the authors' ``pair-uniform``): every key/value head keeps the layer's budget (a dense cache).
The head-wise levels are stored variable-length: the cache really shrinks.

``flavour`` picks the two small points where kvpress 0.5.5 and the authors' code differ: the continuation
prompt of the chunks after the first (the authors end it with a space, kvpress does not) and the default
chunk size (2,000 context tokens for the authors, 2,048 for kvpress); ``chunk_size`` overrides the latter.
docs/fidelity.md lists what differs from each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from restkv.checks import check_choice, check_number
from restkv.head_selection import HeadSelection
from restkv.policy import LayerInputs
from restkv.registry import register_policy
from restkv.scoring_pass import ScoringChunk, ScoringContext, ScoringLayer, ScoringPassPolicy
from restkv.select import Budget

LEVELS = ("global", "layer", "uniform")
FLAVOURS = ("authors", "kvpress")
FIRST_PROMPT = "\n\nRepeat the previous context exactly."
LATER_PROMPT = {
    "authors": "\n\nRepeat the part of the previous context exactly, starting with ",
    "kvpress": "\n\nRepeat the part of the previous context exactly, starting with",
}
CHUNK_SIZE = {"authors": 2000, "kvpress": 2048}
CARRIED = 8
"""Tokens of the previous chunk's end repeated after a later chunk's prompt (both codes)."""


def chat_parts(tokenizer: Any) -> tuple[list[int], list[int]]:
    """(the ids before a user turn's content, the ids after it up to the assistant's answer) of the tokenizer's
    chat template; ([], ids of a newline) without one."""
    if getattr(tokenizer, "chat_template", None) is None:
        return [], tokenizer.encode("\n", add_special_tokens=False)
    marker, fence = "CONTEXTMARK", "\n" + "#" * 11
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": marker + fence}], add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    before, after = text.split(fence)
    prefix = before.split(marker)[0]
    return tokenizer.encode(prefix, add_special_tokens=False), tokenizer.encode(after, add_special_tokens=False)


@register_policy("kvzip")
@dataclass
class KVzip(ScoringPassPolicy):
    """KVzip's context-reconstruction scores; ``level``, ``n_sink``, ``flavour`` and ``chunk_size`` as above.

    ``window`` is 1 and only serves the check that the budget exceeds it (KVzip keeps no recent window);
    ``gqa`` is ``max`` (KVzip takes the largest score of a query group).
    """

    window: int = 1
    gqa: str = "max"
    level: str = "global"
    n_sink: int = 4
    flavour: str = "authors"
    chunk_size: int | None = None

    allows_allocation: ClassVar[bool] = False

    def validate(self) -> None:
        super().validate()
        check_choice("KVzip", "level", self.level, LEVELS)
        check_choice("KVzip", "flavour", self.flavour, FLAVOURS)
        check_number("KVzip", "n_sink", self.n_sink, low=0, low_open=False, integer=True)
        if self.chunk_size is not None:
            check_number("KVzip", "chunk_size", self.chunk_size, low=1, low_open=False, integer=True)
        for name, value, allowed in (("window", self.window, 1), ("gqa", self.gqa, "max")):
            if value != allowed:
                raise ValueError(
                    f"KVzip.{name}={value!r} is not allowed: KVzip sets it itself ({name}={allowed!r}); "
                    "policy.level picks how the budget is shared"
                )
        stages = self.stages
        changed = (
            (stages.schedule, stages.schedule.varies_by_layer),
            (stages.allocation, stages.allocation.headwise or stages.allocation.across_layers),
            (stages.merge, stages.merge.active),
            (stages.key_pruning, stages.key_pruning.active),
        )
        for stage, asked in changed:
            if asked:
                raise ValueError(
                    f"KVzip.{stage.setting} is not allowed: KVzip scores and shares the budget itself (its "
                    "scoring pass, policy.level); leave the schedule, allocation, merge and ThinK at their defaults"
                )
        self._scores: torch.Tensor | None = None

    # -- the scoring pass -------------------------------------------------------------------------------

    def scoring_chunks(self, context: ScoringContext) -> list[ScoringChunk]:
        """The reconstruction inputs: per chunk of the context, the repeat prompt, the chat suffix, the chunk."""
        tokenizer = context.tokenizer()
        prefix, suffix = chat_parts(tokenizer)
        ids = context.prompt_ids.detach().to("cpu")
        skip = len(prefix) if prefix and ids[0, : len(prefix)].tolist() == prefix else 0
        size = self.chunk_size or CHUNK_SIZE[self.flavour]
        context_ids = ids[:, skip:]
        pieces = list(context_ids.split(size, dim=1))
        tail = torch.tensor([suffix], dtype=ids.dtype)
        chunks, start = [], skip
        for index, piece in enumerate(pieces):
            prompt = FIRST_PROMPT if index == 0 else LATER_PROMPT[self.flavour]
            head = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)], dtype=ids.dtype)
            if index:
                head = torch.cat([head, pieces[index - 1][:, -CARRIED:]], dim=1)
            chunks.append(ScoringChunk(torch.cat([head, tail, piece], dim=1), start, start + piece.shape[1]))
            start += piece.shape[1]
        self._scores = None
        return chunks

    def observe(self, seen: ScoringLayer) -> None:
        """Score one chunk's cached pairs at one layer: max over the reconstruction queries and the query group."""
        keys, queries, chunk = seen.keys, seen.queries, seen.chunk
        heads_kv, length, steps = keys.shape[1], seen.prompt_length, queries.shape[2]
        if self._scores is None:
            self._scores = torch.zeros((0, heads_kv, length), dtype=keys.dtype, device=keys.device)
        while self._scores.shape[0] <= seen.layer:
            extra = torch.zeros((1, heads_kv, length), dtype=keys.dtype, device=keys.device)
            self._scores = torch.cat([self._scores, extra])
        sink = min(self.n_sink, chunk.start)
        span = chunk.end - chunk.start
        shown = torch.cat([keys[:, :, :sink], keys[:, :, chunk.start : chunk.end], keys[:, :, -steps:]], dim=2)
        grouped = queries.view(1, heads_kv, -1, steps, queries.shape[-1])
        weights = torch.matmul(grouped, shown.unsqueeze(2).transpose(-2, -1)) / math.sqrt(queries.shape[-1])
        causal = torch.full((steps, steps), torch.finfo(weights.dtype).min, device=weights.device).triu(1)
        weights[..., -steps:, -steps:] += causal
        weights = torch.softmax(weights, dim=-1)[..., sink : sink + span]
        self._scores[seen.layer, :, chunk.start : chunk.end] = weights.amax(dim=(-3, -2))[0]

    # -- selection --------------------------------------------------------------------------------------

    def select(self, inputs: LayerInputs, budget: Budget) -> torch.Tensor | HeadSelection | None:
        raise RuntimeError("KVzip selects every layer at once, after its scoring pass (select_layers)")

    def select_layers(self, layers: list[LayerInputs], budget: Budget) -> list[torch.Tensor | HeadSelection | None]:
        """Every layer's kept positions from the reconstruction scores, under ``level``."""
        length = layers[0].length
        keep = self.layer_keep(length, budget, 0, len(layers))
        if keep >= length:
            return [None] * len(layers)
        if self._scores is None or self._scores.shape[0] != len(layers):
            raise RuntimeError("KVzip has no reconstruction scores for this prefill: its scoring pass did not run")
        scores, self._scores = self._scores, None
        scores[..., : self.n_sink] = scores.amax() + 1.0  # the sinks are never evicted
        heads = scores.shape[1]
        if self.level == "uniform":
            kept = scores.topk(keep, dim=-1).indices.sort(dim=-1).values
            return [kept[index][None] for index in range(len(layers))]
        if self.level == "layer":
            pruned = [heads * (length - keep)] * len(layers)
        else:
            lowest = (-scores.reshape(-1)).topk(len(layers) * heads * (length - keep)).indices
            pruned = torch.bincount(lowest // (heads * length), minlength=len(layers)).tolist()
        return [self._layer_selection(scores[index], count) for index, count in enumerate(pruned)]

    @staticmethod
    def _layer_selection(scores: torch.Tensor, pruned: int) -> HeadSelection:
        """One layer's heads keeping all but its ``pruned`` lowest scores (over all its heads)."""
        heads, length = scores.shape
        visible = torch.ones(heads * length, dtype=torch.bool, device=scores.device)
        visible[(-scores.reshape(-1)).topk(pruned).indices] = False
        per_head = [row.nonzero().flatten() for row in visible.view(heads, length)]
        if any(row.numel() == 0 for row in per_head):
            raise ValueError(f"KVzip's budget leaves a key/value head with no token ({pruned} of {heads * length})")
        return HeadSelection.from_heads(per_head)
