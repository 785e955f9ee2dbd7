"""kvpress's scoring presses as our policies: ``policy=kvpress policy.press=SnapKVPress policy.window_size=32``.

A kvpress *scorer* press (a ``ScorerPress`` that evicts by its scores and a top-k) is run through
our integration like any of our policies: at the end of prefill each layer asks the press for its
scores (``press.score(module, hidden_states, keys, values, attentions, kwargs)``, one per key/value
head and prompt position) and keeps the ``budget`` best; budgets, both protocols, the record, the
full-cache pause and the preallocated decode cache are ours. The press is built per layer with the
compression ratio that makes kvpress keep exactly the layer's budget
(`restkv.interop.compression_ratio`: ``1 - budget / L``, to the last bit), so presses whose scores
depend on it (StreamingLLM) see what kvpress would give them.

Scorer presses that load per-model files (`press_catalogue.FILE_SCORERS`: Q-filters, KVzap,
query statistics) score the same way once kvpress has loaded their files for the model
(`restkv.interop.hub_presses`; offline without the files they are refused before any work,
`restkv.interop.press_files`). Wrappers and presses with their own selection run their ``compress`` here too
(`WRAPPERS`, `OWN_SELECTION`); presses that need more (extra forwards, re-rotation, decoding-time compression,
several presses in turn, their own thresholds) run through kvpress's own hooks around our prefill
(`restkv.interop.press_hooks`, built in `restkv.interop.press_builds`); the rest are refused with the reason
(`restkv.interop.press_catalogue`). kvpress is imported only when the policy is built and installed; without it
the policy still builds (its settings are checked against the tables below, made from kvpress 0.5.5) and fails,
naming the extra, when the runner first asks whether it evicts (before anything is written).
"""

from __future__ import annotations

import dataclasses
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from restkv.interop import KVPressMissing, compression_ratio, press_builds, require_kvpress
from restkv.interop.layer_calls import LayerCalls
from restkv.interop.press_builds import built_press
from restkv.interop.press_catalogue import FILE_SCORERS, HOOKED, HOOKED_WRAPPERS, REFUSED
from restkv.interop.press_files import check_local_setting, check_press_files
from restkv.policy import LayerInputs, Policy
from restkv.registry import register_policy
from restkv.select import Budget
from restkv.stages.allocation import HeadSelection

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

WRAPPERS: dict[str, tuple[str, ...]] = {
    "CriticalKVPress": ("epsilon", "first_stage_ratio"),
    "AdaKVPress": ("alpha_safeguard",),
    "CriticalAdaKVPress": ("alpha_safeguard", "epsilon", "first_stage_ratio"),
    "ChunkPress": ("chunk_length",),
    "ChunkKVPress": ("chunk_length",),
    "EntropyGatedChunkKVPress": ("chunk_length", "low_entropy_chunk_length"),
    "BlockPress": ("block_size",),
}
"""Presses that wrap a scorer press (``policy.inner``, one of `SUPPORTED`) and the settings each takes."""

OWN_SELECTION = {"PyramidKVPress": ("window_size", "kernel_size", "pyramid_beta")}
"""Presses that are not wrappers but choose what to keep in their own ``compress`` (PyramidKV's layer budgets)."""

SCORED_WRAPPERS = ("CriticalKVPress",)
"""Wrappers that are scorer presses themselves: their scores and a top-k, as for `SUPPORTED`."""

HEADWISE = ("AdaKVPress", "CriticalAdaKVPress")
"""Presses that keep a different number of tokens per head (kvpress masks them; here they are evicted)."""

WINDOWS = {"SnapKVPress": ("window_size", 64), "TOVAPress": (None, 1), "PyramidKVPress": ("window_size", 64)}
"""Presses that always keep the last tokens of the prompt: the setting that sizes them and its default."""

EAGER_ONLY = ("ObservedAttentionPress",)
"""Presses that read the attention weights, which only eager attention returns."""

RUNNABLE = (*SUPPORTED, *WRAPPERS, *OWN_SELECTION, *HOOKED, *FILE_SCORERS)
"""Every press ``policy.press`` may name."""


def unknown_press_message(name: str) -> str:
    """Why ``policy.press=name`` is refused: kvpress's reason for the presses it has (`press_catalogue`)."""
    message = f"KVPressPolicy.press={name!r} is not a press that runs here; runnable: {', '.join(sorted(RUNNABLE))}"
    if name in REFUSED:
        return f"{message}. kvpress's {name} is not supported because {REFUSED[name]}"
    return message + " (docs/kvpress-presses.md lists every kvpress press and why the others do not run)"


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
    inner: str | None = None
    alpha_safeguard: float | None = None
    first_stage_ratio: float | None = None
    chunk_length: int | None = None
    low_entropy_chunk_length: int | None = None
    block_size: int | None = None
    pyramid_beta: float | None = None
    layerwise: bool | None = None
    compression_interval: int | None = None
    model_type: str | None = None
    files: str | None = None
    structured: bool | None = None
    agg_task: str | None = None
    agg_group: str | None = None
    agg_head: str | None = None
    add_v_norm: bool | None = None
    add_mean_across_heads: bool | None = None
    keep_token_lower_bound: int | None = None
    normalize_scores: bool | None = None
    rerotate_keys: bool | None = None
    key_channel_compression_ratio: float | None = None
    lazy_threshold: float | None = None
    n_last: int | None = None
    n_recent: int | None = None
    n_initial: int | None = None
    compression_ratios: list[float] | None = None
    presses: list[str] | None = None
    threshold: float | None = None
    sliding_window_size: int | None = None
    decoding: bool | None = None

    allows_allocation: ClassVar[bool] = False  # the press selects per key/value head itself (see `select`)

    def __post_init__(self) -> None:
        if self.press not in RUNNABLE:
            raise ValueError(unknown_press_message(self.press))
        wraps = self.press in WRAPPERS or self.press in HOOKED_WRAPPERS
        if wraps != (self.inner is not None):
            raise ValueError(
                f"KVPressPolicy.inner={self.inner!r} is not allowed with press={self.press!r}: "
                + (
                    f"{self.press} wraps a scorer press, so policy.inner must name one of {', '.join(SUPPORTED)}"
                    if wraps
                    else f"only the wrappers ({', '.join((*WRAPPERS, *HOOKED_WRAPPERS))}) take an inner press"
                )
            )
        if self.inner is not None and self.inner not in SUPPORTED:
            raise ValueError(
                f"KVPressPolicy.inner={self.inner!r} is not allowed: {self.press} wraps a scorer press, one of "
                f"{', '.join(SUPPORTED)}"
            )
        own = self._own_window()
        if self.window is not None and self.window != own:
            setting = WINDOWS.get(self.scorer, (None,))[0]
            raise ValueError(
                f"KVPressPolicy.window={self.window!r} is not allowed: the window is {self.scorer}'s own ({own}); "
                + (f"set policy.{setting}" if setting else "leave it unset")
            )
        self.window = own
        check_local_setting(self.press, self.files)
        super().__post_init__()
        self._calls = LayerCalls()
        try:
            require_kvpress()
        except KVPressMissing:
            return  # refused when the runner asks whether it evicts (`evicts`)
        if self.route == "integration":
            self.build_press(0.0)  # the press's own checks, now
        self._calls.open()
        weakref.finalize(self, self._calls.close)

    @property
    def route(self) -> str:
        """``integration`` (evicted by our integration: the cache shrinks) or ``kvpress_hooks`` (kvpress's own hooks
        around our prefill, `restkv.interop.press_hooks`)."""
        return "kvpress_hooks" if self.press in HOOKED else "integration"

    @property
    def scorer(self) -> str:
        """The press whose scores (and window) decide: the inner press of a wrapper, else the press itself."""
        return self.inner if self.inner is not None else self.press

    def _own_window(self) -> int:
        setting, default = WINDOWS.get(self.scorer, (None, 1))
        value = getattr(self, setting) if setting else None
        return default if value is None else value

    def settings(self) -> dict[str, Any]:
        """The press's settings given here (None ones left to the press's defaults)."""
        shared = {f.name for f in dataclasses.fields(Policy)} | {"press", "inner", "files"}
        names = [f.name for f in dataclasses.fields(self) if f.name not in shared]
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def _split_settings(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the wrapper's, the scorer's) settings: a wrapper claims its own names first."""
        given = self.settings()
        own = WRAPPERS.get(self.press, HOOKED.get(self.press, ()))
        return {k: v for k, v in given.items() if k in own}, {k: v for k, v in given.items() if k not in own}

    def validate(self) -> None:
        super().validate()
        if self.gqa != "mean":
            raise ValueError(
                f"KVPressPolicy.gqa={self.gqa!r} is not allowed: kvpress presses give one score per key/value head "
                "(each reduces its query group its own way), so gqa stays 'mean'"
            )
        if self.press in OWN_SELECTION and self.stages.schedule.varies_by_layer:
            raise ValueError(
                f"KVPressPolicy.{self.stages.schedule.setting} is not allowed with {self.press}: it sets its own "
                "per-layer budgets (policy.pyramid_beta is its beta)"
            )
        if self.model_type not in (None, "linear", "mlp"):
            raise ValueError(
                f"KVPressPolicy.model_type={self.model_type!r} is not allowed: KVzapPress's is linear or mlp"
            )
        if self.press in HOOKED:
            press_builds.check_settings(self, SUPPORTED, EAGER_ONLY)
        if self.press == "ComposedPress":
            return  # its settings go to its presses (checked just above)
        scorer = self._split_settings()[1]
        takes = SUPPORTED.get(self.scorer) or OWN_SELECTION.get(self.scorer) or HOOKED.get(self.scorer, ())
        takes = takes or FILE_SCORERS.get(self.scorer, ())
        extra = sorted(set(scorer) - set(takes))
        if extra:
            listed = ", ".join((*WRAPPERS.get(self.press, ()), *takes)) or "none"
            raise ValueError(
                f"{self.press}{f' over {self.inner}' if self.inner else ''} does not take {', '.join(extra)}; its "
                f"settings: {listed} (its compression_ratio comes from the budget)"
            )

    @property
    def evicts(self) -> bool:  # type: ignore[override]
        """True on the integration route (False on kvpress's hooks: the press evicts, our integration keeps what it
        left); asking is the runner's first look at a built policy, so a missing kvpress fails here."""
        require_kvpress()
        return self.route == "integration"

    def build_press(self, ratio: float) -> Any:
        """The kvpress press with these settings and ``compression_ratio=ratio`` (a wrapper around its inner press)."""
        kvpress = require_kvpress()
        wrapper, scorer = self._split_settings()
        if "pyramid_beta" in scorer:  # PyramidKVPress's own beta (ours, policy.beta, drives policy.schedule)
            scorer = {**{k: v for k, v in scorer.items() if k != "pyramid_beta"}, "beta": scorer["pyramid_beta"]}
        if self.files is not None and self.scorer == "ExpectedAttentionStatsPress":
            scorer["stats_folder"] = self.files  # kvpress's own local-folder option
        press = built_press(kvpress, self.scorer, scorer, compression_ratio=ratio)
        return press if self.inner is None else built_press(kvpress, self.press, wrapper, press=press)

    def layer_press(self, module: nn.Module, ratio: float) -> Any:
        """The press for one layer's eviction: built, or for a press with per-model files attached once per model."""
        if self.press not in FILE_SCORERS:
            return self.build_press(ratio)
        from restkv.interop.hub_presses import scorer_press

        return scorer_press(self, module, ratio)

    def input_files(self) -> list[Path]:
        """Besides the stages' files, those of ``policy.files`` (a run's identity hashes their content)."""
        own = sorted(p for p in Path(self.files).iterdir() if p.is_file()) if self.files is not None else []
        return [*super().input_files(), *own]

    def check_files(self, name_or_path: str, config: Any) -> None:
        """Refuse, before any work, a press whose per-model files for the model named ``name_or_path`` (``config``:
        its config, or None) are neither here nor fetchable (`restkv.interop.press_files`)."""
        from restkv.interop.hub_presses import file_settings

        require_kvpress()
        check_press_files(self.press, name_or_path, config, file_settings(self))

    def select(self, inputs: LayerInputs, budget: Budget) -> torch.Tensor | HeadSelection | None:
        """The layer's kept positions, ascending: ``[b, h_kv, n]``, or per head for AdaKV-style presses."""
        if self.route != "integration":
            return None  # kvpress's hooks evict (`restkv.interop.press_hooks`)
        keep = self.layer_keep(inputs.length, budget, inputs.layer, inputs.num_layers)
        if keep >= inputs.length:
            return None
        call = LayerCalls.current(inputs.layer, inputs.length)
        if self.scorer in EAGER_ONLY and call.attentions is None:
            raise ValueError(f"{self.scorer} reads the attention weights: run it with model.attn_implementation=eager")
        press = self.layer_press(call.module, compression_ratio(keep, inputs.length))
        keys, values = inputs.keys, inputs.values
        with _with_rotary(call.module), _seeded(inputs.layer, keys.device):
            if self.press in SUPPORTED or self.press in SCORED_WRAPPERS or self.press in FILE_SCORERS:
                scores = press.score(call.module, call.hidden_states, keys, values, call.attentions, call.kwargs)
            else:
                call.module.__dict__.pop("masked_key_indices", None)  # a mask left by an earlier press is not ours
                kept = press.compress(call.module, call.hidden_states, keys, values, call.attentions, call.kwargs)[0]
                return _read_back(call.module, kept, keys, self.press in HEADWISE)
        expected = (*inputs.keys.shape[:2], inputs.length)
        if tuple(scores.shape) != expected:
            raise RuntimeError(f"{self.press}.score gave scores of shape {tuple(scores.shape)}; expected {expected}")
        return scores.topk(keep, dim=-1).indices.sort(dim=-1).values


def _read_back(
    module: nn.Module, kept_keys: torch.Tensor, keys: torch.Tensor, headwise: bool
) -> torch.Tensor | HeadSelection:
    """What a press's own ``compress`` kept: kvpress's head mask (AdaKV-style presses), else the positions of the
    keys it returned. The mask is taken off the module: the entries are evicted here, not masked at decode time."""
    masked = module.__dict__.pop("masked_key_indices", None)
    if headwise:
        if masked is None:
            raise RuntimeError(f"{type(module).__name__}: the head-wise press left no mask of what it evicted")
        _, head, position = masked
        visible = torch.ones(keys.shape[1], keys.shape[2], dtype=torch.bool, device=keys.device)
        visible[head, position] = False
        return HeadSelection.from_heads([row.nonzero().flatten() for row in visible])
    return matched_positions(kept_keys, keys)


def matched_positions(kept: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Positions ``[b, h, n]`` (ascending) of the key rows ``kept`` ``[b, h, n, d]`` within ``keys`` ``[b, h, L, d]``.

    Rows are matched by a random projection, then checked whole; a row found nowhere (the press changed the
    keys) is refused rather than guessed.
    """
    probe = torch.randn(keys.shape[-1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    probe = probe.to(keys.device)
    every, wanted = keys.double() @ probe, kept.double() @ probe  # [b, h, L], [b, h, n]
    order = every.argsort(dim=-1)
    slots = torch.searchsorted(every.gather(-1, order), wanted).clamp(max=keys.shape[2] - 1)
    positions = order.gather(-1, slots)
    found = keys.gather(2, positions.unsqueeze(-1).expand(*positions.shape, keys.shape[-1]))
    if not torch.equal(found, kept):
        raise RuntimeError("the press returned keys that are not rows of the layer's keys; its positions are unknown")
    return positions.sort(dim=-1).values
