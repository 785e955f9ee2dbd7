"""A policy, a benchmark and a report each have one home, and nothing else lists them.

* Policies are found by the registry (``baselines/`` modules, entry points) and named by ``configs/policy/``: no
  source module enumerates them in a literal list (a *selection*, such as a default comparison of eight, is fine;
  an enumeration of the registry is not: it goes stale when a policy is added).
* Benchmarks are the subpackages of ``restkv.eval.benchmarks``: each one's metrics and data sources are found by
  module name, never listed; every name a loader's error tells the user to download is a declared dataset.
* Run folders are listed by one reader, ``eval/harness/folder_state.py``: no other module walks a results tree.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from restkv import policy_names, preset_names
from restkv.eval.benchmarks.contract.metrics import metric_modules, metric_names
from restkv.eval.benchmarks.contract.packages import benchmark_packages
from restkv.eval.benchmarks.shared.fetching import declared_datasets

ROOT = Path(__file__).resolve().parents[1]
SOURCE_FOLDERS = ("restkv", "baselines", "eval", "microtrain", "scripts")
SOURCES = sorted(p for folder in SOURCE_FOLDERS for p in (ROOT / folder).rglob("*.py"))
ENUMERATION = 10
"""A literal naming this many registered policies is an enumeration of the registry, not a selection."""
RUN_FOLDER_READER = ROOT / "eval" / "harness" / "folder_state.py"


def _string_literals(node: ast.AST) -> list[str]:
    elements = getattr(node, "elts", [])
    return [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def test_no_source_module_enumerates_the_policies() -> None:
    names = set(policy_names()) | {p for p in preset_names() if "/" not in p}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.List | ast.Tuple | ast.Set):
                listed = names & set(_string_literals(node))
                assert len(listed) < ENUMERATION, (
                    f"{path.relative_to(ROOT)}:{node.lineno} lists {len(listed)} policies by name; derive the list "
                    "from the registry (restkv.policy_names) or configs/policy/ instead"
                )


def test_only_folder_state_lists_run_folders() -> None:
    """Walking a results tree, or globbing for run files, happens in the one reader of run folders."""
    run_files = re.compile(r"metrics|predictions|budget|identity|\.lock")
    for path in SOURCES:
        if path == RUN_FOLDER_READER:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
            walks = owner == "os" and node.func.attr == "walk"
            assert not walks, f"{where} walks a folder tree: list run folders with folder_state.run_folders"
            if node.func.attr in ("glob", "rglob") and node.args and isinstance(node.args[0], ast.Constant):
                pattern = str(node.args[0].value)
                assert not run_files.search(pattern), f"{where} globs {pattern!r}: use folder_state.run_folders"


def test_benchmarks_are_packages_found_by_folder() -> None:
    benchmarks = ROOT / "eval" / "benchmarks"
    loose = sorted(p.name for p in benchmarks.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"eval/benchmarks/ holds loose modules {loose}: a benchmark is a package"
    assert set(benchmark_packages()) == {
        p.name for p in benchmarks.iterdir() if (p / "__init__.py").is_file() and p.name not in ("contract", "shared")
    }
    for package in benchmark_packages():
        assert (benchmarks / package / "benchmark.py").is_file(), f"{package} has no benchmark module"


def test_metrics_are_discovered_from_the_benchmark_packages() -> None:
    modules = metric_modules()
    folder = ROOT / "eval" / "benchmarks"
    owners = [p for p in benchmark_packages() if (folder / p / "metrics.py").is_file()]
    assert modules == [f"restkv.eval.benchmarks.{p}.metrics" for p in owners]
    assert {"string_match_all", "qa_f1", "niah_rouge", "classification"} <= set(metric_names())
    for path in SOURCES:
        text = path.read_text()
        assert "METRIC_MODULES" not in text, f"{path.relative_to(ROOT)} keeps a list of metric modules"


def test_every_download_a_benchmark_asks_for_is_declared() -> None:
    """A loader's missing-data error names ``scripts/download_data.py <name>``: each name is a declared dataset."""
    declared = set(declared_datasets())
    asked = set()
    for path in (ROOT / "eval" / "benchmarks").rglob("*.py"):
        asked |= set(re.findall(r"download_data\.py ((?:[a-z_]+ ?)+)", path.read_text()))
    names = {name for group in asked for name in group.split()}
    assert names, "no loader names a download"
    assert names <= declared | {"all"}, f"undeclared datasets asked for: {sorted(names - declared)}"


@pytest.mark.parametrize("dataset", sorted(declared_datasets()))
def test_each_declared_dataset_has_a_getter(dataset: str) -> None:
    assert callable(declared_datasets()[dataset].get)


def test_the_readme_policy_table_names_only_registered_policies() -> None:
    """The README summarises the policies by family; docs/policies.md is the complete table (tested against the
    registry in tests/test_policy_configs.py). A name in the README that the registry does not know is stale."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Policies", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = {name for row in rows for name in re.findall(r"`(\w+)`", row.split(" | ")[0])}
    assert named, "README.md has no policy table under '## Policies'"
    unknown = named - set(policy_names()) - set(preset_names())
    assert not unknown, f"README.md's policy table names unregistered policies {sorted(unknown)}"
