"""Whether the Hugging Face hub can be reached, decided once and quickly, and fetching a dataset file from it.

Loaders try the hub only when it answers, so an offline machine fails over to local files at
once instead of spending tens of seconds in ``datasets`` retries.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path

HUB_HOST = "huggingface.co"
"""The hub's host unless ``HF_ENDPOINT`` names a mirror (`hub_host`)."""


def hub_host() -> str:
    """The host the hub libraries will contact: ``HF_ENDPOINT``'s (a mirror), else huggingface.co."""
    from urllib.parse import urlparse

    endpoint = os.environ.get("HF_ENDPOINT", "").strip()
    return (urlparse(endpoint).hostname if endpoint else None) or HUB_HOST


def hub_port() -> int:
    from urllib.parse import urlparse

    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "").strip() or f"https://{HUB_HOST}")
    return endpoint.port or (80 if endpoint.scheme == "http" else 443)


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
        with socket.create_connection((hub_host(), hub_port()), timeout=timeout):
            return True
    except OSError:
        return False


def cached_model(repo_id: str) -> Path | None:
    """The folder of ``repo_id``'s newest snapshot in the local hub cache, found without the network, or None."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # not cached, not a repo id, a broken cache: all mean "not here"
        return None


def cache_folder() -> str:
    """Where the hub libraries keep downloads (``HF_HUB_CACHE`` / ``HF_HOME``), for messages."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def download_dataset_file(repo_id: str, filename: str) -> tuple[Path | None, str]:
    """Download (or find in the hub cache) ``filename`` of the hub dataset ``repo_id``.

    Returns ``(path, "")``, or ``(None, reason)`` when the hub is not reachable or the download
    fails for any reason (network, authentication, disk): a loader then reports the reason
    next to the files it could not find, instead of failing on the first one.
    """
    if not hub_reachable():
        return None, "the Hugging Face hub is not reachable (or HF_HUB_OFFLINE is set)"
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo_id=repo_id, filename=filename, repo_type="dataset")), ""
    except Exception as exc:  # network, auth, disk: all mean "not from the hub"
        return None, f"downloading {repo_id}/{filename} failed ({type(exc).__name__}: {exc})"
