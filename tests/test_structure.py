"""The tree's shape: dependencies point one way, no import cycles, no reaching into private names.

Layers, lowest first, by folder: ``restkv/`` (the core) <- ``baselines/`` (plugins) <- ``eval/`` <-
``microtrain/`` <- ``scripts/``. A module may import its own layer and the layers below it, never
above; the core finds its plugins through entry points, not imports. The folders install under one
name (``baselines/`` is ``restkv.baselines``, ``eval/`` ``restkv.eval``, ``microtrain/``
``restkv.microtrain``), so no module imports them as top-level packages. Packages (``restkv``,
``restkv.interop``, ``restkv.eval.harness``, ``restkv.eval.benchmarks`` with its subpackages, ...)
import each other without a loop; the core's concept folders (``restkv.decoding``) count as the core there.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("restkv", "baselines", "eval", "microtrain", "scripts")
"""Folders, lowest layer first."""


def _docs_pages() -> Any:
    """``scripts/docs_api_pages.py``, the one reader of pyproject.toml's folder -> import name map."""
    spec = importlib.util.spec_from_file_location("docs_api_pages", ROOT / "scripts" / "docs_api_pages.py")
    assert spec is not None and spec.loader is not None
    pages = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pages)
    return pages


PAGES = _docs_pages()
IMPORT_NAMES: dict[str, str] = PAGES.FOLDERS
"""How each folder is imported (``pyproject.toml``'s package-dir); ``scripts`` are not imported."""
TOP_LEVEL_NAMES: tuple[str, ...] = PAGES.FOLDER_NAMES
"""Folder names that must never be imported as top-level packages (they would shadow other packages)."""
MAX_LINES = 450
MAX_FUNCTION_LINES = 60
# Left to the RULER issue, which restructures this module.
SIZE_EXEMPT: set[str] = set()


def _modules() -> dict[str, Path]:
    found = {}
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            parts = path.relative_to(ROOT / layer).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((IMPORT_NAMES.get(layer, layer), *parts))] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import of a file, lazy ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [alias.name for alias in node.names]
            submodules = [f"{node.module}.{n}" for n in names if f"{node.module}.{n}" in MODULES]
            found += [(sub, []) for sub in submodules]  # ``from package import module``
            if len(submodules) < len(names):
                found.append((node.module, [n for n in names if f"{node.module}.{n}" not in MODULES]))
    return found


def _project_module(name: str) -> str | None:
    """The project module ``name`` refers to (a module or a package), or None for third-party code."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _layer(module: str) -> int:
    return LAYERS.index(MODULES[module].relative_to(ROOT).parts[0])


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_and_take_no_private_names(module: str) -> None:
    for imported, names in _imports(MODULES[module]):
        target = _project_module(imported)
        if target is None:
            continue
        assert _layer(target) <= _layer(module), f"{module} imports {imported}, a higher layer"
        private = [n for n in names if n.startswith("_") and f"{imported}.{n}" not in MODULES]
        assert not private, f"{module} imports private names {private} of {imported}"


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> the project module it is bound to by an import."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound.update({alias.asname or alias.name: alias.name for alias in node.names})
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            bound.update({alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names})
    return {local: target for local, target in bound.items() if target in MODULES}


def test_no_module_reads_another_modules_private_attributes() -> None:
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        aliases = _aliases(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value.id if isinstance(node.value, ast.Name) else None
                assert owner not in aliases, f"{module} reads {owner}.{node.attr}, a private name of {aliases[owner]}"


def test_no_import_cycles() -> None:
    graph = {m: {t for i, _ in _imports(p) if (t := _project_module(i)) and t != m} for m, p in MODULES.items()}
    state: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in graph[module]:
            if state.get(target) == 1 and not _is_package_of(target, module):
                pytest.fail("import cycle: " + " -> ".join([*trail[trail.index(target) :], target]))
            if target not in state:
                visit(target, [*trail, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


CORE_FOLDERS = ("restkv.decoding", "restkv.stages", "restkv.storage")
"""Folders that group the core's modules by concept (decoding, ...): they import the core's loose modules and are
imported by them, so for the package graph they are part of ``restkv``; between modules there is still no cycle
(`test_no_import_cycles`)."""


def _package(module: str) -> str:
    """The package ``module`` belongs to: itself for a package's ``__init__``, else its parent (``restkv`` for the
    modules of `CORE_FOLDERS`)."""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    return "restkv" if package.startswith(CORE_FOLDERS) else package


def test_no_import_loop_between_packages() -> None:
    """Collapsed to packages, the import graph has no cycle (e.g. a registry importing the benchmarks that
    import it); a package importing its own subpackages is fine, a subpackage importing back up is not."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        for imported, _ in _imports(path):
            target = _project_module(imported)
            if target is None:
                continue
            source, sink = _package(module), _package(target)
            if source != sink and not (MODULES[module].name == "__init__.py" and _is_package_of(source, target)):
                graph.setdefault(source, set()).add(sink)
    state: dict[str, int] = {}

    def visit(package: str, trail: list[str]) -> None:
        state[package] = 1
        for target in sorted(graph.get(package, ())):
            if state.get(target) == 1:
                pytest.fail("import loop between packages: " + " -> ".join([*trail[trail.index(target) :], target]))
            if target not in state:
                visit(target, [*trail, target])
        state[package] = 2

    for package in sorted(graph):
        if package not in state:
            visit(package, [package])


def test_the_installed_folders_are_never_imported_as_top_level_packages() -> None:
    """``import eval`` / ``import baselines`` would find a folder of the checkout, or another project's package."""
    for path in [*MODULES.values(), *(ROOT / "tests").rglob("*.py")]:
        for imported, _ in _imports(path):
            top = imported.split(".")[0]
            assert top not in TOP_LEVEL_NAMES, f"{path.relative_to(ROOT)} imports {imported}: use restkv.{imported}"


def _is_package_of(package: str, module: str) -> bool:
    """A package importing its own submodules (``__init__`` re-exports) is not a cycle."""
    return module.startswith(package + ".")


def test_files_and_functions_stay_small() -> None:
    for path in MODULES.values():
        relative = str(path.relative_to(ROOT))
        if relative in SIZE_EXEMPT:
            continue
        lines = path.read_text().count("\n")
        assert lines <= MAX_LINES, f"{relative} has {lines} lines (at most {MAX_LINES})"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                assert length <= MAX_FUNCTION_LINES, f"{relative}:{node.lineno} {node.name} has {length} lines"


def test_code_is_formatted_not_packed() -> None:
    """Formatting is never switched off line by line: every file is laid out by ``ruff format`` (the tests too),
    so a module near its size limit is split by concept rather than packed onto fewer lines."""
    marker = "# fmt" + ": skip"
    files = [*MODULES.values(), *(ROOT / "tests").rglob("*.py")]
    packed = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in files
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if marker in line
    ]
    assert not packed, f"formatting switched off at {', '.join(packed)}; let ruff format lay these out"


def test_the_api_reference_documents_every_module() -> None:
    """The reference pages are generated from the tree (``scripts/docs_api_pages.py``): each module is on one."""
    pages = PAGES
    found = pages.modules()
    documented = {page: pages.page_markdown(page, found) for page in pages.PAGES}
    documented["index"] = pages.index_markdown(found)
    for module in found:
        page = pages.page_of(module)
        assert f"::: {module}\n" in documented[page], f"{module} is not on reference page {page}"
    assert set(found) == {m for m in MODULES if not m.startswith("scripts") and not m.endswith("__main__")}


@pytest.mark.slow
def test_the_documentation_builds_strictly(tmp_path: Path) -> None:
    """``mkdocs build --strict``: every page, link, included example and API page resolves (pip install .[docs])."""
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert build.returncode == 0, build.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "restkv.eval.harness" / "index.html").is_file()


def test_the_folder_map_is_read_from_pyproject_only() -> None:
    """``baselines/`` -> ``restkv.baselines`` and the others are stated in pyproject.toml's package-dir alone."""
    assert IMPORT_NAMES["baselines"] == "restkv.baselines" and "restkv" in IMPORT_NAMES
    for path in [*(ROOT / "tests").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")]:
        text = path.read_text(encoding="utf-8")
        restated = [f for f, name in IMPORT_NAMES.items() if f != name and f'"{f}": "{name}"' in text]
        assert not restated, f"{path.relative_to(ROOT)} restates the folder map ({restated})"
