"""HeadKV's head-importance file for any model: retrieval-head scores on copy-the-needle probes.

A retrieval head (Wu et al., 2024, the scores HeadKV allocates budgets from) is one that copies:
while the model reproduces a needle it read in a long context, the head's strongest attention
lands on the needle token being produced. A probe here is a haystack with one needle sentence,
a request to repeat it, and the needle itself as the answer, run teacher-forced in one forward
pass, so the score exists even for a model that fails to copy. For every answer token ``t`` (the
query one position earlier predicts it) and every (layer, query head), a *copy event* is the
head's attention argmax over the keys falling on a needle position that holds ``t``; with
``require_correct`` only answer positions the model itself predicts right count (the paper's
"generated" condition). A head's score on a probe is its copy events over the answer's length.

The attention rows are computed from the exact queries and keys the model used (position-encoded,
normalised) through the eviction integration, with a policy that observes and keeps everything:
only the answer's rows, never an ``L x L`` matrix per layer.

The file is HeadKV's format: ``{"<layer>-<head>": [score per probe, ...]}``, layer-major.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from tqdm import tqdm
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from restkv.eval.benchmarks.shared.haystack import load_haystack
from restkv.integrate import attention_layers, compress
from restkv.policy import LayerInputs, Policy
from restkv.select import Budget
from restkv.windows import module_windows

WORDS = ("amber", "cobalt", "falcon", "harbor", "juniper", "lantern", "meadow", "orchid", "quartz", "willow")


@dataclass(frozen=True)
class Probe:
    """One copy-the-needle prompt as token ids: ``ids`` = haystack with the needle + request + answer."""

    ids: list[int]
    needle_start: int
    needle_length: int
    answer_start: int

    @property
    def answer(self) -> list[int]:
        return self.ids[self.answer_start :]


MIN_LENGTH = 64
"""The shortest probe: room for the needle twice, the request and some haystack around the needle."""


def check_probe_settings(lengths: list[int], depths: list[float], samples: int, max_length: int | None = None) -> None:
    """Refuse, before any model is loaded, a probe setting that cannot make probes, naming the value.

    ``max_length`` (the model's ``max_position_embeddings``, when known) bounds the lengths: past it
    the positions are ones the model never saw, and its attention peaks would mean nothing.
    """
    if not lengths:
        raise ValueError("no probe lengths given; give at least one token count")
    for length in lengths:
        if isinstance(length, bool) or not isinstance(length, int) or length < MIN_LENGTH:
            raise ValueError(f"probe length {length!r} is not allowed; lengths are token counts >= {MIN_LENGTH}")
        if max_length is not None and length > max_length:
            raise ValueError(
                f"probe length {length} is not allowed: the model has positions for {max_length} tokens "
                f"(max_position_embeddings); use lengths in [{MIN_LENGTH}, {max_length}]"
            )
    if not depths:
        raise ValueError("no needle depths given; give at least one fraction in [0, 1]")
    for depth in depths:
        if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0 <= depth <= 1:
            raise ValueError(f"depth {depth!r} is not allowed; depths are fractions in [0, 1]")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples={samples!r} is not allowed; it must be an integer >= 1")


def build_probes(
    tokenizer: PreTrainedTokenizerBase,
    lengths: list[int],
    depths: list[float],
    samples: int,
    seed: int = 0,
    haystack: str | None = None,
) -> list[Probe]:
    """``samples`` probes per (length, depth): a needle at ``depth`` of a ``length``-token prompt.

    Built on token ids (haystack ids cut at the depth, the needle's ids, then the request and the
    needle again as the answer), so the needle's positions are known exactly.
    """
    check_probe_settings(lengths, depths, samples)
    text_ids = tokenizer(load_haystack(haystack), add_special_tokens=False, verbose=False)["input_ids"]
    if not text_ids:
        raise ValueError(f"haystack {haystack!r} holds no text to fill the probes with")
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    rng = random.Random(seed)
    probes = []
    for length in lengths:
        for depth in depths:
            for _ in range(samples):
                word, number = rng.choice(WORDS), rng.randrange(1_000_000, 9_999_999)
                needle = tokenizer(f" The special magic number for {word} is {number}.", add_special_tokens=False)
                request = tokenizer(
                    f"\nRepeat the sentence about the special magic number for {word}.\nAnswer:",
                    add_special_tokens=False,
                )
                needle_ids, request_ids = needle["input_ids"], request["input_ids"]
                fill = length - len(bos) - 2 * len(needle_ids) - len(request_ids)
                if fill < 16:
                    needed = length - fill + 16
                    raise ValueError(
                        f"probe length {length} is too short for the needle and the request on this tokenizer; "
                        f"use lengths >= {needed}"
                    )
                start = rng.randrange(0, max(1, len(text_ids) - fill))
                background = (text_ids * (1 + fill // max(len(text_ids), 1)))[start : start + fill]
                cut = round(depth * len(background))
                ids = bos + background[:cut] + needle_ids + background[cut:] + request_ids + needle_ids
                probes.append(Probe(ids, len(bos) + cut, len(needle_ids), len(ids) - len(needle_ids)))
    return probes


@dataclass
class RetrievalProbe(Policy):
    """Keeps everything; records, per layer and query head, where each answer row's attention peaks.

    Set ``rows`` (the positions whose queries predict the answer tokens) before the forward; after
    it, ``argmax[layer]`` is int64 ``[heads, len(rows)]``. The mask is the model's: causal, and
    limited to the last ``sliding_windows[layer]`` keys for layers with a sliding window (Mistral,
    some Qwen layers; `layer_windows`). Query head ``i`` reads key/value head ``i // (h / h_kv)``.
    Not registered: a measuring device, not an eviction policy.
    """

    evicts: ClassVar[bool] = False
    needs_all_queries: ClassVar[bool] = True
    rows: list[int] = field(default_factory=list)
    sliding_windows: dict[int, int] = field(default_factory=dict)
    argmax: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    def select(self, inputs: LayerInputs, budget: Budget) -> None:
        if not self.rows or max(self.rows) >= inputs.length or min(self.rows) < 0:
            raise ValueError(
                f"RetrievalProbe.rows must be positions in [0, {inputs.length}) of the {inputs.length}-token prompt"
            )
        rows = torch.tensor(self.rows, device=inputs.queries.device)
        queries = inputs.queries[0, :, rows]  # [h, A, d]
        keys = inputs.keys[0]  # [h_kv, L, d]
        heads, answers, dim = queries.shape
        group = heads // keys.shape[0]
        scaling = inputs.scaling if inputs.scaling is not None else dim**-0.5
        grouped = queries.reshape(keys.shape[0], group, answers, dim).float()
        logits = grouped @ keys.float().transpose(-1, -2)[:, None]  # [h_kv, group, A, L]
        positions = torch.arange(keys.shape[1], device=keys.device)[None, :]
        hidden = positions > rows[:, None]  # causal: [A, L]
        window = self.sliding_windows.get(inputs.layer)
        if window is not None:
            hidden |= positions <= rows[:, None] - window
        logits = (logits * scaling).masked_fill(hidden, float("-inf"))
        self.argmax[inputs.layer] = logits.argmax(dim=-1).reshape(heads, answers).cpu()
        return None


def layer_windows(model: PreTrainedModel) -> dict[int, int]:
    """The sliding window of every attention layer that has one, by layer (empty for Llama; `restkv.windows`)."""
    return module_windows(attention_layers(model), model.config)


@torch.no_grad()
def probe_scores(model: PreTrainedModel, probe: Probe, require_correct: bool = False) -> torch.Tensor:
    """Each (layer, query head)'s copy events over the answer length on one probe: ``[layers, heads]``."""
    rows = list(range(probe.answer_start - 1, len(probe.ids) - 1))
    targets = probe.ids[probe.answer_start :]
    needle = probe.ids[probe.needle_start : probe.needle_start + probe.needle_length]
    observer = RetrievalProbe(window=1, rows=rows, sliding_windows=layer_windows(model))
    ids = torch.tensor([probe.ids], device=model.device)
    with compress(model, observer, budget=len(probe.ids)):
        # full (not sliding-window) cache layers: the probe needs every key; the model's mask still
        # applies its sliding windows, and the probe applies them too
        logits = model(ids, cache=DynamicCache()).logits[0]
    # per answer token, the needle positions holding it: a copy lands on one of them
    holds = torch.zeros(len(rows), len(probe.ids), dtype=torch.bool)
    for a, token in enumerate(targets):
        for offset, needle_token in enumerate(needle):
            if needle_token == token:
                holds[a, probe.needle_start + offset] = True
    counted = torch.ones(len(rows), dtype=torch.bool)
    if require_correct:
        counted = logits[rows].argmax(-1).cpu() == torch.tensor(targets)
    layers = sorted(observer.argmax)
    scores = []
    for layer in layers:
        peak = observer.argmax[layer]  # [heads, A]
        copied = holds.gather(1, peak.T).T & counted  # [heads, A]
        scores.append(copied.sum(-1).float() / len(rows))
    return torch.stack(scores)


def retrieval_scores(
    model: PreTrainedModel, probes: list[Probe], require_correct: bool = False, progress: bool = True
) -> dict[str, list[float]]:
    """HeadKV's head file content: ``{"<layer>-<head>": [score on each probe]}``, layer-major.

    The probes are token ids (`build_probes` tokenizes them), so no tokenizer is needed here.
    """
    if not probes:
        raise ValueError("no probes to score; build_probes makes them")
    per_probe = [
        probe_scores(model, probe, require_correct)
        for probe in tqdm(probes, desc="retrieval probes", unit="probe", disable=not progress)
    ]
    stacked = torch.stack(per_probe)  # [probes, layers, heads]
    _, layers, heads = stacked.shape
    return {
        f"{layer}-{head}": [round(float(v), 6) for v in stacked[:, layer, head]]
        for layer in range(layers)
        for head in range(heads)
    }


def write_head_scores(path: str | Path, scores: dict[str, list[float]]) -> Path:
    """Write a head file (one JSON object on one line, as HeadKV's files are)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(scores) + "\n")
    return path
