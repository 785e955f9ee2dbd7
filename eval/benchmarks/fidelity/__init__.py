"""``bench=fidelity``: another benchmark's samples evaluated for fidelity to the full cache (see `benchmark`)."""

from restkv.eval.benchmarks.fidelity.benchmark import FidelityBenchmark

__all__ = ["FidelityBenchmark"]
