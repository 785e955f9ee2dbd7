"""H2O (Zhang et al., 2023): keep the heavy hitters of attention accumulated over the prompt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from restkv.checks import check_number
from restkv.policy import LayerInputs, Policy
from restkv.registry import register_policy
from restkv.worksizes import elements_at_once, rows_at_once


def accumulated_attention(
    queries: torch.Tensor,
    keys: torch.Tensor,
    scaling: float | None,
    max_elements: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal attention received by every key, summed over all queries: ``[b, h, L]`` float32.

    Queries are processed in row blocks of ``max_elements`` attention weights (None: 16M), so no
    ``L x L`` matrix is ever built. On a GPU a block holds as many as a share of the free memory
    allows, if more (`restkv.worksizes`): fewer launches, the same weights. The work stays quadratic.
    """
    cpu_elements = elements_at_once(torch.device("cpu")) if max_elements is None else max_elements
    b, h, length, d = queries.shape
    rows = rows_at_once(length, 3 * 4 * h * length, queries.device, max(1, cpu_elements // max(1, h * length)))
    num_kv = keys.shape[1]
    scaling = d**-0.5 if scaling is None else scaling
    k = keys.float().unsqueeze(2).transpose(-1, -2)  # [b, kv, 1, d, L]
    total = torch.zeros(b, h, length, device=queries.device)
    for start in range(0, length, rows):
        stop = min(start + rows, length)
        q = queries[:, :, start:stop].float().reshape(b, num_kv, h // num_kv, stop - start, d)
        logits = (q @ k[..., :stop]).reshape(b, h, stop - start, stop) * scaling
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        future = torch.arange(stop, device=queries.device) > torch.arange(start, stop, device=queries.device)[:, None]
        total[..., :stop] += logits.masked_fill_(future, float("-inf")).softmax(-1).sum(-2)
    return total


@register_policy("h2o")
@dataclass
class H2O(Policy):
    """Accumulated attention of all prompt queries, causal (each query sees only earlier keys).

    The ReST-KV authors' H2O masks only the window block, so earlier queries also attend to
    later keys; this is the causal version of the H2O paper.
    ``max_elements`` is the attention block computed at once on a CPU (memory knob only); on a GPU
    blocks grow to a share of its free memory (`restkv.worksizes`).
    """

    max_elements: int = 1 << 24
    needs_all_queries: ClassVar[bool] = True

    def validate(self) -> None:
        super().validate()
        check_number(type(self).__name__, "max_elements", self.max_elements, low=1, low_open=False, integer=True)

    def score(self, inputs: LayerInputs, keep: int) -> torch.Tensor:
        total = accumulated_attention(inputs.queries, inputs.keys, inputs.scaling, self.max_elements, inputs.softcap)
        return total[..., : inputs.length - self.window]
