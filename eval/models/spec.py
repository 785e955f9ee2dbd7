"""What a ``model`` config names, and whether it can load: `ModelSpec` and the checks made before any work.

``check_model`` refuses a setting that cannot load (naming the key, the value and what is allowed)
before a run folder is created; ``check_attention_backend`` refuses a flash-attention backend that
cannot run here. Loading itself is `restkv.eval.models.loading`; the weights' identity is
`restkv.eval.models.fingerprint`.
"""

from __future__ import annotations

import importlib.util
import json
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from restkv.devices import torch_dtype
from restkv.eval.models.paths import CHECKOUT, local_path
from restkv.eval.models.placement import DEVICE_MAPS

ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")
"""Backends runs may name (flash_attention_2, the authors', is covered by the gpu tests)."""
UNTESTED_ATTENTION = {"flash_attention_3": "no test runs it on a GPU yet; use flash_attention_2 (the authors') or sdpa"}


@dataclass
class ModelSpec:
    """The ``model`` config group (every field is a ``model.<field>=...`` override for every model).

    path: hub id (``meta-llama/Llama-3.1-8B-Instruct``) or local folder; relative folders are
      looked up from the working directory, then from the repository root.
    tokenizer: where the tokenizer lives when not beside the weights (a folder or a hub id).
    max_context: prompts longer than this are cut in the middle (first and last halves kept).
    chat_template: wrap prompts in the tokenizer's chat template (benchmarks may opt out per task).
    random_init: build the architecture from ``config.json`` with random weights (no weights
      needed: smoke tests, latency); ``seed`` seeds them.
    device_map: null loads the weights straight onto the run's ``device``; ``auto`` (or another of
      `DEVICE_MAPS`) splits the layers over every visible GPU, as a 70B model needs. Placement only:
      not part of a run's identity.
    notes: what a run of this model on a benchmark should say about its scores, by bench name (``"*"``: every
      benchmark), printed with the run's results and kept in ``metrics.json``; e.g. that a small model cannot
      answer a benchmark's questions. Not part of a run's identity.
    """

    name: str
    path: str
    dtype: str = "bfloat16"
    attn_implementation: str = "sdpa"
    max_context: int = 131072
    chat_template: bool = True
    tokenizer: str | None = None
    random_init: bool = False
    seed: int = 0
    device_map: str | None = None
    notes: dict[str, str] = field(default_factory=dict)

    def notes_for(self, bench: str) -> list[str]:
        """The notes a run of ``bench`` prints: the model's note for every benchmark, then the bench's own."""
        return [self.notes[key] for key in ("*", bench) if key in self.notes]

    def __post_init__(self) -> None:
        """Refuse a wrong type or value by its key: ``chat_template=maybe`` would otherwise read as true."""
        torch_dtype(self.dtype, "model.dtype")
        if self.attn_implementation in UNTESTED_ATTENTION:
            reason = UNTESTED_ATTENTION[self.attn_implementation]
            raise ValueError(f"model.attn_implementation={self.attn_implementation!r} is not supported: {reason}")
        for key, (allowed, rule) in FIELD_RULES.items():
            value = getattr(self, key)
            if not rule(value):
                raise ValueError(f"model.{key}={value!r} is not allowed; {allowed}")


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_text(value: object) -> bool:
    return isinstance(value, str) and value != ""


def _is_device_map(value: object) -> bool:
    if value is None or value in DEVICE_MAPS:
        return True
    return _is_text(value) and re.fullmatch(r"cpu|cuda(:\d+)?", value) is not None


FIELD_RULES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "name": ("use a non-empty string", _is_text),
    "path": ("use a local folder or a hub id (owner/name)", _is_text),
    "attn_implementation": (
        f"choose one of: {', '.join(ATTN_IMPLEMENTATIONS)}",
        lambda value: value not in UNTESTED_ATTENTION and value in ATTN_IMPLEMENTATIONS,
    ),
    "max_context": ("use an integer >= 2", lambda value: is_int(value) and value >= 2),
    "chat_template": ("use true or false", lambda value: isinstance(value, bool)),
    "tokenizer": ("use a local folder, a hub id (owner/name) or null", lambda value: value is None or _is_text(value)),
    "random_init": ("use true or false", lambda value: isinstance(value, bool)),
    "seed": ("use an integer", is_int),
    "device_map": (f"use null, {', '.join(DEVICE_MAPS)}, cpu, cuda or cuda:N", _is_device_map),
    "notes": (
        "use a mapping of bench names (or '*') to text",
        lambda value: isinstance(value, dict) and all(_is_text(k) and _is_text(v) for k, v in value.items()),
    ),
}
"""What each ModelSpec field allows (``dtype`` is checked by restkv.devices, the home of dtypes)."""


# ---------------------------------------------------------------------------------------------
# Checking a model setting before any work
# ---------------------------------------------------------------------------------------------

HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
WEIGHTS = ("*.safetensors", "*.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
MAX_SAFETENSORS_HEADER = 100_000_000  # the safetensors format's own limit


def is_hub_id(value: str) -> bool:
    """``owner/name`` as the Hugging Face hub spells repository ids (no local check, no network)."""
    return HUB_ID.fullmatch(value) is not None and ".." not in value and "--" not in value


def model_spec(cfg: Any) -> ModelSpec:
    """The `ModelSpec` of a composed ``model`` config node; unknown keys are refused by name."""
    from omegaconf import OmegaConf

    values = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(values, dict)
    allowed = set(ModelSpec.__dataclass_fields__)
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ValueError(f"model config has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    return ModelSpec(**values)  # type: ignore[arg-type]


def check_model(spec: ModelSpec) -> None:
    """Refuse, before any folder is created or file written, a model setting that cannot load.

    A local folder must hold a ``config.json``, a weight file (unless ``random_init``) whose
    safetensors are complete, and a tokenizer (or ``model.tokenizer`` names one); anything else must
    look like a hub id, which is left to the hub (no network here). Errors name the key and value.
    """
    folder = _local_folder("path", spec.path)
    for key, given in (("path", spec.path), ("tokenizer", spec.tokenizer)):
        if given is not None and _local_folder(key, given) is None:
            check_hub_model(key, given)
    if folder is not None:
        tokenizer_elsewhere = spec.tokenizer is not None
        missing = _missing_files(folder, weights=not spec.random_init, tokenizer=not tokenizer_elsewhere)
        if missing:
            raise ValueError(f"model.path={spec.path!r} ({folder}) lacks what loading it needs: {'; '.join(missing)}")
        if not spec.random_init:
            _check_weight_files(spec.path, folder)
    if spec.tokenizer is not None:
        tokenizer_folder = _local_folder("tokenizer", spec.tokenizer)
        if tokenizer_folder is not None and not any((tokenizer_folder / name).is_file() for name in TOKENIZER_FILES):
            raise ValueError(
                f"model.tokenizer={spec.tokenizer!r} ({tokenizer_folder}) holds no tokenizer: "
                f"none of {', '.join(TOKENIZER_FILES)}"
            )


class ModelUnavailable(FileNotFoundError):
    """A hub model that is not on this machine while the hub cannot be reached."""


def check_hub_model(key: str, repo_id: str) -> None:
    """Refuse at once a hub id that is neither cached nor downloadable (the hub libraries would retry for minutes,
    then fail with a traceback); a cached one is read from the cache (`restkv.eval.models.loading.resolve`)."""
    from restkv.eval.models.hub import cache_folder, cached_model, hub_host, hub_reachable, offline_requested

    if hub_reachable() or cached_model(repo_id) is not None:
        return
    why = "HF_HUB_OFFLINE is set" if offline_requested() else f"{hub_host()} cannot be reached"
    raise ModelUnavailable(
        f"model.{key}={repo_id!r} is not on this machine (no such folder, not in the hub cache {cache_folder()}) and "
        f"{why}: download it where the hub answers (`hf download {repo_id}`) and copy the cache here, or set "
        f"model.{key}=<a local folder>"
    )


FLASH_PACKAGES = {"flash_attention_2": "flash_attn"}
"""The package each flash-attention backend needs (transformers imports it when the model loads)."""


def check_attention_backend(spec: ModelSpec, device_type: str) -> None:
    """Refuse, before any work, a flash-attention backend that cannot run here, naming the override that can.

    Left to transformers, a missing ``flash_attn`` fails only once the weights load, or, when the
    ``kernels`` package is installed, is silently replaced by a kernel fetched from the hub (whose
    name the compressor then refuses). No fallback is made here: the backend a run used is the one
    its config, and so its identity, names.
    """
    check_backend_runs(
        spec.attn_implementation,
        device_type,
        "model.attn_implementation",
        "device=cuda",
        " (recorded in the run's identity and folder name)",
    )


def check_backend_runs(implementation: str, device_type: str, key: str, gpu_override: str, note: str = "") -> None:
    """Refuse ``implementation`` (the value of setting ``key``) where its package or a CUDA device is missing."""
    package = FLASH_PACKAGES.get(implementation)
    if package is None:
        return
    setting = f"{key}={implementation}"
    if importlib.util.find_spec(package) is None:
        raise ValueError(
            f"{setting} needs the {package!r} package, which is not installed here (it needs a CUDA GPU); install "
            f"it, or run with {key}=sdpa{note}"
        )
    if device_type != "cuda":
        raise ValueError(
            f"{setting} runs on CUDA GPUs only and this run's device is {device_type!r}; "
            f"run on a GPU ({gpu_override}) or with {key}=sdpa"
        )


def _local_folder(key: str, value: str) -> Path | None:
    """``model.<key>``'s local folder, None for a hub id; refuses a file, a typo and anything else."""
    local = local_path(value)
    if local is not None:
        if not local.is_dir():
            raise ValueError(f"model.{key}={value!r} is a file ({local.resolve()}), not a model folder")
        return local.resolve()
    where = "the working directory" + (f" or the project ({CHECKOUT})" if CHECKOUT is not None else "")
    if not is_hub_id(value):
        raise ValueError(
            f"model.{key}={value!r} is neither a local folder nor a hub id (owner/name): no such folder in {where}; "
            "give an existing folder with a config.json, or a hub id such as meta-llama/Llama-3.1-8B-Instruct"
        )
    owner = local_path(value.split("/")[0])
    if owner is not None and owner.is_dir():  # models/micro-lama: a typo of a local folder, not a hub id
        known = sorted(p.name for p in owner.iterdir() if p.is_dir())
        raise ValueError(
            f"model.{key}={value!r} is not a folder in {owner.resolve()} (it has: {', '.join(known) or 'no folders'}); "
            "a hub id would not start with the name of a local folder"
        )
    return None


def _missing_files(folder: Path, weights: bool, tokenizer: bool) -> list[str]:
    """What a local model folder lacks, each as the user would supply it."""
    missing = []
    if not (folder / "config.json").is_file():
        missing.append("config.json")
    if weights and not any(f.is_file() for pattern in WEIGHTS for f in folder.glob(pattern)):
        missing.append("a weight file (*.safetensors or *.bin; model.random_init=true builds random weights instead)")
    if tokenizer and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        missing.append(f"a tokenizer ({', '.join(TOKENIZER_FILES)}; or model.tokenizer=<folder or hub id>)")
    return missing


def _check_weight_files(value: str, folder: Path) -> None:
    """Every safetensors file complete, and every shard a ``*.safetensors.index.json`` names present."""
    for index in sorted(folder.glob("*.safetensors.index.json")):
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"model.path={value!r}: {index} is not a readable shard index ({error})") from error
        absent = sorted(name for name in shards if not (folder / name).is_file())
        if absent:
            raise ValueError(f"model.path={value!r}: {index.name} names shards that are missing: {', '.join(absent)}")
    for file in sorted(folder.glob("*.safetensors")):
        problem = safetensors_problem(file)
        if problem is not None:
            raise ValueError(
                f"model.path={value!r}: {file} is truncated or damaged ({problem}); download or save it again"
            )


def safetensors_problem(file: Path) -> str | None:
    """Why ``file`` is not a complete safetensors file, from its header and size alone; None if it is.

    The file is an 8-byte little-endian header length, a JSON header giving each tensor's byte
    range in the data that follows, then the data: its last range must end where the file ends.
    """
    size = file.stat().st_size
    if size < 8:
        return f"{size} bytes, shorter than the 8-byte header length"
    with file.open("rb") as handle:
        (header_length,) = struct.unpack("<Q", handle.read(8))
        if header_length > min(size - 8, MAX_SAFETENSORS_HEADER):
            return f"its header is said to be {header_length} bytes but the file has {size} bytes"
        raw = handle.read(header_length)
    try:
        header = json.loads(raw)
        ends = [int(entry["data_offsets"][1]) for key, entry in header.items() if key != "__metadata__"]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as error:
        return f"its header is not a safetensors JSON header: {error}"
    data_end, data_size = max(ends, default=0), size - 8 - header_length
    if data_end != data_size:
        return f"its header says the tensor data is {data_end} bytes, the file holds {data_size}"
    return None
