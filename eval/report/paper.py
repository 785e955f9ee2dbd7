"""Numbers the paper reports, to draw or print next to ours (facts from the paper, with where they are).

Sources: the paper (An et al., ICLR 2026, arXiv 2605.08840) through its authors' repository
(github.com/an-yongqi/rest-kv): the RULER table of its README, and the values its figure scripts
(``visualization/fig_longbench.py``, ``fig_sensitivity.py``, ``fig_efficiency.py``) plot for the
paper's Figures 4-6. The paper's per-task LongBench, InfiniteBench and ablation tables are not in
that repository; the artifacts built from them print ours alone and say so.
"""

from __future__ import annotations

from dataclasses import dataclass

LONGBENCH_FIGURE = "paper Figure 4 (authors' visualization/fig_longbench.py)"
RULER_TABLE = "paper Table 3 (authors' README)"
SENSITIVITY_FIGURE = "paper Figure 5 (authors' visualization/fig_sensitivity.py)"
EFFICIENCY_FIGURE = "paper Figure 6 (authors' visualization/fig_efficiency.py), Mistral-7B, one GPU"
NOT_IN_SOURCES = "the paper's numbers for this table are not in the sources this harness can cite; ours only"


@dataclass(frozen=True)
class Reported:
    """A series the paper reports: x values, and y per method (our policy names), with its source."""

    source: str
    x: tuple[float, ...]
    y: dict[str, tuple[float, ...]]


_BUDGETS = (64.0, 128.0, 256.0, 512.0, 1024.0)

LONGBENCH_AVERAGES: dict[str, Reported] = {
    "llama-3.1-8b-instruct": Reported(
        LONGBENCH_FIGURE,
        _BUDGETS,
        {
            "streamingllm": (29.61, 31.14, 32.11, 33.84, 35.16),
            "h2o": (29.52, 30.56, 30.96, 34.53, 36.27),
            "tova": (30.63, 32.54, 35.07, 35.59, 37.55),
            "snapkv": (31.48, 33.98, 36.07, 37.47, 38.61),
            "restkv": (33.56, 35.86, 36.93, 38.33, 38.94),
        },
    ),
    "llama-2-7b-chat": Reported(
        LONGBENCH_FIGURE,
        _BUDGETS,
        {
            "streamingllm": (11.83, 21.69, 27.15, 28.86, 29.92),
            "h2o": (12.42, 22.43, 27.95, 29.15, 30.08),
            "tova": (20.20, 27.41, 30.16, 30.24, 31.96),
            "snapkv": (22.96, 27.41, 30.90, 32.18, 32.99),
            "restkv": (25.54, 29.99, 31.51, 32.38, 32.97),
        },
    ),
    "mistral-7b-instruct-v0.3": Reported(
        LONGBENCH_FIGURE,
        _BUDGETS,
        {
            "streamingllm": (34.24, 36.03, 37.71, 39.68, 41.19),
            "h2o": (34.93, 36.31, 37.73, 41.42, 43.69),
            "tova": (36.50, 39.76, 42.28, 42.85, 46.53),
            "snapkv": (37.53, 41.38, 43.79, 45.66, 46.83),
            "restkv": (40.05, 43.52, 45.27, 46.47, 47.18),
        },
    ),
}
"""LongBench average (16 tasks) against the budget; the full cache as a flat line in ``LONGBENCH_FULL``."""
LONGBENCH_FULL = {"llama-3.1-8b-instruct": 39.96, "llama-2-7b-chat": 33.37, "mistral-7b-instruct-v0.3": 48.11}

RULER_LLAMA31_1024 = Reported(
    RULER_TABLE,
    (4096.0, 8192.0, 16384.0, 32768.0, 65536.0, 131072.0),
    {
        "full": (99.34, 98.83, 98.55, 94.89, 89.85, 79.32),
        "streamingllm": (39.81, 18.42, 12.10, 10.57, 9.91, 8.18),
        "snapkv": (83.60, 75.54, 71.12, 66.95, 57.47, 47.99),
        "pyramidkv": (81.35, 73.66, 70.23, 69.83, 57.84, 48.93),
        "restkv_ruler": (94.01, 86.66, 84.12, 81.87, 78.65, 68.28),
    },
)
"""RULER average over tasks by context length, Llama-3.1-8B-Instruct, budget 1024 (ReST-KV with kernel 21)."""
RULER_AVERAGES = {"full": 93.46, "streamingllm": 16.50, "snapkv": 67.11, "pyramidkv": 66.97, "restkv_ruler": 82.27}

SENSITIVITY: dict[str, Reported] = {
    "alpha": Reported(
        SENSITIVITY_FIGURE + ", LongBench, Llama-3.1-8B-Instruct, budget 128",
        (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
        {"restkv": (34.83, 35.25, 35.69, 35.58, 35.51, 35.57, 35.39, 35.24, 35.17)},
    ),
    "scale": Reported(
        SENSITIVITY_FIGURE + ", LongBench, Llama-3.1-8B-Instruct, budget 128",
        (200.0, 400.0, 800.0, 1200.0, 1600.0, 2000.0, 2400.0, 3000.0),
        {"restkv": (35.00, 35.19, 35.74, 35.65, 35.61, 35.89, 35.57, 35.39)},
    ),
}
SENSITIVITY_MEAN_BASELINE = 34.15
"""The alpha figure's reference line: the temporal mean instead of the EMA."""

_CONTEXTS = (4096.0, 8192.0, 16384.0, 32768.0, 65536.0, 131072.0, 262144.0)
EFFICIENCY = {
    "peak_memory_gb": Reported(
        EFFICIENCY_FIGURE,
        _CONTEXTS,
        {
            "snapkv": (16.19, 16.64, 17.55, 19.36, 22.99, 30.24, 44.75),
            "restkv": (16.31, 16.76, 17.71, 19.58, 23.21, 30.56, 45.17),
            "full": (16.86, 17.86, 19.85, 23.83, 31.80, 47.73, 79.59),
        },
    ),
    "decode_latency_seconds": Reported(
        EFFICIENCY_FIGURE,
        _CONTEXTS,
        {
            "snapkv": (0.032, 0.032, 0.032, 0.032, 0.032, 0.032, 0.032),
            "restkv": (0.031, 0.030, 0.032, 0.033, 0.032, 0.034, 0.034),
            "full": (0.032, 0.041, 0.063, 0.101, 0.184, 0.342, 0.702),
        },
    ),
}
"""Peak memory (GB) and decoding latency (s, as the figure labels it) against context; the full cache's
256K bar is drawn hatched there (out of memory)."""
