"""kvpress's scoring presses as our policies: ``policy=kvpress policy.press=SnapKVPress policy.window_size=32``.

A kvpress *scorer* press (a ``ScorerPress`` that evicts by its scores and a top-k) is run through
our integration like any of our policies: at the end of prefill each layer asks the press for its
scores (``press.score(module, hidden_states, keys, values, attentions, kwargs)``, one per key/value
head and prompt position) and keeps the ``budget`` best; budgets, both protocols, the record, the
full-cache pause and the preallocated decode cache are ours. The press is built per layer with the
compression ratio that makes kvpress keep exactly the layer's budget
(`restkv.interop.compression_ratio`: ``1 - budget / L``, to the last bit), so presses whose scores
depend on it (StreamingLLM) see what kvpress would give them.

Presses that evict otherwise (head-wise budgets, chunks, merging, re-rotation, decoding-time
compression, a whole-model set-up or a download) are refused with the reason; run them with kvpress's
own pipeline. kvpress is imported only when the policy is built and installed; without it the policy
still builds (its settings are checked against the table below, made from kvpress 0.5.5) and fails,
naming the extra, when the runner first asks whether it evicts (before anything is written).
"""

from __future__ import annotations

import dataclasses
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from restkv.interop import EXTRA, KVPressMissing, compression_ratio, require_kvpress
from restkv.interop.layer_calls import LayerCalls
from restkv.policy import LayerInputs, Policy
from restkv.registry import register_policy
from restkv.select import Budget

SUPPORTED: dict[str, tuple[str, ...]] = {
    "SnapKVPress": ("window_size", "kernel_size"),
    "StreamingLLMPress": ("n_sink",),
    "RandomPress": ("seed",),
    "KnormPress": (),
    "TOVAPress": (),
    "KeyDiffPress": (),
    "ObservedAttentionPress": (),
    "ExpectedAttentionPress": ("n_future_positions", "n_sink", "use_covariance", "use_vnorm", "epsilon"),
    "CapPress": ("tau", "n_future_positions", "n_sink", "epsilon"),
    "CURPress": ("num_sinks", "leverage_type", "use_random_leverage", "use_local_approximation", "local_window_size"),
    "CompactorPress": ("sink_size_start", "sink_size_end", "chunk_size", "sketch_dimension", "blending"),
    "LagKVPress": ("n_sink", "lag_size", "cross_scoring"),
    "LeverageScorePress": ("sketch_dimension",),
    "NonCausalAttnPress": ("chunk_size",),
}
"""Supported presses and the settings each takes (besides ``compression_ratio``, set from the budget)."""

WINDOWS = {"SnapKVPress": ("window_size", 64), "TOVAPress": (None, 1)}
"""Presses that always keep the last tokens of the prompt: the setting that sizes them and its default."""

EAGER_ONLY = ("ObservedAttentionPress",)
"""Presses that read the attention weights, which only eager attention returns."""

REASONS = {
    "PyramidKVPress": "it sets its own per-layer budgets; policy.press=SnapKVPress policy.schedule=pyramid gives "
    "SnapKVPress's scores under our PyramidKV budgets (or policy=pyramidkv)",
    "QFilterPress": "it downloads its filters when attached to the whole model (post_init_from_model)",
    "KVzapPress": "it downloads its scoring model when attached to the whole model (post_init_from_model)",
    "ExpectedAttentionStatsPress": "it downloads or computes query statistics when attached to the whole model",
    "CriticalKVPress": "it wraps another press",
}


def unsupported_reason(name: str) -> str:
    """Why kvpress's press ``name`` does not run as our policy (kvpress installed)."""
    if name in REASONS:
        return REASONS[name]
    kvpress = require_kvpress()
    cls = getattr(kvpress, name)
    if not issubclass(cls, kvpress.ScorerPress):
        wraps = {f.name for f in dataclasses.fields(cls)} & {"press", "base_press", "presses"}
        return "it wraps another press" if wraps else "it evicts through its own compress or hooks, not by scores"
    if cls.compress is not kvpress.ScorerPress.compress:
        return "it chooses what to keep in its own compress, not by scores and a top-k"
    return "it needs the whole model (post_init_from_model)"


def _press_names() -> tuple[list[str], list[str]]:
    """(supported, other) press names of the installed kvpress (other: empty without kvpress)."""
    try:
        kvpress = require_kvpress()
    except KVPressMissing:
        return sorted(SUPPORTED), []
    presses = [n for n in kvpress.__all__ if n.endswith("Press") and n not in ("BasePress", "ScorerPress")]
    return sorted(SUPPORTED), sorted(n for n in presses if n not in SUPPORTED)


def unknown_press_message(name: str) -> str:
    supported, other = _press_names()
    message = f"KVPressPolicy.press={name!r} is not a supported kvpress press; supported: {', '.join(supported)}"
    if name in other:
        return f"{message}. kvpress's {name} is not supported because {unsupported_reason(name)}"
    if other:
        message += f"; kvpress's other presses ({', '.join(other)}) run in its own pipeline only"
    return message


def _rotary(module: nn.Module) -> nn.Module:
    """A rotary embedding for ``module``'s config, of its architecture's class (kvpress reads ``module.rotary_emb``)."""
    modeling = sys.modules[type(module).__module__]
    classes = [c for n, c in vars(modeling).items() if n.endswith("RotaryEmbedding") and isinstance(c, type)]
    if not classes:
        raise NotImplementedError(f"no rotary embedding class next to {type(module).__name__}")
    return classes[0](config=module.config).to(module.o_proj.weight.device)


_ROTARY: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()


@contextmanager
def _with_rotary(module: nn.Module) -> Iterator[None]:
    """Give ``module`` a ``rotary_emb`` attribute for the press's call if it has none (not registered)."""
    if hasattr(module, "rotary_emb"):
        yield
        return
    if module not in _ROTARY:
        _ROTARY[module] = _rotary(module)
    module.__dict__["rotary_emb"] = _ROTARY[module]
    try:
        yield
    finally:
        del module.__dict__["rotary_emb"]


@contextmanager
def _seeded(layer: int, device: torch.device) -> Iterator[None]:
    """Torch's global generator seeded with the layer index inside, restored after.

    Some presses draw from it (LeverageScorePress's and CompactorPress's sketches, RandomPress
    without a seed); seeded, a rerun keeps the same tokens, as resuming a run needs.
    """
    devices = []
    if device.type == "cuda":
        devices = [torch.cuda.current_device() if device.index is None else device.index]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(layer)
        yield


@register_policy("kvpress")
@dataclass
class KVPressPolicy(Policy):
    """A kvpress scorer press as a policy; ``press`` names it, the other fields are its settings.

    Settings left at None take the press's default; a setting the press does not take is refused.
    ``window`` is not set by hand: it is the press's own window (SnapKVPress's ``window_size``, 1 for
    TOVAPress's last token and for presses without one) and only serves the check that the budget
    exceeds it. ``gqa`` stays ``mean``: kvpress presses score each key/value head themselves.
    """

    press: str = "SnapKVPress"
    window: int | None = None
    window_size: int | None = None
    kernel_size: int | None = None
    n_sink: int | None = None
    seed: int | None = None
    n_future_positions: int | None = None
    use_covariance: bool | None = None
    use_vnorm: bool | None = None
    epsilon: float | None = None
    tau: float | None = None
    num_sinks: int | None = None
    leverage_type: str | None = None
    use_random_leverage: bool | None = None
    use_local_approximation: bool | None = None
    local_window_size: int | None = None
    sink_size_start: int | None = None
    sink_size_end: int | None = None
    chunk_size: int | None = None
    sketch_dimension: int | None = None
    blending: float | None = None
    lag_size: int | None = None
    cross_scoring: bool | None = None

    allows_allocation: ClassVar[bool] = False  # the press selects per key/value head itself (see `select`)

    def __post_init__(self) -> None:
        if self.press not in SUPPORTED:
            raise ValueError(unknown_press_message(self.press))
        own = self._own_window()
        if self.window is not None and self.window != own:
            raise ValueError(
                f"KVPressPolicy.window={self.window!r} is not allowed: the window is {self.press}'s own ({own}); "
                + (f"set policy.{WINDOWS[self.press][0]}" if WINDOWS.get(self.press, (None,))[0] else "leave it unset")
            )
        self.window = own
        super().__post_init__()
        self._calls = LayerCalls()
        try:
            require_kvpress()
        except KVPressMissing:
            return  # refused when the runner asks whether it evicts (`evicts`)
        self.build_press(0.0)  # the press's own checks, now
        self._calls.open()
        weakref.finalize(self, self._calls.close)

    def _own_window(self) -> int:
        setting, default = WINDOWS.get(self.press, (None, 1))
        value = getattr(self, setting) if setting else None
        return default if value is None else value

    def settings(self) -> dict[str, Any]:
        """The press's settings given here (None ones left to the press's defaults)."""
        shared = {f.name for f in dataclasses.fields(Policy)} | {"press"}
        names = [f.name for f in dataclasses.fields(self) if f.name not in shared]
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def validate(self) -> None:
        super().validate()
        if self.gqa != "mean":
            raise ValueError(
                f"KVPressPolicy.gqa={self.gqa!r} is not allowed: kvpress presses give one score per key/value head "
                "(each reduces its query group its own way), so gqa stays 'mean'"
            )
        extra = sorted(set(self.settings()) - set(SUPPORTED[self.press]))
        if extra:
            takes = ", ".join(SUPPORTED[self.press]) or "none"
            raise ValueError(
                f"{self.press} does not take {', '.join(extra)}; its settings: {takes} (its compression_ratio "
                "comes from the budget)"
            )

    @property
    def evicts(self) -> bool:  # type: ignore[override]
        """True; asking is the runner's first look at a built policy, so a missing kvpress fails here."""
        require_kvpress()
        return True

    def build_press(self, ratio: float) -> Any:
        """The kvpress press with these settings and ``compression_ratio=ratio``."""
        cls = getattr(require_kvpress(), self.press)
        unknown = sorted(set(self.settings()) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"the installed kvpress's {self.press} takes no {', '.join(unknown)} (table: {EXTRA})")
        try:
            return cls(compression_ratio=ratio, **self.settings())
        except (AssertionError, TypeError, ValueError) as error:
            raise ValueError(f"kvpress refused {self.press}({self.settings()}): {error}") from error

    def select(self, inputs: LayerInputs, budget: Budget) -> torch.Tensor | None:
        """The layer's budget of best positions by the press's scores, ascending: ``[b, h_kv, keep]``."""
        keep = self.layer_keep(inputs.length, budget, inputs.layer, inputs.num_layers)
        if keep >= inputs.length:
            return None
        call = LayerCalls.current(inputs.layer, inputs.length)
        if self.press in EAGER_ONLY and call.attentions is None:
            raise ValueError(f"{self.press} reads the attention weights: run it with model.attn_implementation=eager")
        press = self.build_press(compression_ratio(keep, inputs.length))
        keys, values = inputs.keys, inputs.values
        with _with_rotary(call.module), _seeded(inputs.layer, keys.device):
            scores = press.score(call.module, call.hidden_states, keys, values, call.attentions, call.kwargs)
        expected = (*inputs.keys.shape[:2], inputs.length)
        if tuple(scores.shape) != expected:
            raise RuntimeError(f"{self.press}.score gave scores of shape {tuple(scores.shape)}; expected {expected}")
        return scores.topk(keep, dim=-1).indices.sort(dim=-1).values
