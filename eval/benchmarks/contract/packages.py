"""Which benchmarks there are: every subpackage of `restkv.eval.benchmarks` other than the contract and the helpers.

A benchmark is a folder holding its loader, prompts, metrics and data sources; nothing lists them. The metric
registry (`restkv.eval.benchmarks.contract.metrics`) and the data download (`scripts/download_data.py`, through
`restkv.eval.benchmarks.contract.sources`) find what each package declares by the module's name: a ``metrics``
module with a ``METRICS`` table, a ``sources`` module with a ``SOURCES`` tuple. The packages are imported by
name, so the contract never imports a benchmark statically and the package graph keeps no loop.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

BENCHMARKS_PACKAGE = "restkv.eval.benchmarks"
NOT_BENCHMARKS = ("contract", "shared")
"""Subpackages that are not benchmarks: the contract (this package) and the helpers several benchmarks share."""

_ROOT = Path(__file__).resolve().parents[1]


def benchmark_packages() -> list[str]:
    """The benchmark packages' short names (``longbench``, ``ruler``, ...), sorted."""
    return sorted(
        info.name
        for info in pkgutil.iter_modules([str(_ROOT)])
        if info.ispkg and info.name not in NOT_BENCHMARKS and not info.name.startswith("_")
    )


def declared(module: str) -> list[tuple[str, ModuleType]]:
    """``(package, module)`` for every benchmark package that has a module named ``module``, imported."""
    found = []
    for package in benchmark_packages():
        if (_ROOT / package / f"{module}.py").is_file():
            found.append((package, importlib.import_module(f"{BENCHMARKS_PACKAGE}.{package}.{module}")))
    return found
