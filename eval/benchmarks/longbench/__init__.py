"""LongBench v1 and LongBench-E (``bench=longbench``, ``bench=longbench_e``): `benchmark` loads the official
files with the benchmark's prompts and generation lengths, `metrics` scores them as its ``eval.py`` does."""

from restkv.eval.benchmarks.longbench.benchmark import (
    HUB_ARCHIVE,
    HUB_REPO,
    TASK_SPECS,
    TASKS,
    TASKS_E,
    TASKS_EN,
    TASKS_ZH,
    LongBenchBenchmark,
    expand_tasks,
    fetch_archive,
)

__all__ = [
    "HUB_ARCHIVE",
    "HUB_REPO",
    "TASKS",
    "TASKS_E",
    "TASKS_EN",
    "TASKS_ZH",
    "TASK_SPECS",
    "LongBenchBenchmark",
    "expand_tasks",
    "fetch_archive",
]
