"""One prefill at a time under a compressor: which thread's prefill is in flight.

A compressor holds one prefill's captured queries and record. A prefill started from a second thread while
another thread's is in flight would mix the two and give wrong outputs, so it is refused; threads taking turns
are fine. A prefill is in flight from its first layer's attention to its last layer's eviction; a forward that
raises in between releases it, and so do the same thread's next prefill, the owner thread's end, and the
compressor's exit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class PrefillGate:
    """The thread whose prefill is in flight; ``drop`` forgets what an interrupted or finished prefill captured."""

    def __init__(self, drop: Callable[[], None]) -> None:
        self._drop = drop
        self._lock = threading.Lock()
        self._owner: threading.Thread | None = None

    def begin(self, layer: int) -> None:
        """Make this thread's prefill the one in flight, or refuse it if another thread's is.

        State left by an interrupted prefill is dropped: that of a thread that has ended, and this thread's own
        when it starts a new prefill (at layer 0).
        """
        me = threading.current_thread()
        with self._lock:
            owner = self._owner
            if owner is not None and owner is not me and owner.is_alive():
                raise RuntimeError(
                    f"a prefill started in thread {me.name!r} while thread {owner.name!r} is in the middle of a "
                    "prefill under the same compressor; one compressor holds one prefill's captured queries and "
                    "record at a time, so the two would mix and give wrong outputs. Give each thread its own copy "
                    "of the model under its own compress(...), or serialise the calls (hold a lock around each "
                    "generate or forward)"
                )
            if owner is not me or layer == 0:
                self._drop()
            self._owner = me

    def end(self) -> None:
        """Release the gate if this thread's prefill is in flight (no-op otherwise)."""
        with self._lock:
            if self._owner is threading.current_thread():
                self._owner = None
                self._drop()

    def owned(self) -> bool:
        """Whether this thread's prefill is in flight."""
        # No lock needed: only this thread sets the owner to itself or clears it from itself.
        return self._owner is threading.current_thread()

    def reset(self) -> None:
        """Release the gate whoever holds it (the compressor's exit)."""
        with self._lock:
            self._owner = None
            self._drop()
