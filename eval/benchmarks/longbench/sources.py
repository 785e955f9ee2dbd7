"""Where ``scripts/download_data.py`` gets LongBench: ``longbench`` (the 21 v1 files ``<task>.jsonl``) and
``longbench_e`` (the 13 LongBench-E files ``<task>_e.jsonl``), from the official ``data.zip`` of the hub dataset
``THUDM/LongBench`` (the hub first, its URL next), into ``data/LongBench/``."""

from __future__ import annotations

import zipfile
from pathlib import Path

from restkv.eval.benchmarks.longbench.archive import HUB_ARCHIVE, HUB_REPO
from restkv.eval.benchmarks.longbench.prompts import TASKS, TASKS_E
from restkv.eval.benchmarks.shared.fetching import (
    Dataset,
    Network,
    Outcome,
    check_jsonl,
    extract,
    from_archive,
    hub_source,
    install,
    missing,
    rel,
    url_source,
)

LONGBENCH_ZIP_URL = f"https://huggingface.co/datasets/{HUB_REPO}/resolve/main/{HUB_ARCHIVE}"


def get_longbench(root: Path, force: bool, net: Network, e: bool) -> Outcome:
    name = "longbench_e" if e else "longbench"
    folder = root / "LongBench"
    files = [f"{t}_e.jsonl" if e else f"{t}.jsonl" for t in (TASKS_E if e else TASKS)]
    manual = f"download {LONGBENCH_ZIP_URL} and unzip its data/{'*_e' if e else '*'}.jsonl files into {rel(folder)}/"
    todo = missing(folder, files, force)
    if not todo:
        return Outcome(name, True, f"{rel(folder)} ({len(files)} files, already present)")

    def unpack(archive: zipfile.ZipFile) -> Outcome:
        members = {m.rsplit("/", 1)[-1]: m for m in archive.namelist() if m.endswith(".jsonl")}
        absent = [f for f in todo if f not in members]
        for file in todo:
            if file in members:
                install(folder / file, extract(archive, members[file]), check_jsonl)
        if absent:
            return Outcome(name, False, f"the archive lacks {', '.join(absent)}; to get it manually: {manual}")
        return Outcome(name, True, f"{rel(folder)} ({len(files)} files)")

    sources = [hub_source(HUB_REPO, HUB_ARCHIVE), url_source(LONGBENCH_ZIP_URL)]
    return from_archive(name, folder, sources, net, manual, unpack)


SOURCES = (
    Dataset("longbench", lambda root, force, net: get_longbench(root, force, net, e=False)),
    Dataset("longbench_e", lambda root, force, net: get_longbench(root, force, net, e=True)),
)
