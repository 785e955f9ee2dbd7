"""SCBench read from its own files (``bench=scbench``): `benchmark` loads the multi-turn records with their
answer lengths, `sources` says where ``scripts/download_data.py scbench`` gets them."""

from restkv.eval.benchmarks.scbench.benchmark import TASKS, SCBenchBenchmark, SCBenchTask

__all__ = ["TASKS", "SCBenchBenchmark", "SCBenchTask"]
