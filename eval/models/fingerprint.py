"""The identity of a local model folder's bytes: a SHA-256 fingerprint of its weights, config and tokenizer.

A model changed in place must never have its old predictions resumed as its own, so a run's identity
holds this fingerprint. Each file is hashed once and cached by (path, size, mtime, inode, ctime): an edit in place
that keeps the size and puts the mtime back (``touch -r``) still changes the ctime, which no user can set, so the
file is hashed again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from restkv.eval.models.paths import local_path
from restkv.eval.models.spec import TOKENIZER_FILES, WEIGHTS, ModelSpec, is_int

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
system's timestamp tick would keep its size and times, and the cache would miss the change."""
STAT_KEY = ("size", "mtime_ns", "ino", "ctime_ns")
"""What a cached hash is valid for: the file's size, mtime, inode and ctime (`_stat_key`)."""


def _stat_key(stat: os.stat_result) -> dict[str, int]:
    """The fields of ``stat`` a cached hash is keyed by: the mtime alone can be set back (``touch -r``), the ctime
    cannot, and a file replaced by another (a new inode) may carry the old one's times."""
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ino": stat.st_ino, "ctime_ns": stat.st_ctime_ns}


def weights_fingerprint(spec: ModelSpec) -> str | None:
    """``sha256:<hex>`` of every byte of a local model folder's weight, config and tokenizer files.

    None for hub ids. Run folders are named after the config, not the weights: a model retrained in
    place would otherwise have its old predictions resumed as if they were its own. Each file's
    SHA-256 is computed once and cached by (path, size, mtime, inode, ctime); ``random_init`` folders are
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
    """Each file's SHA-256 (hex), from the cache when its size, mtime, inode and ctime are those it was hashed at."""
    cache = _read_cache()
    stats = {file: file.stat() for file in files}
    keys = {file: str(file.resolve()) for file in files}
    digests: dict[Path, str] = {}
    todo = []
    for file in files:
        entry = cache.get(keys[file])
        if entry is not None and {key: entry[key] for key in STAT_KEY} == _stat_key(stats[file]):
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
            unchanged = _stat_key(after) == _stat_key(stats[file])
            if unchanged and after.st_mtime_ns < started - RACY_NS:
                fresh[keys[file]] = {**_stat_key(after), "sha256": digests[file]}
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
        and all(is_int(entry.get(key)) for key in STAT_KEY)
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


def input_digests(files: list[Path]) -> dict[str, str]:
    """``{file: sha256}`` of the data files a run read (`restkv.eval.benchmarks.contract.reads`), each hashed once
    and cached like the weights; files under the project are named relative to it, so a checkout moved keeps
    its identities."""
    from restkv.eval.models.paths import project_root

    root = project_root().resolve()
    existing = sorted({Path(f).resolve() for f in files if Path(f).is_file()})
    digests = file_digests(existing)
    named = {}
    for file in existing:
        label = str(file.relative_to(root)) if file.is_relative_to(root) else str(file)
        named[label] = f"{FINGERPRINT_SCHEME}:{digests[file]}"
    return named
