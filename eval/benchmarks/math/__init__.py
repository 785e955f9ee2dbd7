"""Long-output math benchmarks (MATH-500, AIME 2024/2025, GSM8K): see `restkv.eval.benchmarks.math.benchmark`."""

from restkv.eval.benchmarks.math.benchmark import TASKS, MathBenchmark

__all__ = ["TASKS", "MathBenchmark"]
