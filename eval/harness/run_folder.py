"""Run folders: where a run's predictions and metrics live, and how a killed run resumes.

``predictions.jsonl`` gets one line per finished sample, flushed and synced as it is written,
so a run killed at any moment loses at most the sample in flight. On restart the file is
read back: finished samples are skipped; a line that is not valid JSON (typically the last
one, cut by the kill) is reported, moved to ``predictions.corrupt.jsonl`` for inspection and
its sample is run again.

Data that a resume cannot trust stops the run instead of being mixed in: a sample recorded twice
with different results (two runs writing into one folder), or a score that is not a finite real
number (NaN would turn every average into NaN). Both raise :class:`PredictionsError` naming the
file and line(s), before anything in the folder is changed. :class:`RunLock` keeps a second
process out of a folder while a run is writing into it, and ``metrics.json`` is strict JSON.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import socket
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from restkv.eval.harness.errors import naming
from restkv.eval.harness.metrics_file import METRICS as METRICS  # re-exported: the folder's files by name
from restkv.eval.harness.metrics_file import format_table as format_table  # re-exported (the runner, scripts)
from restkv.eval.harness.metrics_file import summarize as summarize
from restkv.eval.harness.metrics_file import write_metrics as write_metrics

PREDICTIONS = "predictions.jsonl"
CORRUPT = "predictions.corrupt.jsonl"
LOCK = ".lock"
REQUIRED_FIELDS = ("id", "task", "score")
# Measured, not computed: a sample redone after a kill has other timings but the same result.
TIMING_FIELDS = (
    "prefill_seconds",
    "decode_seconds",
    "decode_steps",
    "peak_memory_bytes",
    "decode_path",
    "decode_batch",
    "fallbacks",
)
"""Fields that depend on the machine (decode steps run past an EOS depend on the device type; which decode path
ran, the batch size and the fast paths' fallbacks, on the GPU, its stack and its free memory): a sample redone
elsewhere has others, the same result."""


class RunFolderError(Exception):
    """A run folder cannot be used as it is; the message says where and what to do."""


class PredictionsError(RunFolderError, ValueError):
    """``predictions.jsonl`` holds a result that cannot be trusted (named by file and line)."""


class RunLockedError(RunFolderError, RuntimeError):
    """Another process holds the run folder's lock; ``holder`` is what it wrote (None if unreadable)."""

    def __init__(self, folder: Path, holder: dict[str, Any] | None) -> None:
        self.folder = folder
        self.holder = holder
        if holder is None:
            who = "another process (it has not written its PID yet)"
        else:
            who = f"process {holder.get('pid')} on host {holder.get('host')} since {holder.get('since')}"
        super().__init__(
            f"{folder} is in use by {who}: a second run there would mix its results in. "
            "Wait for that run to finish, or pass another out_dir=... to run beside it"
        )


class RunLock:
    """Exclusive, non-blocking lock on a run folder (``flock`` on ``folder/.lock``) while a run writes there.

    The holder writes its PID, host name and start time into the lock file so that a refused run
    can say who holds it. The kernel releases the lock when the holding process dies, however it
    dies, so a lock file left by a killed run is only stale text and never blocks: its content is
    read only when the lock is really held. Release deletes the file while still holding it, so a finished
    folder keeps no ``.lock``; a process that opened the file just before and locks it after the deletion sees that
    the name now points elsewhere (or nowhere) and starts over, so two processes never hold two files of one name.
    A second ``RunLock`` on the same folder is refused even within one process. POSIX only.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock or raise :class:`RunLockedError` at once (never waits)."""
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this RunLock")
        self.folder.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # no truncation: the holder's text stays
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise RunLockedError(self.folder, holder) from None
            except BaseException:
                os.close(fd)
                raise
            if _same_file(fd, self.path):
                break
            os.close(fd)  # its holder deleted it on release while we waited for it: lock the new one
        since = datetime.now().astimezone().isoformat(timespec="seconds")
        text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since}) + "\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        """Delete the lock file, then unlock it; a no-op when not held."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            os.ftruncate(fd, 0)  # cannot delete (a read-only folder): at least leave no holder's text
        finally:
            os.close(fd)  # closing the only descriptor releases the flock

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _read_holder(fd: int) -> dict[str, Any] | None:
    """What the lock's holder wrote, or None if it has not written it yet (or it is not ours)."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0).decode("utf-8", errors="replace"))
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


RUN_FILES = (PREDICTIONS, METRICS, "config.yaml", "identity.json", LOCK, CORRUPT)
"""The files a run writes into its folder."""


def check_run_files(folder: Path) -> None:
    """Refuse, before any work, a run folder where something else stands in place of a file the run writes (a
    folder named ``metrics.json`` would only fail once every sample is done)."""
    for name in RUN_FILES:
        path = folder / name
        if path.exists() and not path.is_file():
            raise RunFolderError(
                f"{path} is not a file (a {'folder' if path.is_dir() else 'special file'} stands "
                f"there): move it away; the run writes its {name} there"
            )


def overrides_hash(overrides: Iterable[str]) -> str:
    """Short stable hash of command-line overrides (order-insensitive); '' when there are none."""
    items = sorted(overrides)
    if not items:
        return ""
    return hashlib.sha1("\n".join(items).encode()).hexdigest()[:8]


def run_folder(root: Path, bench: str, model: str, policy: str, budget: str, other_overrides: Iterable[str]) -> Path:
    """``root/bench/model/policy/budget`` plus ``-<hash>`` of any other override."""
    digest = overrides_hash(other_overrides)
    leaf = f"budget{budget}" + (f"-{digest}" if digest else "")
    return root / bench / model / policy / leaf


class PredictionLog:
    """Append-only JSONL of finished samples, with crash recovery on open."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / PREDICTIONS
        folder.mkdir(parents=True, exist_ok=True)
        self.records: dict[str, dict[str, Any]] = {}
        self.recovered: list[str] = []  # "file:line" of unreadable lines set aside
        self.duplicates: list[str] = []  # "file:line" of identical repeats ignored
        self._load()
        self._end_line()
        self._file = self.path.open("a", encoding="utf-8")

    def _load(self) -> None:
        """Read the file back (`read_predictions`): refuse, before touching the folder, a result that cannot be
        trusted; collapse identical repeats; set torn lines aside."""
        found = read_predictions(self.path)
        if found.problems:
            raise PredictionsError(found.problems[0])
        self.records = found.records
        self.duplicates = [f"{self.path}:{number}" for number in found.repeats]
        if found.repeats:
            repeats = found.repeats
            shown = ", ".join(map(str, repeats[:5])) + (f" and {len(repeats) - 5} more" if len(repeats) > 5 else "")
            print(f"note: {self.path}: line(s) {shown} repeat identical earlier results; ignored", file=sys.stderr)
        if found.unreadable:
            self._set_aside(found.unreadable)

    def _end_line(self) -> None:
        """End the file's last line if a kill cut its newline (the record is whole: `_load` read it), so that the
        next record starts a line of its own instead of gluing onto it."""
        if not self.path.is_file() or self.path.stat().st_size == 0:
            return
        with self.path.open("rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
                f.flush()
                os.fsync(f.fileno())
                print(f"note: {self.path}: its last line had no line end (a run was stopped while writing); added")

    def _set_aside(self, bad: list[tuple[int, str]]) -> None:
        """Move unreadable lines to ``predictions.corrupt.jsonl`` and rewrite the file without them."""
        with (self.folder / CORRUPT).open("a", encoding="utf-8") as f:
            for number, line in bad:
                f.write(line + "\n")
                self.recovered.append(f"{self.path}:{number}")
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.records.values()), "utf-8")
        os.replace(tmp, self.path)
        for where in self.recovered:
            print(
                f"warning: unreadable result line {where} moved to {CORRUPT}; its sample will be redone",
                file=sys.stderr,
            )

    def done(self, sample_id: str) -> bool:
        return sample_id in self.records

    def append(self, record: dict[str, Any]) -> None:
        """Write one finished sample and sync it to disk.

        Refused with :class:`PredictionsError` (nothing written) when its score is not a finite
        number or its id is already recorded with another result: either would make the file
        unreadable on the next resume. An identical repeat is not written again.
        """
        key = str(record["id"])
        _check_score(record, str(self.path), "not written: the scorer must return a real number")
        if key in self.records:
            differ = _differences(self.records[key], record)
            if differ:
                raise PredictionsError(
                    f"{self.path}: sample {key!r} is already recorded with another result (differing in "
                    f"{', '.join(differ)}); not written: two samples share this id, or two runs share this folder"
                )
            return
        line = json.dumps(record, ensure_ascii=False)
        with naming(self.path):
            self._file.write(line + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
        self.records[str(record["id"])] = record

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> PredictionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class PredictionsRead:
    """What ``predictions.jsonl`` holds: its trusted records, and what is wrong with the rest."""

    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    unreadable: list[tuple[int, str]] = field(default_factory=list)
    """(line, text) of lines that are not whole JSON records (a run killed mid-write): redone on resume."""
    repeats: list[int] = field(default_factory=list)
    """Lines that repeat an earlier identical result (ignored)."""
    problems: list[str] = field(default_factory=list)
    """Results that cannot be trusted (a bad score, one id with two results, a record without id or task), each
    naming the file, the line and the fix: the runner refuses the folder, the report leaves the run out."""


def read_predictions(path: Path) -> PredictionsRead:
    """The one reader of a run's ``predictions.jsonl``, for the runner (resume) and the report alike."""
    found = PredictionsRead()
    if not path.exists():
        return found
    first: dict[str, int] = {}
    for number, line, record in _read_lines(path):
        if record is None:
            found.unreadable.append((number, line))
            continue
        where = f"{path}:{number}"
        missing = [name for name in REQUIRED_FIELDS if name not in record]
        if missing:
            found.problems.append(f"{where}: a record without {', '.join(missing)}; fix or delete that line")
            continue
        try:
            _check_score(record, where, "fix that line, or delete it to have its sample redone")
        except PredictionsError as error:
            found.problems.append(str(error))
            continue
        key = str(record["id"])
        if key not in found.records:
            found.records[key], first[key] = record, number
            continue
        differ = _differences(found.records[key], record)
        if differ:
            found.problems.append(
                f"{path}: sample {key!r} has two different results, at lines {first[key]} and {number} (they differ "
                f"in {', '.join(differ)}): this folder mixes results of different runs. Keep the right line and "
                "delete the other, or move the run folder away and run again"
            )
        else:
            found.repeats.append(number)
    return found


def _read_lines(path: Path) -> Iterator[tuple[int, str, dict[str, Any] | None]]:
    """(line number, line, parsed record or None if unreadable) for every non-blank line."""
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                yield number, line.rstrip("\n"), _parse(line)


def _parse(line: str) -> dict[str, Any] | None:
    """The record on a line, or None when it is not a JSON object with the required fields (a torn write)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict) or any(field not in record for field in REQUIRED_FIELDS):
        return None
    return record


def _score_problem(score: object) -> str | None:
    """What is wrong with ``score`` ("is a string, not a number"), or None when it is a real number in [0, 1]
    (a sample's score is a fraction: 55 would turn an average of points into thousands)."""
    if isinstance(score, bool):  # before int: JSON true would otherwise average as 1
        return "is a boolean, not a number"
    if isinstance(score, int | float) and not math.isfinite(score):
        return "is not a finite number"
    if isinstance(score, int | float):
        return None if 0 <= score <= 1 else "is outside [0, 1] (a sample's score is a fraction, never points)"
    kind = {type(None): "null", str: "a string", list: "a list", dict: "an object"}.get(
        type(score), type(score).__name__
    )
    return f"is {kind}, not a number"


def _check_score(record: dict[str, Any], where: str, hint: str) -> None:
    """Raise :class:`PredictionsError` at ``where`` unless the record's score is a real number in [0, 1]."""
    problem = _score_problem(record["score"])
    if problem is not None:
        try:
            shown = json.dumps(record["score"], ensure_ascii=False)
        except TypeError:
            shown = repr(record["score"])
        raise PredictionsError(f"{where}: sample {str(record['id'])!r}: score {shown} {problem}; {hint}")


def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Fields whose values differ between two records of one id, timings aside (compared as JSON text)."""
    fields = [k for k in dict.fromkeys([*a, *b]) if k not in TIMING_FIELDS]
    missing = object()

    def text(record: dict[str, Any], key: str) -> str:
        value = record.get(key, missing)
        return "<missing>" if value is missing else json.dumps(value, sort_keys=True, ensure_ascii=False)

    return [k for k in fields if text(a, k) != text(b, k)]
