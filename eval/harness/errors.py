"""One handler for the errors a user can fix: a bad setting, missing data, a busy or foreign run folder, a file
system that says no. Each becomes one line naming what and where, and the way out; anything else (a bug) keeps
its traceback.

The run's entry point, the figures script and the latency benchmark share it, so every refusal reads alike and
exits with code 2 (``HYDRA_FULL_ERROR=1`` shows the traceback of a refused run).
"""

from __future__ import annotations

import errno
import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

USER_ERROR_TYPES: list[type[BaseException]] = [ValueError, TypeError, NotImplementedError]
"""Raised by the project's own checks with a message that says what to do (modules add theirs: `register`)."""

FILE_SYSTEM_HINTS = {
    errno.ENOSPC: "the disk is full: free some space, then run the same command again (finished samples are kept)",
    errno.EDQUOT: "the disk quota is used up: free some space, then run the same command again",
    errno.EACCES: "it is not writable by you: fix its permissions or choose another folder ({out})",
    errno.EPERM: "it is not writable by you: fix its permissions or choose another folder ({out})",
    errno.EROFS: "it is on a read-only file system: choose another folder ({out})",
    errno.EISDIR: "a folder stands where a file is expected: move it away",
    errno.ENOTDIR: "a file stands where a folder is expected (it or a parent): move it away or choose another folder",
    errno.EEXIST: "something stands in the way: move it away",
}


def register(*types: type[BaseException]) -> None:
    """Add exception types whose messages are meant for the user."""
    USER_ERROR_TYPES.extend(t for t in types if t not in USER_ERROR_TYPES)


OUT_OPTION = "out_dir=..."
"""How the run's command line names its output folder (a script passes its own option, e.g. ``--out``)."""


def user_message(error: BaseException, out: str = OUT_OPTION) -> str | None:
    """The one line shown for ``error``, or None when it is not a user's to fix (it keeps its traceback); ``out``
    is how the command names its output folder, for the hints."""
    if isinstance(error, OSError) and (error.filename or error.errno in FILE_SYSTEM_HINTS):
        where = " -> ".join(str(f) for f in (error.filename, error.filename2) if f) or "(path not known)"
        what = error.strerror or str(error)
        hint = FILE_SYSTEM_HINTS.get(error.errno or 0, "").format(out=out)
        return f"{what}: {where}" + (f"; {hint}" if hint else "")
    if isinstance(error, OSError) and error.args and isinstance(error.args[0], str) and len(error.args) == 1:
        return error.args[0]  # our loaders' FileNotFoundError("... is missing; get it with ...")
    if isinstance(error, tuple(USER_ERROR_TYPES)):
        return str(error)
    return None


@contextmanager
def one_line_errors(
    exit_code: int = 2,
    traceback_env: str = "HYDRA_FULL_ERROR",
    out: str = OUT_OPTION,
    announce_interrupts: bool = True,
) -> Iterator[None]:
    """Inside the block, a user's error ends the process with one line on stderr and ``exit_code``; a Ctrl-C with
    its own line (none when ``announce_interrupts`` is False: a sweep's worker, whose launcher says it)."""
    try:
        yield
    except KeyboardInterrupt as error:  # Ctrl-C: one line (the run's own says what is saved), the shell's code
        if os.environ.get(traceback_env) == "1":
            raise
        if not announce_interrupts:
            sys.exit(130)
        from restkv.eval.harness.interrupts import interrupt_line

        print(interrupt_line(error), file=sys.stderr)
        sys.exit(130)
    except Exception as error:
        message = user_message(error, out)
        if message is None or os.environ.get(traceback_env) == "1":
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(exit_code)


def guarded(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with `one_line_errors` around it (a script's ``main``)."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        with one_line_errors():
            return function(*args, **kwargs)

    return run


def guarded_script(out: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`guarded` for a script whose output folder is the option ``out`` (``--out``): its hints name that option."""

    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            with one_line_errors(out=out):
                return function(*args, **kwargs)

        return run

    return wrap


@contextmanager
def naming(path: Path | str) -> Iterator[None]:
    """Inside the block, an ``OSError`` that names no file (a write that hits a full disk) is re-raised naming
    ``path``, so that its one-line message says where."""
    try:
        yield
    except OSError as error:
        if error.filename or error.errno is None:
            raise
        raise type(error)(error.errno, error.strerror or str(error), str(path)) from error
