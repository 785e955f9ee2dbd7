"""Needle-in-a-Haystack as run for the ReST-KV paper (``bench=niah``): `benchmark` builds the length x depth
grid, `heatmap` draws it, `metrics` scores an answer by ROUGE-1 against the needle."""

from restkv.eval.benchmarks.niah.benchmark import (
    FINAL_CONTEXT_LENGTH_BUFFER,
    MAX_NEW_TOKENS,
    NEEDLE,
    NiahBenchmark,
    context_length_grid,
    depth_percent_grid,
    generate,
)
from restkv.eval.benchmarks.niah.heatmap import grid_report, heatmap

__all__ = [
    "FINAL_CONTEXT_LENGTH_BUFFER",
    "MAX_NEW_TOKENS",
    "NEEDLE",
    "NiahBenchmark",
    "context_length_grid",
    "depth_percent_grid",
    "generate",
    "grid_report",
    "heatmap",
]
