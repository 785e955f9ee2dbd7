"""Sampling uncertainty of benchmark scores: bootstrap intervals, and paired ones between two policies.

Every policy of a comparison answers the same prompts, so the fair interval for "A beats B by x
points" resamples the per-sample *differences* (a paired bootstrap): the prompts' own difficulty,
shared by both policies, cancels, and the interval is much tighter than two separate intervals
would suggest. Scores are on the benchmarks' 0-1 per-sample scale; intervals are reported in points
(x100), as the tables are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """A mean (in points) with its percentile-bootstrap interval and the sample count behind it."""

    mean: float
    low: float
    high: float
    samples: int

    def __str__(self) -> str:
        return f"{self.mean:.1f} [{self.low:.1f}, {self.high:.1f}] (n={self.samples})"


def _check(resamples: int, level: float) -> None:
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples={resamples!r} must be an integer >= 1")
    if not 0 < level < 1:
        raise ValueError(f"level={level!r} must be in (0, 1)")


def bootstrap_interval(
    scores: Sequence[float], resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0
) -> Interval:
    """Mean of ``scores`` (0-1 each) in points, with a percentile bootstrap interval over samples."""
    _check(resamples, level)
    values = np.asarray(scores, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no scores to bootstrap: the run has no samples")
    if not np.isfinite(values).all():
        raise ValueError("scores must be finite numbers")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(resamples, values.size))].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return Interval(100 * float(values.mean()), 100 * float(low), 100 * float(high), int(values.size))


def paired_difference(
    a: Mapping[str, float],
    b: Mapping[str, float],
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> Interval:
    """Mean of ``a - b`` over the samples both scored (by sample id), in points, with a paired bootstrap interval.

    Raises if the two share no sample; samples only one of them has are left out (the count says
    how many were compared).
    """
    shared = [key for key in a if key in b]
    if not shared:
        raise ValueError("the two runs share no sample id: a paired comparison needs the same prompts")
    return bootstrap_interval([a[key] - b[key] for key in shared], resamples, level, seed)
