"""What a latency run measures, read from a ``configs/latency/<preset>.yaml`` (composed by Hydra)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import AutoConfig, PretrainedConfig

from restkv.devices import DTYPES, pick_device, torch_dtype
from restkv.eval.harness.config_tree import config_file
from restkv.eval.models.paths import project_root
from restkv.integrate import DECODE_KERNELS, SUPPORTED_ATTENTION

CACHES = ("dynamic", "preallocated")
DECODE_CACHES = (*CACHES, "varlen", "masked", "static")
"""Decode cache kinds: the two uniform ones, the head-wise layouts (`restkv.eval.latency.headwise`), and a
static-shape one whose step is captured once and replayed as a CUDA graph on GPUs (`restkv.decoding.static_layers`)."""
MASKED_CACHES = ("masked", "static")
"""Kinds read with a per-slot mask, which flash-attention does not take."""
FILLS = ("synthetic", "prefill")
BOUND_BANDWIDTHS = ("copy", "read")
MODES = ("model", "scoring", "capacity", "chunked")


def _positive_ints(values: Any) -> bool:
    return isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)


def _budget_spec(value: Any) -> bool:
    if isinstance(value, float):
        return 0 < value < 1
    return value == "full" or (isinstance(value, int) and not isinstance(value, bool) and value > 0)


@dataclass
class Settings:
    """One preset; every field is documented in ``configs/latency/base.yaml``."""

    name: str
    shape: str
    mode: str = "model"
    layers: int | None = None
    dtype: str = "float32"
    device: str = "auto"
    attn_implementation: str = "sdpa"
    threads: int | None = None
    seed: int = 0
    contexts: list[int] = field(default_factory=lambda: [8192])
    warmup: int = 1
    repeats: int = 3
    prefill: bool = True
    policies: list[str] = field(default_factory=lambda: ["full", "snapkv", "restkv"])
    policy_knobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    budgets: list[int] = field(default_factory=lambda: [1024])
    prefill_cache: str = "preallocated"
    decode: bool = True
    decode_tokens: int = 16
    decode_warmup_tokens: int = 2
    decode_budgets: list[int] = field(default_factory=lambda: [1024])
    decode_caches: list[str] = field(default_factory=lambda: list(CACHES))
    decode_fill: str = "synthetic"
    decode_policy: str = "restkv"
    decode_profile: bool = False
    decode_kernel: str = "model"
    decode_attention_only: bool = False
    decode_attention_calls: int = 50
    scoring_calls: int = 3
    scoring_gram_every_call: bool = True
    scoring_authors: bool = False
    capacity_policies: list[str] = field(default_factory=lambda: ["snapkv", "restkv", "ada_restkv"])
    capacity_budgets: list[Any] = field(default_factory=lambda: ["full", 0.5, 0.25, 0.125, 0.0625, 2048, 1024, 256])
    capacity_max_batch: int = 256
    prefill_chunks: list[int] = field(default_factory=lambda: [4096])
    memory_cap_mib: int | None = None
    memory: bool = True
    memory_contexts: list[int] | None = None
    bandwidth_mib: int = 1024
    bandwidth_repeats: int = 5
    bound_bandwidth: str = "copy"
    out_dir: str = "results/latency"
    plots: bool = True
    progress: bool = True

    def __post_init__(self) -> None:
        checks = [
            (self.mode in MODES, f"mode={self.mode!r}: choose one of {', '.join(MODES)}"),
            (
                self.mode != "scoring" or "full" not in self.policies,
                f"policies={self.policies}: the full cache evicts nothing, so mode=scoring has nothing to time for it",
            ),
            (self.scoring_calls >= 1, f"scoring_calls={self.scoring_calls}: must be >= 1"),
            (self.dtype in DTYPES, f"dtype={self.dtype!r}: choose one of {', '.join(DTYPES)}"),
            (self.prefill_cache in CACHES, f"prefill_cache={self.prefill_cache!r}: choose one of {', '.join(CACHES)}"),
            (
                set(self.decode_caches) <= set(DECODE_CACHES),
                f"decode_caches={self.decode_caches}: allowed {', '.join(DECODE_CACHES)}",
            ),
            (self.decode_fill in FILLS, f"decode_fill={self.decode_fill!r}: choose one of {', '.join(FILLS)}"),
            (
                self.decode_kernel in DECODE_KERNELS,
                f"decode_kernel={self.decode_kernel!r}: choose one of {', '.join(DECODE_KERNELS)}",
            ),
            (
                self.attn_implementation in SUPPORTED_ATTENTION,
                f"attn_implementation={self.attn_implementation!r}: choose one of {', '.join(SUPPORTED_ATTENTION)}",
            ),
            (
                not (self.attn_implementation.startswith("flash") and set(self.decode_caches) & set(MASKED_CACHES)),
                f"decode_caches={self.decode_caches}: {', '.join(MASKED_CACHES)} need a per-slot mask, which "
                f"attn_implementation={self.attn_implementation} does not take; drop them or use sdpa",
            ),
            (self.bound_bandwidth in BOUND_BANDWIDTHS, f"bound_bandwidth={self.bound_bandwidth!r}: copy or read"),
            (_positive_ints(self.contexts), f"contexts={self.contexts}: lengths must be positive integers"),
            (_positive_ints(self.budgets), f"budgets={self.budgets}: budgets must be positive integers"),
            (_positive_ints(self.decode_budgets), f"decode_budgets={self.decode_budgets}: positive integers"),
            (_positive_ints(self.prefill_chunks), f"prefill_chunks={self.prefill_chunks}: positive integers"),
            (self.repeats >= 1 and self.warmup >= 0, "repeats must be >= 1 and warmup >= 0"),
            (
                all(_budget_spec(b) for b in self.capacity_budgets),
                f"capacity_budgets={self.capacity_budgets}: each is full, a fraction in (0, 1) or a token count > 0",
            ),
            (self.capacity_max_batch >= 1, f"capacity_max_batch={self.capacity_max_batch}: must be >= 1"),
            (
                self.memory_cap_mib is None or (_positive_ints([self.memory_cap_mib])),
                f"memory_cap_mib={self.memory_cap_mib!r}: null or a positive integer (MiB)",
            ),
            (self.decode_tokens >= 1 and self.decode_warmup_tokens >= 0, "decode_tokens must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"latency.{message}")
        for name in {*self.policies, self.decode_policy, *self.capacity_policies}:
            config_file("policy", name, "policy")  # fails early on an unknown policy name

    @classmethod
    def from_config(cls, cfg: DictConfig, preset: str) -> Settings:
        values = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(values, dict)
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - allowed)
        if unknown:
            raise ValueError(
                f"latency config has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
            )
        values["name"] = values.get("name") or preset
        return cls(**values)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype, "latency.dtype")

    def resolved_device(self) -> torch.device:
        return pick_device(self.device, "latency.device")

    def json_path(self) -> Path:
        out = Path(self.out_dir)
        return (out if out.is_absolute() else project_root() / out) / f"{self.name}.json"


def shape_path(shape: str) -> Path:
    return config_file("shapes", shape, "model shape", suffix=".json")


def model_config(settings: Settings) -> PretrainedConfig:
    """The shape's ``config.json`` as a transformers config, optionally cut to ``layers`` layers."""
    values = json.loads(shape_path(settings.shape).read_text())
    if settings.layers is not None:
        if not 1 <= settings.layers <= values["num_hidden_layers"]:
            raise ValueError(f"latency.layers={settings.layers} must be in [1, {values['num_hidden_layers']}]")
        values["num_hidden_layers"] = settings.layers
    config = AutoConfig.for_model(**values)
    config._attn_implementation = settings.attn_implementation
    return config
