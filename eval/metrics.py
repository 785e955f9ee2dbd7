"""The metric registry: every per-sample metric by its registered name, and :func:`score` to call one.

Every metric is called as ``metric(prediction, references, **kwargs)`` and returns the score of
one sample in ``[0, 1]``. Each one reproduces the number the benchmark's official evaluation code
gives for that sample, quirks included; the quirks are spelled out in the docstrings ("Quirk:").
The metrics sit beside the benchmark that owns them, each with how that benchmark combines
several references:

* LongBench v1: :mod:`eval.benchmarks.longbench_metrics` (with the prediction clean-up
  ``longbench_postprocess``);
* RULER: :mod:`eval.benchmarks.ruler_metrics`;
* Needle-in-a-Haystack: :mod:`eval.benchmarks.niah_metrics`;
* InfiniteBench: :mod:`eval.benchmarks.infinitebench_metrics`;

and what several of them share (normalisation, token F1, ROUGE) is in :mod:`eval.metrics_common`,
a module of its own because every benchmark's metrics import it and this registry imports them
all. This module only names the metrics, so that a ``Sample`` can carry its metric as a string.
"""

from __future__ import annotations

from typing import Any, Protocol

from eval.benchmarks.infinitebench_metrics import (
    infbench_code_debug,
    infbench_code_run,
    infbench_kv_retrieval,
    infbench_longbook_choice_eng,
    infbench_longbook_qa_chn,
    infbench_longbook_qa_eng,
    infbench_longbook_sum_eng,
    infbench_longdialogue_qa_eng,
    infbench_math_calc,
    infbench_math_find,
    infbench_number_string,
    infbench_passkey,
)
from eval.benchmarks.longbench_metrics import (
    longbench_classification,
    longbench_code_sim,
    longbench_count,
    longbench_qa_f1,
    longbench_qa_f1_zh,
    longbench_retrieval,
    longbench_retrieval_zh,
    longbench_rouge,
    longbench_rouge_zh,
)
from eval.benchmarks.niah_metrics import niah_rouge
from eval.benchmarks.ruler_metrics import ruler_string_match_all, ruler_string_match_part

__all__ = ["METRICS", "Metric", "score"]


class Metric(Protocol):
    """A per-sample scorer: ``(prediction, references, **kwargs) -> float`` in ``[0, 1]``.

    Keyword arguments that a metric does not use are ignored (LongBench's own scorer hands
    ``all_classes`` to every metric in the same way).
    """

    def __call__(self, prediction: str, references: list[str], /, **kwargs: Any) -> float: ...


METRICS: dict[str, Metric] = {
    # LongBench v1
    "qa_f1": longbench_qa_f1,
    "qa_f1_zh": longbench_qa_f1_zh,
    "rouge": longbench_rouge,
    "rouge_zh": longbench_rouge_zh,
    "classification": longbench_classification,
    "retrieval": longbench_retrieval,
    "retrieval_zh": longbench_retrieval_zh,
    "count": longbench_count,
    "code_sim": longbench_code_sim,
    # RULER
    "string_match_all": ruler_string_match_all,
    "string_match_part": ruler_string_match_part,
    # Needle in a haystack
    "niah_rouge": niah_rouge,
    # InfiniteBench
    "infbench_passkey": infbench_passkey,
    "infbench_number_string": infbench_number_string,
    "infbench_kv_retrieval": infbench_kv_retrieval,
    "infbench_longbook_sum_eng": infbench_longbook_sum_eng,
    "infbench_longbook_choice_eng": infbench_longbook_choice_eng,
    "infbench_longbook_qa_eng": infbench_longbook_qa_eng,
    "infbench_longbook_qa_chn": infbench_longbook_qa_chn,
    "infbench_longdialogue_qa_eng": infbench_longdialogue_qa_eng,
    "infbench_math_find": infbench_math_find,
    "infbench_math_calc": infbench_math_calc,
    "infbench_code_run": infbench_code_run,
    "infbench_code_debug": infbench_code_debug,
}


def score(metric: str, prediction: str, references: list[str], **kwargs: Any) -> float:
    """Score one prediction with the registered metric ``metric``; returns a value in [0, 1].

    Keyword arguments are passed to the metric; the only required one today is
    ``all_classes`` (list of the sample's class labels) for ``classification``. Raises
    ``ValueError`` for an unknown metric (listing the valid names) or an empty reference list,
    and ``TypeError`` when a required keyword argument is missing.
    """
    scorer = METRICS.get(metric)
    if scorer is None:
        raise ValueError(f"unknown metric {metric!r}; valid metrics are: {', '.join(sorted(METRICS))}")
    if not references:
        raise ValueError(f"metric {metric!r} needs at least one reference")
    return float(scorer(prediction, references, **kwargs))
