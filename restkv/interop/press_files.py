"""The files kvpress's hub presses fetch per model, and the check, before any work, that they can be had.

Seven presses of kvpress 0.5.5 load trained per-model files when they are attached to a model
(``post_init_from_model``): five from the Hugging Face hub, from a repository named after the model,
two over HTTP from their authors' GitHub repositories. `needed_files` says which, from the model's
name (``config.name_or_path``, derived as kvpress derives it); `check_press_files` raises
`PressFilesMissing` in well under a second when they are neither here nor fetchable, naming the
press, the repository and the files and the command that fetches them, instead of a traceback from
deep inside kvpress (or a long network timeout) once a model is loaded.

Where the hub (or the authors' host) can be reached, nothing is refused: kvpress downloads as usual.
Offline (``HF_HUB_OFFLINE`` set, or the host not answering) the files must be in the local hub cache
(``HF_HUB_CACHE``, laid out as the hub's libraries write it), or, for the HTTP files and
ExpectedAttentionStatsPress's statistics, in a local folder that ``policy.files`` names.
"""

from __future__ import annotations

import functools
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIXIN_FILES = ("config.json", "model.safetensors")
"""What a hub module saved by ``save_pretrained`` is read from (kvpress's Q-filters, KVzap networks, statistics)."""

DUO_BASE = "https://raw.githubusercontent.com/mit-han-lab/duo-attention/refs/heads/main/attn_patterns"
"""Where kvpress's DuoAttentionPress reads its head patterns from (one folder per model)."""
DUO_FILES = ("config.json", "full_attention_heads.tsv")

HUB_PRESSES = ("QFilterPress", "KVzapPress", "ExpectedAttentionStatsPress", "FastKVzipPress", "RestoreKVPress")
"""Presses whose files come from the Hugging Face hub."""
HTTP_PRESSES = ("DuoAttentionPress", "LUKVPress")
"""Presses whose files come over plain HTTP (kvpress keeps them in memory only, never on disk)."""
FILE_PRESSES = (*HUB_PRESSES, *HTTP_PRESSES)
LOCAL_FOLDER = ("ExpectedAttentionStatsPress", *HTTP_PRESSES)
"""Presses that take ``policy.files``: a local folder holding their files (kvpress's own ``stats_folder`` for
ExpectedAttentionStatsPress; for the HTTP presses the files under their URLs' last names)."""


class PressFilesMissing(ValueError):
    """A press's per-model files are not here and cannot be fetched (the message says what to fetch and how)."""


@dataclass(frozen=True)
class HubFiles:
    """Files of one hub repository a press loads."""

    repo: str
    files: tuple[str, ...]

    def missing(self) -> list[str]:
        """The files the local hub cache lacks (looked up on disk only, never over the network)."""
        from huggingface_hub import try_to_load_from_cache

        return [name for name in self.files if not isinstance(try_to_load_from_cache(self.repo, name), str)]

    def fetch(self, names: list[str]) -> str:
        return f"hf download {self.repo} {' '.join(names)}"


@dataclass(frozen=True)
class UrlFiles:
    """Files a press reads over HTTP; ``folder`` (``policy.files``) holds local copies under the URLs' last names."""

    urls: tuple[str, ...]
    folder: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(url.rstrip("/").rsplit("/", 1)[-1] for url in self.urls)

    def missing(self) -> list[str]:
        if self.folder is None:
            return list(self.urls)
        return [name for name in self.names if not (Path(self.folder) / name).is_file()]

    def fetch(self, names: list[str]) -> str:
        target = self.folder or "<folder>"
        return " && ".join(
            f"curl -L --create-dirs -o {target}/{n} {u}" for n, u in zip(self.names, self.urls, strict=True)
        )


@dataclass(frozen=True)
class LocalFolder:
    """A local folder of files a press reads itself (``policy.files``)."""

    folder: str
    files: tuple[str, ...]

    def missing(self) -> list[str]:
        return [name for name in self.files if not (Path(self.folder) / name).is_file()]


def hub_name(name_or_path: str) -> str:
    """A model's hub id: ``name_or_path`` itself, or, for a snapshot of the local hub cache (what the runner loads
    offline), the id of the repository it belongs to (``.../models--org--name/snapshots/<revision>``)."""
    match = re.search(r"models--([^/\\]+?)--([^/\\]+)[/\\]snapshots[/\\][^/\\]+[/\\]?$", name_or_path)
    return f"{match.group(1)}/{match.group(2)}" if match else name_or_path


def last_part(name: str) -> str:
    return name.split("/")[-1]


def press_class(press: str) -> Any:
    from restkv.interop import require_kvpress

    return getattr(require_kvpress(), press)


def text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def cached_config(name_or_path: str) -> Any:
    """The model's config read without the network (a local folder, or the local hub cache), else None."""
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(name_or_path, local_files_only=True)
    except Exception:  # not here: the file names that depend on it are then named by pattern
        return None


def needed_files(press: str, name: str, config: Any, settings: dict[str, Any]) -> HubFiles | UrlFiles | LocalFolder:
    """What ``press`` loads for the model named ``name`` (``config``: its config, for file names that depend on
    its shape), with the policy's ``settings`` (``files``, ``model_type``, ``n_sink``, ``inner``)."""
    last, folder = last_part(name), settings.get("files")
    if press == "QFilterPress":
        last = last if "Meta-Llama-3.1-405B" in last else last.replace("Meta-Llama", "Llama")
        return HubFiles(f"nthngdy/{last}_qfilt", MIXIN_FILES)
    if press == "KVzapPress":
        return HubFiles(f"nvidia/KVzap-{settings.get('model_type') or 'mlp'}-{last}", MIXIN_FILES)
    if press == "ExpectedAttentionStatsPress":
        if folder is not None:
            return LocalFolder(folder, MIXIN_FILES)
        cls = press_class(press)
        parts = (name, cls.dataset_name, cls.num_samples, cls.sample_seq_len, settings.get("n_sink") or cls.n_sink)
        return HubFiles("alessiodevoto/exp_att_stats_" + "_".join(str(p).replace("/", "_") for p in parts), MIXIN_FILES)
    if press == "FastKVzipPress":
        text = text_config(config) if config is not None else None
        group = "<heads per key/value head>" if text is None else text.num_attention_heads // text.num_key_value_heads
        return HubFiles("Jang-Hyun/Fast-KVzip", (f"{last.lower()}/q{group}_dim16_sink16.pt",))
    if press == "RestoreKVPress":
        files = ("restore_embeddings.safetensors", "adapter_config.json", "adapter_model.safetensors")
        return HubFiles(f"higokri/RestoreKV-{last}", files)
    if press == "DuoAttentionPress":
        from kvpress.presses.duo_attention_press import PATTERNS_DICT

        if name not in PATTERNS_DICT:
            raise ValueError(
                f"DuoAttentionPress has head patterns for these models only: {', '.join(PATTERNS_DICT)}; this model "
                f"is named {name!r} (its config's name_or_path)"
            )
        return UrlFiles(tuple(f"{DUO_BASE}/{PATTERNS_DICT[name]}/{n}" for n in DUO_FILES), folder)
    if press == "LUKVPress":
        from kvpress.presses.lukv_press import BUDGET_CURVE_URLS

        url = BUDGET_CURVE_URLS.get((name, settings.get("inner")))
        if url is None:
            known = ", ".join(f"{m} with policy.inner={p}" for m, p in BUDGET_CURVE_URLS)
            raise ValueError(
                f"LUKVPress has budget curves for these only: {known}; not for {name!r} (its config's name_or_path) "
                f"with policy.inner={settings.get('inner')}"
            )
        return UrlFiles((url,), folder)
    raise ValueError(f"{press} fetches no per-model files; those that do: {', '.join(FILE_PRESSES)}")


@functools.cache
def host_answers(host: str, port: int = 443, timeout: float = 2.0) -> bool:
    """Whether a TCP connection to ``host`` opens within ``timeout`` (asked once per process)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def offline_requested() -> bool:
    """Whether the hub libraries are told to stay offline (``HF_HUB_OFFLINE``, read now or when they loaded)."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE", "0").strip().lower()
    return bool(constants.HF_HUB_OFFLINE) or value not in ("", "0", "false", "no")


def offline_reason(files: HubFiles | UrlFiles) -> str | None:
    """Why ``files`` cannot be fetched here (None when they can): offline asked for, or the host not answering
    (the hub's: ``HF_ENDPOINT``'s when set)."""
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if offline_requested():
        return "HF_HUB_OFFLINE is set"
    where = urlparse(constants.ENDPOINT if isinstance(files, HubFiles) else files.urls[0])
    host = where.hostname or ""
    port = where.port or (80 if where.scheme == "http" else 443)
    return None if host_answers(host, port) else f"{host} does not answer"


def check_press_files(press: str, name_or_path: str, config: Any, settings: dict[str, Any]) -> None:
    """Raise `PressFilesMissing` when ``press`` cannot have its files for this model (see the module); fast: the
    local cache is read from disk, and the network is asked at most once (a TCP connection, when not offline)."""
    if press not in FILE_PRESSES:
        return
    name = hub_name(name_or_path)
    if config is None and press == "FastKVzipPress":  # its file's name depends on the model's heads
        config = cached_config(name_or_path)
    files = needed_files(press, name, config, settings)
    missing = files.missing()
    if not missing:
        return
    if isinstance(files, LocalFolder):
        raise PressFilesMissing(
            f"{press}: policy.files={files.folder!r} lacks {', '.join(missing)} (kvpress reads its statistics from "
            f"that folder: the {', '.join(files.files)} its ExpectedAttentionStats.save_pretrained writes)"
        )
    if isinstance(files, UrlFiles) and files.folder is not None:
        raise PressFilesMissing(
            f"{press}: policy.files={files.folder!r} lacks {', '.join(missing)}; fetch them: {files.fetch(missing)}"
        )
    reason = offline_reason(files)
    if reason is None:
        return  # kvpress fetches them when the press is attached to the model
    if isinstance(files, HubFiles):
        from huggingface_hub import constants

        raise PressFilesMissing(
            f"{press} loads {', '.join(missing)} of the hub repository {files.repo} for the model {name!r}, which "
            f"the local hub cache ({constants.HF_HUB_CACHE}) lacks, and {reason}: fetch them where the hub can be "
            f"reached, into that cache: {files.fetch(missing)}"
        )
    raise PressFilesMissing(
        f"{press} reads {', '.join(files.urls)} for the model {name!r}, and {reason}: fetch them into a folder and "
        f"name it with policy.files=<folder>: {files.fetch(missing)}"
    )


def check_local_setting(press: str, files: str | None) -> None:
    """``policy.files`` is taken by the presses of `LOCAL_FOLDER` only, and must name a folder."""
    if files is None:
        return
    if press not in LOCAL_FOLDER:
        raise ValueError(
            f"KVPressPolicy.files={files!r} is not allowed with press={press!r}: only {', '.join(LOCAL_FOLDER)} read "
            "their files from a local folder (the hub presses read the local hub cache, HF_HUB_CACHE)"
        )
    if not os.path.isdir(files):
        raise ValueError(f"KVPressPolicy.files={files!r} is not a folder (it names the folder holding {press}'s files)")
