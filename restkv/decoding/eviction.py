"""Eviction during decoding: each layer cut back to a budget every few generated tokens.

Prefill-only eviction bounds the prompt's cache; a long answer (a reasoning trace) grows it again. With a
`DecodeEviction`, `restkv.compress` also keeps the queries of each layer's most recent tokens (the observation
window slides with the text: the prompt's last ``window`` queries, then each decoded token's) and, after a
decoding step's attention, when ``interval`` steps have passed since a layer was last cut or it holds more than
``budget + interval`` tokens, asks the policy to keep ``budget`` of the layer's tokens, prompt and answer alike,
the most recent ``window`` always among them (``cut_schedule='length'``: R-KV's authors' timing instead, a cut on the
step after the sequence reaches a multiple of ``interval`` tokens). Tokens keep their positions. So the cache never
holds more than ``max(budget, what the prefill kept) + interval`` tokens per layer.

``phase`` says whether the prompt is also evicted at the end of prefill (``both``) or kept whole until decoding
cuts it (``decode``); without a `DecodeEviction` eviction is the paper's, at the end of prefill only. What cannot
be cut during decoding is refused by name (`check_decode_eviction`).

What a step kept is recorded: `DecodeEvictor.sizes` (tokens per layer after each step that evicted, for the
"cache size over time" of a run's predictions) and, with ``trace``, every layer's cache as token positions at
every step (what the oracle tests read).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from restkv.checks import check_choice, check_number
from restkv.choices import DECODE_INTERVAL, DECODE_SCHEDULES, PHASES
from restkv.select import Budget

if TYPE_CHECKING:
    from restkv.inputs import LayerInputs
    from restkv.policy import Policy

DECODE_PHASES = tuple(phase for phase in PHASES if phase != "prefill")


@dataclass(frozen=True)
class DecodeEviction:
    """Cut every layer to ``budget`` tokens (window included) every ``interval`` decoded tokens; ``phase``:
    ``both`` (the prompt is evicted at the end of prefill too) or ``decode`` (the prompt is kept whole);
    ``cut_schedule``: when a cut is due (`DECODE_SCHEDULES`)."""

    budget: int
    interval: int = DECODE_INTERVAL
    phase: str = "both"
    cut_schedule: str = "interval"

    def __post_init__(self) -> None:
        check_number("DecodeEviction", "budget", self.budget, low=1, low_open=False, integer=True)
        check_number("DecodeEviction", "interval", self.interval, low=1, low_open=False, integer=True)
        if self.phase == "prefill":
            raise ValueError(
                "DecodeEviction.phase='prefill' is eviction at the end of prefill only: pass no DecodeEviction "
                f"(allowed here: {', '.join(DECODE_PHASES)})"
            )
        check_choice("DecodeEviction", "phase", self.phase, DECODE_PHASES)
        check_choice("DecodeEviction", "cut_schedule", self.cut_schedule, DECODE_SCHEDULES)

    @property
    def evicts_prefill(self) -> bool:
        return self.phase == "both"


def check_decode_eviction(policy: Policy, eviction: DecodeEviction, layout: str, quantization: Any) -> None:
    """Refuse, before any prefill, what cannot be cut during decoding (each with what to use instead)."""
    owner, stages = type(policy).__name__, policy.stages
    reasons = {
        "a policy that keeps everything has nothing to cut": not policy.evicts,
        f"{stages.allocation.setting} keeps a different count per head, and decode-time cuts are dense: use "
        "allocation='uniform'": stages.allocation.headwise,
        f"layout={layout!r}: decode-time cuts store dense layers: use layout='auto'": layout != "auto",
        "quantized storage cannot be cut again: use quantization=none": quantization is not None,
        f"{stages.merge.setting} and {stages.key_pruning.setting} change what is stored: turn them off": (
            stages.merge.active or stages.key_pruning.active
        ),
        f"{owner} reads every query of the sequence, and decoding keeps only the window's": policy.needs_all_queries,
        "gqa='expand' stores a cache per query head, which a decoded token's keys do not fill: use 'mean' or 'max'": (
            policy.gqa == "expand"
        ),
    }
    for reason, applies in reasons.items():
        if applies:
            raise NotImplementedError(f"decode-time eviction with {owner}: {reason}")
    if eviction.budget <= policy.window:
        raise ValueError(
            f"DecodeEviction.budget={eviction.budget} is not more than the window (policy.window={policy.window}): "
            "the budget counts the window, which is always kept"
        )


@dataclass
class DecodeEvictor:
    """A compressor's decode-time state: each layer's recent queries, its cache as token positions, step counts."""

    eviction: DecodeEviction
    window: int
    trace: bool = False
    queries: dict[int, torch.Tensor] = field(default_factory=dict)
    positions: dict[int, torch.Tensor] = field(default_factory=dict)
    since_cut: dict[int, int] = field(default_factory=dict)
    softcaps: dict[int, float | None] = field(default_factory=dict)
    cut: set[int] = field(default_factory=set)
    """Layers cut at the current step."""
    sizes: list[dict[str, Any]] = field(default_factory=list)
    """After each step that cut a layer: ``{"step": decoded tokens so far, "tokens": [per layer]}``."""
    log: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    """With ``trace``: per layer, its cache as positions ``[b, heads, n]`` at each decoding step's attention."""
    steps: int = 0

    def start(self) -> None:
        """A new prompt: forget the previous one's state."""
        for state in (self.queries, self.positions, self.since_cut, self.softcaps, self.log, self.cut):
            state.clear()
        self.sizes.clear()
        self.steps = 0

    def observe(self, layer: int, query: torch.Tensor, softcap: float | None = None) -> None:
        """Queries ``[b, h, q, d]`` of tokens just added to ``layer``: the last ``window`` are kept (a prefill's
        call also says the layer's logit soft-cap, which decode-time scores apply)."""
        if query.shape[2] > 1:
            self.softcaps[layer] = softcap
        recent = self.queries.get(layer)
        joined = query if recent is None else torch.cat([recent, query], dim=2)
        self.queries[layer] = joined[:, :, -self.window :]

    def after_prefill(self, layer: int, selection: torch.Tensor | None, length: int, heads: int, device) -> None:
        """The positions ``layer`` holds after its prefill (``selection`` ``[b, heads, n]``, None: all of them)."""
        if selection is None:
            selection = torch.arange(length, device=device).expand(1, heads, length)
        self.positions[layer] = selection
        self.since_cut[layer] = 0

    def step(
        self, layer: int, length: int, make_inputs: Callable[[torch.Tensor], LayerInputs], policy: Policy
    ) -> torch.Tensor | None:
        """After a decoding step's attention on ``layer`` (which now holds ``length`` tokens): the positions
        (indices into its cache, ``[b, heads, budget]``) to keep, or None when it is not cut at this step."""
        held = self.positions.get(layer)
        if held is None:
            return None  # no prefill seen under this compressor (nothing to track)
        # tokens in the sequence before this step's (question and turns included); read only where it decides
        sequence = int(held.max()) + 1 if self.eviction.cut_schedule == "length" else 0
        if length > held.shape[2]:  # the tokens appended since: the next positions, in order
            extra = torch.arange(1, length - held.shape[2] + 1, device=held.device) + held[..., -1:].max()
            held = torch.cat([held, extra.expand(*held.shape[:2], -1)], dim=2)
            self.positions[layer] = held
        if self.trace:
            self.log.setdefault(layer, []).append(held.clone())
        self.since_cut[layer] = self.since_cut.get(layer, 0) + 1
        queries = self.queries.get(layer)
        if not self._due(layer, length, sequence) or queries is None or queries.shape[2] < self.window:
            return None
        selection = policy.select(make_inputs(queries), Budget(self.eviction.budget))
        if selection is None:
            return None
        if not isinstance(selection, torch.Tensor):
            raise NotImplementedError("decode-time eviction keeps the same count per head; got a head-wise selection")
        self.positions[layer] = held.gather(2, selection.expand(held.shape[0], -1, -1))
        self.since_cut[layer] = 0
        self.cut.add(layer)
        return selection

    def _due(self, layer: int, length: int, sequence: int) -> bool:
        """Whether ``layer``, holding ``length`` tokens at this decoding step of a ``sequence`` seen so far, is cut
        now."""
        budget, interval = self.eviction.budget, self.eviction.interval
        if self.eviction.cut_schedule == "length":
            return length >= budget and sequence % interval == 0
        return length > budget and (self.since_cut[layer] >= interval or length > budget + interval)

    def end_step(self, tokens: list[int]) -> None:
        """After a step's last evicted layer (every step reaches it): count the step, and record every layer's size
        when any was cut."""
        self.steps += 1
        if self.cut:
            self.sizes.append({"step": self.steps, "tokens": tokens})
            self.cut.clear()
