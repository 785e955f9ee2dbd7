"""Whether the Hugging Face hub can be reached, decided once and quickly.

Loaders try the hub only when it answers, so an offline machine fails over to local files at
once instead of spending tens of seconds in ``datasets`` retries.
"""

from __future__ import annotations

import functools
import os
import socket

HUB_HOST = "huggingface.co"


def offline_requested() -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` is set to a true value."""
    return any(
        os.environ.get(name, "0").strip().lower() not in ("", "0", "false", "no")
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


@functools.cache
def hub_reachable(timeout: float = 3.0) -> bool:
    """True when not asked to stay offline and a TCP connection to the hub opens within ``timeout``."""
    if offline_requested():
        return False
    try:
        with socket.create_connection((HUB_HOST, 443), timeout=timeout):
            return True
    except OSError:
        return False
