"""InfiniteBench's 12 tasks the ReST-KV authors ran (``bench=infinitebench``): `benchmark` loads the official
files with their prompts and generation lengths, `metrics` scores them as the official ``compute_scores.py``."""

from restkv.eval.benchmarks.infinitebench.benchmark import (
    CHOICE_TASKS,
    HUB_REPO,
    TASKS,
    InfiniteBenchBenchmark,
    fetch_task_file,
    max_new_tokens,
)

__all__ = ["CHOICE_TASKS", "HUB_REPO", "TASKS", "InfiniteBenchBenchmark", "fetch_task_file", "max_new_tokens"]
