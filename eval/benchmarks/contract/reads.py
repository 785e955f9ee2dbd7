"""The data files a benchmark reads while it loads its samples, recorded so that a run's identity can hash them.

A run folder holds one experiment, and the data it was run on is part of what it is: a RULER file or a
LongBench task file edited between two runs of one folder must not be resumed as the same experiment. Every
reader of user data (official JSON-lines files, archives, haystack texts, RULER's QA sets and word list)
`note`s the file; the runner loads the samples inside `recording` and hashes what was noted. Files bundled with
the package (the default haystack novel, the word lists) are part of the code's version and are noted too when
read; cached readers note their file on every call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

_RECORD: ContextVar[list[Path] | None] = ContextVar("benchmark_reads", default=None)


@contextlib.contextmanager
def recording() -> Iterator[list[Path]]:
    """Collect, in the list yielded, every file noted inside the ``with`` block (each once, resolved)."""
    files: list[Path] = []
    token = _RECORD.set(files)
    try:
        yield files
    finally:
        _RECORD.reset(token)


def note(path: str | Path) -> None:
    """Record that ``path`` is read (nothing happens outside `recording`)."""
    files = _RECORD.get()
    if files is not None:
        resolved = Path(path).expanduser().resolve()
        if resolved not in files:
            files.append(resolved)
