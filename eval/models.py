"""Loading the model and tokenizer a config names: a hub id or a local folder, as users run it.

Also what a run needs to know about the model before any work: ``check_model`` refuses a setting
that cannot load (naming the key, the value and what is allowed) before a run folder is created,
and ``weights_fingerprint`` identifies a local folder's exact bytes, so that a model changed in
place never has its old predictions resumed as its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from eval.paths import CHECKOUT, local_path
from eval.placement import DEVICE_MAPS, check_device_map, dispatched
from restkv.devices import torch_dtype

if TYPE_CHECKING:  # transformers is imported when a model is loaded, not to check or fingerprint one
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

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


def _is_int(value: object) -> bool:
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
    "max_context": ("use an integer >= 2", lambda value: _is_int(value) and value >= 2),
    "chat_template": ("use true or false", lambda value: isinstance(value, bool)),
    "tokenizer": ("use a local folder, a hub id (owner/name) or null", lambda value: value is None or _is_text(value)),
    "random_init": ("use true or false", lambda value: isinstance(value, bool)),
    "seed": ("use an integer", _is_int),
    "device_map": (f"use null, {', '.join(DEVICE_MAPS)}, cpu, cuda or cuda:N", _is_device_map),
}
"""What each ModelSpec field allows (``dtype`` is checked by restkv.devices, the home of dtypes)."""


def resolve(path: str) -> str:
    """A local folder if one exists under that name (cwd, then the project); else the hub id unchanged."""
    local = local_path(path)
    return str(local) if local is not None else path


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


def check_model(spec: ModelSpec) -> None:
    """Refuse, before any folder is created or file written, a model setting that cannot load.

    A local folder must hold a ``config.json``, a weight file (unless ``random_init``) whose
    safetensors are complete, and a tokenizer (or ``model.tokenizer`` names one); anything else must
    look like a hub id, which is left to the hub (no network here). Errors name the key and value.
    """
    folder = _local_folder("path", spec.path)
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
        spec.attn_implementation, device_type, "model.attn_implementation", "device=cuda",
        " (recorded in the run's identity and folder name)",
    )  # fmt: skip


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


# ---------------------------------------------------------------------------------------------
# Weights fingerprint
# ---------------------------------------------------------------------------------------------

WEIGHT_FILES = (
    *WEIGHTS,
    "config.json",
    "generation_config.json",
    *TOKENIZER_FILES,
    "special_tokens_map.json",
    "chat_template.jinja",
)
"""What a fingerprint covers: weights, the config, generation settings (EOS) and the tokenizer with
its chat template, all of which change predictions. Model cards and training logs are left out."""
FINGERPRINT_SCHEME = "sha256"
CACHE_ENV = "RESTKV_CACHE_DIR"
CACHE_FILE = "file_hashes.json"
CHUNK = 8 << 20
PROGRESS_BYTES = 1 << 30
RACY_NS = 2_000_000_000
"""A file modified this close to its hashing is not cached: a same-size rewrite within the file
system's timestamp tick would keep its size and mtime, and the cache would miss the change."""


def weights_fingerprint(spec: ModelSpec) -> str | None:
    """``sha256:<hex>`` of every byte of a local model folder's weight, config and tokenizer files.

    None for hub ids. Run folders are named after the config, not the weights: a model retrained in
    place would otherwise have its old predictions resumed as if they were its own. Each file's
    SHA-256 is computed once and cached by (path, size, mtime); ``random_init`` folders are
    identified by their config, tokenizer and seed (their weight files are not read).
    """
    folder = local_path(spec.path)
    if folder is None or not folder.is_dir():
        return None
    patterns = WEIGHT_FILES[len(WEIGHTS) :] if spec.random_init else WEIGHT_FILES
    files = {f"model/{f.name}": f for pattern in patterns for f in folder.glob(pattern) if f.is_file()}
    tokenizer = local_path(spec.tokenizer) if spec.tokenizer is not None else None
    if tokenizer is not None and tokenizer.is_dir():
        files.update(
            {f"tokenizer/{name}": tokenizer / name for name in TOKENIZER_FILES if (tokenizer / name).is_file()}
        )
    digests = file_digests(sorted(files.values()))
    combined = hashlib.sha256(f"random_init={spec.random_init} seed={spec.seed}\n".encode())
    for label in sorted(files):
        combined.update(f"{label}:{digests[files[label]]}\n".encode())
    return f"{FINGERPRINT_SCHEME}:{combined.hexdigest()}"


def fingerprint_scheme_matches(saved: str) -> bool:
    """Whether a saved fingerprint was made as ``weights_fingerprint`` makes them now.

    If not (an older version sampled parts of each file), a difference says nothing about the weights.
    """
    return saved.strip().startswith(f"{FINGERPRINT_SCHEME}:")


def cache_dir() -> Path:
    """Where cached file hashes live: ``$RESTKV_CACHE_DIR``, else ``$XDG_CACHE_HOME/restkv`` or ``~/.cache/restkv``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "restkv"


def file_digests(files: list[Path]) -> dict[Path, str]:
    """Each file's SHA-256 (hex), from the cache when its size and mtime are those it was hashed at."""
    cache = _read_cache()
    stats = {file: file.stat() for file in files}
    keys = {file: str(file.resolve()) for file in files}
    digests: dict[Path, str] = {}
    todo = []
    for file in files:
        entry = cache.get(keys[file])
        if entry is not None and (entry["size"], entry["mtime_ns"]) == (stats[file].st_size, stats[file].st_mtime_ns):
            digests[file] = entry["sha256"]
        else:
            todo.append(file)
    if not todo:
        return digests
    total = sum(stats[file].st_size for file in todo)
    fresh: dict[str, dict[str, Any]] = {}
    with tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc="hashing model files",
        disable=total < PROGRESS_BYTES,
    ) as bar:
        for file in todo:
            started = time.time_ns()
            digests[file] = _sha256(file, bar)
            after = file.stat()
            unchanged = (after.st_size, after.st_mtime_ns) == (stats[file].st_size, stats[file].st_mtime_ns)
            if unchanged and after.st_mtime_ns < started - RACY_NS:
                fresh[keys[file]] = {"size": after.st_size, "mtime_ns": after.st_mtime_ns, "sha256": digests[file]}
    if fresh:
        _write_cache(fresh)
    return digests


def _sha256(file: Path, bar: tqdm) -> str:
    digest = hashlib.sha256()
    buffer = memoryview(bytearray(CHUNK))
    with file.open("rb", buffering=0) as handle:
        while read := handle.readinto(buffer):
            digest.update(buffer[:read])
            bar.update(read)
    return digest.hexdigest()


def _read_cache(warn: bool = True) -> dict[str, dict[str, Any]]:
    """The cache's well-formed entries; an unreadable or corrupt cache reads as empty (with a warning)."""
    path = cache_dir() / CACHE_FILE
    try:
        files = json.loads(path.read_text()).get("files")
        if not isinstance(files, dict):
            raise ValueError("no 'files' mapping")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, AttributeError) as error:
        if warn:
            print(f"warning: ignoring the unreadable file-hash cache {path} ({error}); hashing again", file=sys.stderr)
        return {}
    return {key: entry for key, entry in files.items() if _well_formed(entry)}


def _well_formed(entry: object) -> bool:
    return (
        isinstance(entry, dict)
        and _is_int(entry.get("size"))
        and _is_int(entry.get("mtime_ns"))
        and isinstance(entry.get("sha256"), str)
        and re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]) is not None
    )


def _write_cache(fresh: dict[str, dict[str, Any]]) -> None:
    """Add ``fresh`` to the cache atomically (other runs' entries kept, deleted files' dropped); never fails a run."""
    folder = cache_dir()
    kept = {key: entry for key, entry in _read_cache(warn=False).items() if Path(key).exists()}
    temporary: Path | None = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        descriptor, name = tempfile.mkstemp(dir=folder, prefix=f".{CACHE_FILE}.", suffix=".tmp")
        temporary = Path(name)
        with os.fdopen(descriptor, "w") as handle:
            json.dump({"version": 1, "files": {**kept, **fresh}}, handle, indent=1, sort_keys=True)
        os.replace(temporary, folder / CACHE_FILE)
    except OSError as error:
        print(
            f"warning: cannot write the file-hash cache in {folder} ({error}); files will be hashed again",
            file=sys.stderr,
        )
        if temporary is not None:
            with contextlib.suppress(OSError):
                temporary.unlink()


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def load_tokenizer(spec: ModelSpec) -> PreTrainedTokenizerBase:
    """The tokenizer of ``model.tokenizer`` when given, else the one beside the weights."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve(spec.tokenizer or spec.path))


def load_model(spec: ModelSpec, device: torch.device) -> PreTrainedModel:
    """The model in eval mode with the configured dtype and attention backend, placed straight on its devices.

    Weights load directly onto ``device`` (or, with ``model.device_map=auto``, onto every visible
    GPU, layer by layer), never all through host memory first; random weights are built there.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    check_device_map(spec.device_map, device)
    source = resolve(spec.path)
    dtype = torch_dtype(spec.dtype, "model.dtype")
    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": spec.attn_implementation}
    placement = spec.device_map if spec.device_map is not None else str(device)
    if not spec.random_init:
        model = AutoModelForCausalLM.from_pretrained(source, device_map=placement, **kwargs)
        return model.eval()
    config = AutoConfig.from_pretrained(source)
    torch.manual_seed(spec.seed)
    if spec.device_map in DEVICE_MAPS:
        return dispatched(AutoModelForCausalLM.from_config(config, **kwargs), spec.device_map).eval()
    with torch.device(placement):
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    return model.eval()


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Every token that ends an answer: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids
