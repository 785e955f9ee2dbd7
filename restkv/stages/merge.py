"""Value merging: evicted tokens' values folded into the tokens that stay (a stage any scorer can use).

``merge='cam'`` is CAM (Zhang et al., 2024) as the ReST-KV authors run it (their ``CAMKVCluster``;
facts in ``../shared/golden/README.md``). With ``start = ceil(start_ratio * L)`` and ``r`` the
window, every token ``i`` in ``[start, L - r)`` is, in order, merged with probability ``p_i`` into
the ``r`` tokens after it: ``v[i] / r`` is added to ``v[i + 1 .. i + r]``, so a later token carries
the values merged into it before. ``p_i = s[i] / max(s[:start] ∪ s[i : i + r])``, where ``s`` is
each column's mean over the window's attention rows. The merge changes values, never which
positions are kept (the selection reads the attention only).

Two facts make it cheap and reproducible: the probabilities do not depend on the values, so all
of them, and all the Bernoulli draws, are made at once from a seeded generator (or given, to
replay recorded draws); and the value updates are the authors' sequence of in-place additions,
skipping the steps where no head drew a merge. LOOK-M's pivot merging (the authors'
``merge='pivot'``) is not built. `merge_of` resolves a policy's knobs into the stage (`NoMerge` or
`CamMerge`) once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from restkv.checks import check_choice, check_number
from restkv.scoring import window_attention

if TYPE_CHECKING:
    from restkv.inputs import LayerInputs

MERGES = ("none", "cam")
"""``none``: values are stored as computed; ``cam``: CAM's merging of each token into the next ones."""


def cam_start(length: int, start_ratio: float) -> int:
    """The first token CAM may merge: ``ceil(start_ratio * length)``."""
    return math.ceil(start_ratio * length)


def cam_probabilities(column_means: torch.Tensor, start: int, recent: int) -> torch.Tensor:
    """Merge probabilities ``[steps, heads]`` of tokens ``start .. L - recent - 1`` from ``[heads, L]`` means.

    NaN (a zero maximum) counts as 0 and inf as 1, then everything is clamped to [0, 1].
    """
    length = column_means.shape[-1]
    steps = length - recent - start
    if steps <= 0:
        return column_means.new_zeros((0, column_means.shape[0]))
    sources = column_means[:, start : length - recent]  # [heads, steps]
    following = column_means.unfold(-1, recent, 1)[:, start : length - recent].amax(dim=-1)  # max of s[i : i + r]
    peak = following if start == 0 else torch.maximum(following, column_means[:, :start].amax(dim=-1, keepdim=True))
    probabilities = (sources / peak).T
    probabilities = torch.where(probabilities.isnan(), torch.zeros_like(probabilities), probabilities)
    probabilities = torch.where(probabilities.isinf(), torch.ones_like(probabilities), probabilities)
    return probabilities.clamp(min=0, max=1)


def cam_merge(values: torch.Tensor, draws: torch.Tensor, start: int, recent: int) -> torch.Tensor:
    """``values`` ``[1, heads, L, d]`` after CAM's merges; ``draws`` ``[steps, heads]`` are the 0/1 merge draws.

    Returns a new tensor (the cache's own values are left as they are).
    """
    steps = values.shape[2] - recent - start
    if draws.shape != (max(steps, 0), values.shape[1]):
        raise ValueError(
            f"CAM needs one draw per head for each of the {max(steps, 0)} merge steps: "
            f"shape {(max(steps, 0), values.shape[1])}, got {tuple(draws.shape)}"
        )
    merged = values.clone()
    draws = draws.to(device=values.device, dtype=values.dtype)
    for step in draws.any(dim=-1).nonzero().flatten().tolist():  # steps where no head merges add nothing
        source = start + step
        share = merged[:, :, source] * draws[step].view(1, -1, 1) / recent
        merged[:, :, source + 1 : source + 1 + recent] += share.unsqueeze(2)
    return merged


def draw_merges(probabilities: torch.Tensor, seed: int, layer: int) -> torch.Tensor:
    """Bernoulli draws for ``probabilities``: the same for the same ``seed`` and layer, on any run."""
    generator = torch.Generator(device=probabilities.device).manual_seed(seed * 100_003 + layer)
    return torch.bernoulli(probabilities, generator=generator)


# -- the stage -----------------------------------------------------------------------------------------


class Merge(Protocol):
    """The values a layer stores for its kept positions."""

    setting: str
    active: bool

    def merged_values(
        self, inputs: LayerInputs, selection: object, window: int, gqa: str, draws: torch.Tensor | None = None
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class NoMerge:
    """Values are stored as computed."""

    setting: str = "merge='none'"
    active: bool = False

    def merged_values(
        self, inputs: LayerInputs, selection: object, window: int, gqa: str, draws: torch.Tensor | None = None
    ) -> torch.Tensor:
        return inputs.values


@dataclass(frozen=True)
class CamMerge:
    """CAM's merging of each past token from ``start`` (a share of the prompt) on, draws seeded by ``seed``."""

    start: float
    seed: int
    active: bool = True

    @property
    def setting(self) -> str:
        return "merge='cam'"

    def merged_values(
        self, inputs: LayerInputs, selection: object, window: int, gqa: str, draws: torch.Tensor | None = None
    ) -> torch.Tensor:
        """CAM's merged values; a layer kept whole (``selection`` None) is not merged. ``draws`` replays
        recorded draws. Merging runs per key/value head: a head's merge probability reads its query group's
        attention, reduced by ``gqa`` (``expand`` on grouped heads is refused)."""
        if selection is None:
            return inputs.values
        heads, kv_heads = inputs.num_heads, inputs.num_kv_heads
        if heads != kv_heads and gqa == "expand":
            raise NotImplementedError(
                f"merge='cam' with gqa='expand' on a model with grouped key/value heads ({heads} query, "
                f"{kv_heads} key/value heads) is not built: merged values would differ per query head; use gqa='mean'"
            )
        attention = window_attention(inputs.queries[..., -window:, :], inputs.keys, inputs.scaling, inputs.softcap)
        means = attention[0].mean(dim=-2)  # [h, L]: each column's mean over the window's rows
        if heads != kv_heads:
            grouped = means.view(kv_heads, heads // kv_heads, -1)
            means = grouped.amax(dim=1) if gqa == "max" else grouped.mean(dim=1)
        start = cam_start(inputs.length, self.start)
        if draws is None:
            draws = draw_merges(cam_probabilities(means, start, window), self.seed, inputs.layer)
        return cam_merge(inputs.values, draws, start, window)


def merge_of(owner: str, merge: str, start: float, seed: int) -> Merge:
    """The stage the merge knobs of policy ``owner`` name; a bad value is refused by name."""
    check_choice(owner, "merge", merge, MERGES)
    check_number(owner, "merge_start", start, low=0, high=1, low_open=False)
    check_number(owner, "merge_seed", seed, low=0, low_open=False, integer=True)
    return CamMerge(start, seed) if merge == "cam" else NoMerge()
