"""Where ``scripts/download_data.py infinitebench`` gets InfiniteBench: the 12 ``<task>.jsonl`` of the hub dataset
``xinrongzhang2022/InfiniteBench``, each from the hub or its URL, into ``data/InfiniteBench/``."""

from __future__ import annotations

import tempfile
from pathlib import Path

from restkv.eval.benchmarks.infinitebench.benchmark import HUB_REPO, TASKS
from restkv.eval.benchmarks.shared.fetching import (
    Dataset,
    FetchError,
    Network,
    Outcome,
    check_jsonl,
    copy_into,
    first_available,
    hub_source,
    install,
    missing,
    rel,
    tidy,
    url_source,
)

INFINITEBENCH_URL = f"https://huggingface.co/datasets/{HUB_REPO}/resolve/main/{{name}}"


def get_infinitebench(root: Path, force: bool, net: Network) -> Outcome:
    name = "infinitebench"
    folder = root / "InfiniteBench"
    files = [f"{t}.jsonl" for t in TASKS]
    manual = f"download {INFINITEBENCH_URL.format(name='<task>.jsonl')} for each task into {rel(folder)}/"
    todo = missing(folder, files, force)
    if not todo:
        return Outcome(name, True, f"{rel(folder)} ({len(files)} files, already present)")
    folder.mkdir(parents=True, exist_ok=True)
    failed: dict[str, list[str]] = {}  # reason -> files
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as scratch:
        for file in todo:
            sources = [hub_source(HUB_REPO, file), url_source(INFINITEBENCH_URL.format(name=file))]
            try:
                install(folder / file, copy_into(first_available(sources, Path(scratch), net, check_jsonl)))
            except (FetchError, OSError, ValueError) as exc:
                failed.setdefault(str(exc).replace(file, "<task>.jsonl"), []).append(file)
            else:
                print(f"  {rel(folder / file)}", flush=True)
    if failed:
        tidy(folder)
        groups = "; ".join(f"{', '.join(files)}: {reason}" for reason, files in failed.items())
        count = sum(len(files) for files in failed.values())
        return Outcome(name, False, f"{count} of {len(files)} files missing ({groups}); to get it manually: {manual}")
    return Outcome(name, True, f"{rel(folder)} ({len(files)} files)")


SOURCES = (Dataset("infinitebench", get_infinitebench),)
