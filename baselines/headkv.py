"""HeadKV (Fu et al., 2024): fixed per-(layer, head) budgets from head-importance scores."""

from __future__ import annotations

from dataclasses import dataclass

from restkv.registry import register_policy
from restkv.scoring_policy import ScoringPolicy


@register_policy("headkv")
@dataclass
class HeadKV(ScoringPolicy):
    """The ReST-KV authors' HeadKV as their driver runs it: mean window attention, average-pooled
    (kernel 5: ``run_longbench.py`` passes ``--kernel_sizes 5 --pooling avgpool`` to every method, over
    the class's own max-pooling with kernel 7), under the ``headkv`` allocation.

    ``head_scores`` is the head file (HeadKV's JSON, ``{"<layer>-<head>": [scores]}``) of the model
    being run: ``scripts/compute_head_scores.py`` makes one for any model. The default is the default
    model's (``models/micro-llama/head_scores.json``, found in a checkout or an installed copy); another
    model is refused at its first prefill, naming the file's and the model's layers x heads.
    As in the authors' code, a head keeps its budget of past tokens *plus* the window, so the mean
    head holds about ``budget + window`` tokens (uniform policies hold ``budget``, window included).
    """

    indicator: str = "attention"
    temporal: str = "mean"
    spatial: str = "avgpool"
    kernel: int = 5
    allocation: str = "headkv"
    head_scores: str | None = "models/micro-llama/head_scores.json"
