"""MkDocs hook (``mkdocs.yml``): the API reference pages, generated from the source tree at every build.

Each page documents one package, every module of it from its docstrings, so the reference can neither
omit a module nor drift from the code. The folders install under one name (``baselines/`` is
``restkv.baselines``, ``eval/`` is ``restkv.eval``, ``microtrain/`` is ``restkv.microtrain``); the
documentation reads the source without importing it, so the hook lays out that installed tree as links
under ``build/docs-api`` first.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
API_TREE = ROOT / "build" / "docs-api" / "restkv"


def folders() -> dict[str, str]:
    """Folder of the checkout -> its import name, as ``pyproject.toml``'s package-dir maps them (the folders that
    hold Python packages: ``baselines/`` -> ``restkv.baselines``, ...; ``restkv/`` is itself). The one source of
    the map: the tests read it through this function too."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    mapped = {
        folder: name for name, folder in setup["package-dir"].items() if (ROOT / folder / "__init__.py").is_file()
    }
    return {"restkv": "restkv", **mapped}


FOLDERS = folders()
FOLDER_NAMES = tuple(folder for folder in FOLDERS if folder != "restkv")
"""The folders installed under another name (never imported as top-level packages)."""
PAGES = (
    "restkv",
    "restkv.decoding",
    "restkv.stages",
    "restkv.storage",
    "restkv.interop",
    "restkv.baselines",
    "restkv.eval.harness",
    "restkv.eval.benchmarks",
    "restkv.eval.evaluation",
    "restkv.eval.models",
    "restkv.eval.latency",
    "restkv.eval.report",
    "restkv.eval.probes",
    "restkv.microtrain",
)
"""One reference page per package; a page also holds its subpackages that have no page of their own."""


def modules() -> dict[str, Path]:
    """Every module of the installed packages by import name (packages by their ``__init__.py``)."""
    found = {}
    for folder, name in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((name, *parts))] = path
    return found


PLACED = {"restkv.eval": "index", "restkv.eval.run": "restkv.eval.harness"}
"""Modules outside every page's package: the harness's package docstring opens the index, its entry point
is the harness's."""


def page_of(module: str) -> str:
    """The page that documents ``module``: its longest page prefix, else where `PLACED` puts it."""
    if module in PLACED:
        return PLACED[module]
    owners = [page for page in PAGES if module == page or module.startswith(page + ".")]
    owner = max(owners, key=len)
    if owner == "restkv" and module.split(".")[1:2] and module.split(".")[1] in FOLDER_NAMES:
        raise ValueError(f"{module} has no reference page: add its package to PAGES or place it in PLACED")
    return owner


def first_line(path: Path) -> str:
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return docstring.strip().splitlines()[0] if docstring.strip() else ""


def page_markdown(page: str, found: dict[str, Path]) -> str:
    """A page: the package's docstring, then each of its modules in full."""
    members = sorted(m for m in found if page_of(m) == page and m != page)
    lines = [f"# `{page}`", "", f"::: {page}", "    options:", "      members: false", "      show_root_heading: false"]
    lines.append("")
    for module in members:
        lines += [f"::: {module}", ""]
    return "\n".join(lines)


def index_markdown(found: dict[str, Path]) -> str:
    lines = [
        "# API reference",
        "",
        "::: restkv.eval",
        "    options:",
        "      members: false",
        "      show_root_heading: false",
        "",
        "Generated from the docstrings at every build (`scripts/docs_api_pages.py`): one page per package, every "
        "module on it. The checkout's folders install under one name: `baselines/` is `restkv.baselines`, `eval/` "
        "is `restkv.eval`, `microtrain/` is `restkv.microtrain`.",
        "",
        "| package | modules | what it is |",
        "| --- | --- | --- |",
    ]
    for page in PAGES:
        count = sum(1 for m in found if page_of(m) == page)
        lines.append(f"| [`{page}`]({page}.md) | {count} | {first_line(found[page])} |")
    return "\n".join(lines) + "\n"


def on_startup(**kwargs: Any) -> None:
    """Lay out the installed tree as links, so the documentation finds ``restkv.eval`` under ``restkv/``."""
    API_TREE.mkdir(parents=True, exist_ok=True)
    wanted = {entry.name: entry for entry in (ROOT / "restkv").iterdir() if entry.name != "__pycache__"}
    wanted.update({name.split(".")[1]: ROOT / folder for folder, name in FOLDERS.items() if folder != "restkv"})
    for name, target in wanted.items():
        link = API_TREE / name
        if link.is_symlink() and link.resolve() == target.resolve():
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    for link in API_TREE.iterdir():
        if link.name not in wanted:
            link.unlink()


def on_files(files: Any, config: Any, **kwargs: Any) -> Any:
    """Add the generated reference pages to the site."""
    from mkdocs.structure.files import File

    found = modules()
    files.append(File.generated(config, "reference/index.md", content=index_markdown(found)))
    for page in PAGES:
        files.append(File.generated(config, f"reference/{page}.md", content=page_markdown(page, found)))
    return files
