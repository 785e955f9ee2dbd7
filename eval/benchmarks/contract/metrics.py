"""The metric registry: every per-sample metric by the name a `Sample` carries, and :func:`score` to call one.

Every metric is called as ``metric(prediction, references, **kwargs)`` and returns the score of
one sample in ``[0, 1]``. Each one reproduces the number the benchmark's official evaluation code
gives for that sample, quirks included; the quirks are spelled out in the docstrings ("Quirk:").
The metrics sit beside the benchmark that owns them, each module with a ``METRICS`` table of its
names:

* LongBench v1: `restkv.eval.benchmarks.longbench.metrics` (with the prediction clean-up
  ``longbench_postprocess``);
* RULER: `restkv.eval.benchmarks.ruler.metrics`;
* Needle-in-a-Haystack: `restkv.eval.benchmarks.niah.metrics`;
* InfiniteBench: `restkv.eval.benchmarks.infinitebench.metrics`;

and what several of them share (normalisation, token F1, ROUGE) is `restkv.eval.benchmarks.shared.text_metrics`.
This registry finds those modules when a metric is first looked up: every benchmark package's ``metrics``
module (`restkv.eval.benchmarks.contract.packages.declared`), imported by name as the policy registry loads its
plugins. The benchmarks import the registry, never the other way round, so there is no loop; a new benchmark's
metrics need no entry anywhere.
"""

from __future__ import annotations

from typing import Any, Protocol

from restkv.eval.benchmarks.contract.packages import declared

__all__ = ["Metric", "get_metric", "metric_modules", "metric_names", "score"]


def metric_modules() -> list[str]:
    """The modules whose ``METRICS`` table (name -> metric) makes up the registry: each benchmark's ``metrics``."""
    return [module.__name__ for _, module in declared("metrics")]


class Metric(Protocol):
    """A per-sample scorer: ``(prediction, references, **kwargs) -> float`` in ``[0, 1]``.

    Keyword arguments that a metric does not use are ignored (LongBench's own scorer hands
    ``all_classes`` to every metric in the same way).
    """

    def __call__(self, prediction: str, references: list[str], /, **kwargs: Any) -> float: ...


_REGISTRY: dict[str, Metric] = {}


def _registry() -> dict[str, Metric]:
    """Every registered metric, the benchmarks' ``metrics`` modules loaded on the first call (names never collide)."""
    if not _REGISTRY:
        owners: dict[str, str] = {}
        for _, module in declared("metrics"):
            for name, metric in module.METRICS.items():
                if name in owners:
                    raise RuntimeError(f"metric {name!r} is defined by both {owners[name]} and {module.__name__}")
                owners[name] = module.__name__
                _REGISTRY[name] = metric
    return _REGISTRY


def metric_names() -> list[str]:
    """Every registered metric name, sorted."""
    return sorted(_registry())


def get_metric(name: str) -> Metric:
    """The metric registered as ``name``; an unknown name is refused with the valid ones."""
    metric = _registry().get(name)
    if metric is None:
        raise ValueError(f"unknown metric {name!r}; valid metrics are: {', '.join(metric_names())}")
    return metric


def score(metric: str, prediction: str, references: list[str], **kwargs: Any) -> float:
    """Score one prediction with the registered metric ``metric``; returns a value in [0, 1].

    Keyword arguments are passed to the metric; the only required one today is
    ``all_classes`` (list of the sample's class labels) for ``classification``. Raises
    ``ValueError`` for an unknown metric (listing the valid names) or an empty reference list,
    and ``TypeError`` when a required keyword argument is missing.
    """
    scorer = get_metric(metric)
    if not references:
        raise ValueError(f"metric {metric!r} needs at least one reference")
    return float(scorer(prediction, references, **kwargs))
