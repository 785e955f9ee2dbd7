"""Downloading a benchmark's data safely: each benchmark package declares its `Dataset`s, this module fetches them.

A benchmark package's ``sources`` module holds ``SOURCES``, a tuple of `Dataset` (a name on the command line of
``scripts/download_data.py`` and the function that gets it); `declared_datasets` collects them from every package,
so a new benchmark's data needs no entry in the script. The getters are built from what is here:

* a `Source` is one place a file can come from (a URL or a hub dataset file), tried after a quick reachability
  check of its host (`Network.can_reach`, asked once per host in a run), so an offline machine fails at once;
  `first_available` takes the first source that works and passes its check;
* `install` writes a file through a temporary name beside its destination, checked (JSON parses, archive members
  exist) and only then renamed into place, so an interrupted or failed download never leaves a half-written file;
* `from_archive`, `get_files` and `get_hub_jsonl` are the three shapes of dataset (members of a zip, single files
  with fallbacks, hub files turned into JSON lines); each returns an `Outcome` that says what it got, or why not
  and how to get the data by hand.

The network itself is three functions of `Network` (reachability, HTTP, hub), which the script hands in and its
tests replace.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from restkv.eval.benchmarks.contract.packages import declared
from restkv.eval.models.hub import offline_requested

TIMEOUT = 60.0
REACH_TIMEOUT = 3.0
USER_AGENT = "restkv-download-data/1.0"


class FetchError(Exception):
    """One source failed; the message says why."""


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


@dataclass
class Network:
    """The three network calls a download makes, and the hosts already found (un)reachable in this run."""

    reachable: Callable[[str, int], bool] = reachable
    http_get: Callable[[str, Path], None] = http_get
    hub_get: Callable[[str, str], Path] = hub_get
    seen: dict[tuple[str, int], bool] = field(default_factory=dict)

    def can_reach(self, host: str, port: int) -> bool:
        """`reachable`, asked once per host and port (an offline machine fails fast)."""
        if (host, port) not in self.seen:
            self.seen[(host, port)] = self.reachable(host, port)
        return self.seen[(host, port)]


@dataclass(frozen=True)
class Source:
    """One place a file can come from: a label for messages, a host to check, and a URL or a hub file."""

    label: str
    host: str
    port: int
    url: str = ""
    hub: tuple[str, str] | None = None

    def fetch(self, scratch: Path, net: Network) -> Path:
        """Download into ``scratch`` (or the hub cache); the downloaded file's path."""
        if self.hub is not None:
            return net.hub_get(*self.hub)
        target = scratch / (Path(urllib.parse.urlparse(self.url).path).name or "download")
        net.http_get(self.url, target)
        return target


def url_source(url: str) -> Source:
    parsed = urllib.parse.urlparse(url)
    return Source(url, parsed.hostname or "", parsed.port or (443 if parsed.scheme == "https" else 80), url=url)


def hub_source(repo_id: str, filename: str) -> Source:
    from huggingface_hub import constants

    endpoint = urllib.parse.urlparse(constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    label = f"hub dataset {repo_id} ({filename})"
    return Source(label, endpoint.hostname or "huggingface.co", port, hub=(repo_id, filename))


def first_available(
    sources: Iterable[Source], scratch: Path, net: Network, check: Callable[[Path], None] | None = None
) -> Path:
    """The file from the first source that works and passes ``check``; `FetchError` listing every failure otherwise."""
    reasons: list[str] = []
    for source in sources:
        if source.hub is not None and offline_requested():
            reasons.append(f"{source.label}: HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set")
            continue
        if not net.can_reach(source.host, source.port):
            reasons.append(f"{source.label}: {source.host} is not reachable")
            continue
        try:
            got = source.fetch(scratch, net)
            if check is not None:
                check(got)
            return got
        except Exception as exc:  # any failure of this source (download or content): try the next one
            reasons.append(f"{source.label}: {type(exc).__name__}: {exc}")
    raise FetchError("; ".join(reasons) or "no source")


def install(dest: Path, write: Callable[[Path], None], check: Callable[[Path], None] | None = None) -> None:
    """Write ``dest`` through a temporary file beside it: ``write`` it, ``check`` it, then rename.

    On any error the temporary file is removed and ``dest`` is left as it was.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.part")
    try:
        write(part)
        if check is not None:
            check(part)
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)


def copy_into(src: Path) -> Callable[[Path], None]:
    return lambda part: shutil.copyfile(src, part)


def extract(archive: zipfile.ZipFile, member: str) -> Callable[[Path], None]:
    """A writer of ``member`` of ``archive`` (for `install`)."""

    def write(part: Path) -> None:
        with archive.open(member) as src, open(part, "wb") as out:
            shutil.copyfileobj(src, out, length=1 << 20)

    return write


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


def check_json(predicate: Callable[[Any], bool], what: str) -> Callable[[Path], None]:
    def check(path: Path) -> None:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not predicate(data):
            raise FetchError(f"the downloaded file is not {what}")

    return check


@dataclass
class Outcome:
    """How one dataset went: its ``<name>: ok: ...`` or ``could not get <name>: ...`` line."""

    name: str
    ok: bool
    message: str

    def line(self) -> str:
        if self.ok:
            return f"{self.name}: ok: {self.message}"
        return f"could not get {self.name}: {self.message}"


@dataclass(frozen=True)
class Dataset:
    """A name ``scripts/download_data.py`` accepts and how to get it: ``get(data_root, force, network)``."""

    name: str
    get: Callable[[Path, bool, Network], Outcome]


def declared_datasets() -> dict[str, Dataset]:
    """Every benchmark package's declared datasets by name, packages in order (a name declared twice is refused)."""
    found: dict[str, Dataset] = {}
    for package, module in declared("sources"):
        for dataset in module.SOURCES:
            if dataset.name in found:
                raise RuntimeError(f"dataset {dataset.name!r} is declared twice (again by the {package} package)")
            found[dataset.name] = dataset
    return found


def rel(path: Path) -> str:
    """``path`` relative to the working folder when under it (for messages)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def tidy(folder: Path) -> None:
    """Remove ``folder`` if a failed fetch left it empty."""
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def missing(folder: Path, names: Iterable[str], force: bool) -> list[str]:
    return [n for n in names if force or not (folder / n).is_file()]


def from_archive(
    name: str,
    folder: Path,
    sources: Iterable[Source],
    net: Network,
    manual: str,
    unpack: Callable[[zipfile.ZipFile], Outcome],
) -> Outcome:
    """Fetch the first zip archive ``sources`` give (into a scratch folder inside ``folder``) and ``unpack`` it.

    ``unpack`` installs what it needs from the archive and says how it went. Any failure, of the download or of
    ``unpack``, gives an outcome that says why and how to get the data by hand (``manual``), and ``folder`` is
    removed if that left it empty.
    """
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as scratch:
        try:
            with zipfile.ZipFile(first_available(sources, Path(scratch), net, check_zip)) as archive:
                return unpack(archive)
        except (FetchError, zipfile.BadZipFile, OSError, ValueError) as exc:
            failure = f"{exc}; to get it manually: {manual}"
    tidy(folder)
    return Outcome(name, False, failure)


@dataclass(frozen=True)
class Wanted:
    """One file of a `get_files` dataset: its name, its sources in order, its check, how to get it by hand."""

    file: str
    sources: list[Source]
    check: Callable[[Path], None]
    manual: str


def get_files(name: str, folder: Path, wanted: list[Wanted], force: bool, net: Network) -> Outcome:
    """Fetch each wanted file (first source that answers and passes its check) into ``folder``."""
    done: list[str] = []
    failed: list[str] = []
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as scratch:
        for want in wanted:
            dest = folder / want.file
            if dest.is_file() and not force:
                done.append(f"{rel(dest)} (already present)")
                continue
            try:
                install(dest, copy_into(first_available(want.sources, Path(scratch), net, want.check)))
                done.append(rel(dest))
            except (FetchError, OSError, ValueError) as exc:
                failed.append(f"{want.file}: {exc}; to get it manually: {want.manual}")
    if failed:
        tidy(folder)
        return Outcome(name, False, " | ".join(failed))
    return Outcome(name, True, ", ".join(done))


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines or parquet file."""
    if path.suffix == ".parquet":
        import pandas

        return [{k: _plain(v) for k, v in row.items()} for row in pandas.read_parquet(path).to_dict("records")]
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _plain(value: Any) -> Any:
    """A parquet cell as a JSON value (numpy scalars to Python numbers)."""
    return value.item() if hasattr(value, "item") else value


def write_jsonl(records: list[dict[str, Any]], dest: Path) -> None:
    with open(dest, "w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


def get_hub_jsonl(
    name: str,
    folder: Path,
    force: bool,
    net: Network,
    files: dict[str, list[tuple[str, str]]],
    records: Callable[[str, list[Path]], list[dict[str, Any]]],
) -> Outcome:
    """One ``<file>.jsonl`` per key of ``files`` from its hub (dataset, file) pairs, as ``records(key, paths)``."""
    failures = []
    with tempfile.TemporaryDirectory() as scratch:
        for file in missing(folder, [f"{key}.jsonl" for key in files], force):
            key = file.removesuffix(".jsonl")
            try:
                paths = [first_available([hub_source(*pair)], Path(scratch), net) for pair in files[key]]
                rows = records(key, paths)
                install(folder / file, lambda part, r=rows: write_jsonl(r, part), check_jsonl)
            except (FetchError, OSError, ValueError) as exc:
                failures.append(f"{key}: {exc}")
    if failures:
        sources = ", ".join(f"{key}.jsonl from {' + '.join(map(':'.join, pairs))}" for key, pairs in files.items())
        return Outcome(name, False, "; ".join(failures) + f"; to get them manually: {sources}")
    return Outcome(name, True, f"{rel(folder)} ({len(files)} files)")
