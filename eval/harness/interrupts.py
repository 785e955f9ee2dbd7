"""Ctrl-C at any moment of a command, imports included, ends in one line instead of a traceback.

An entry point calls `quiet_interrupts` first, before its heavy imports (this module imports nothing but the
standard library). From then on a ``KeyboardInterrupt`` that reaches the top of the program prints its message
(a run's says how many samples are saved, where, and that the same command resumes) or, when it has none, that
nothing had started; Python then ends as a Ctrl-C does (the shell sees 130). ``HYDRA_FULL_ERROR=1`` keeps the
traceback, as for every refused run.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType

STOPPED_EARLY = (
    "stopped (Ctrl-C) before this run's first sample: nothing of it to save; run the same command again to start "
    "it (finished runs and samples are kept)"
)


def interrupt_line(error: BaseException) -> str:
    """The line shown for a Ctrl-C: its message or `STOPPED_EARLY`, after a line break on a terminal (which has
    just echoed ``^C``)."""
    text = str(error) or STOPPED_EARLY
    return f"\n{text}" if sys.stderr.isatty() else text


def quiet_interrupts(traceback_env: str = "HYDRA_FULL_ERROR") -> None:
    """Show an uncaught ``KeyboardInterrupt`` as one line (its message, or `STOPPED_EARLY`)."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, traceback: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt) and os.environ.get(traceback_env) != "1":
            print(interrupt_line(error), file=sys.stderr, flush=True)
            return
        previous(kind, error, traceback)

    sys.excepthook = hook
