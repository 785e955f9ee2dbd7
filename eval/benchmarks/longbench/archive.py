"""The official ``data.zip`` of ``THUDM/LongBench``, read in place when task files are missing from the data folder."""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

from restkv.eval.benchmarks.contract.reads import note
from restkv.eval.benchmarks.shared.jsonl import JsonlSource, iter_lines
from restkv.eval.models.hub import download_dataset_file

HUB_REPO = "THUDM/LongBench"
HUB_ARCHIVE = "data.zip"
DEFAULT_DATA_DIR = "data/LongBench"


@dataclass
class Archive:
    """The official ``data.zip`` of ``THUDM/LongBench``, downloaded (or found in the cache) at most once per load.

    The :class:`~restkv.eval.benchmarks.shared.official.FileFallback` of a load: task files missing from the
    data folder are read from the archive in place, without unpacking it.
    """

    path: Path | None = None
    failure: str = ""
    tried: bool = False
    _zip: zipfile.ZipFile | None = None

    def open(self, file_name: str) -> JsonlSource | None:
        if not self.tried:
            self.tried = True
            self.path, self.failure = fetch_archive()
            if self.path is not None:
                self._zip = zipfile.ZipFile(self.path)
        if self._zip is None:
            return None
        note(self.path)
        member = next((n for n in self._zip.namelist() if n.rsplit("/", 1)[-1] == file_name), None)
        if member is None:
            return None
        where = f"{self.path}:{member}"
        return JsonlSource(where, iter_lines(self._zip.open(member), where))

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()
            self._zip = None


def fetch_archive() -> tuple[Path | None, str]:
    """Download (or find in the hub cache) the official ``data.zip``; ``(path, "")`` or ``(None, reason)``."""
    return download_dataset_file(HUB_REPO, HUB_ARCHIVE)
