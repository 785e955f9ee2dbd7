"""The settings that acted in a run, for its row: eviction phase and budgets, evaluation, protocol.

A run's folder is named after its prefill budget, but under ``compression.phase=decode`` that budget never acts
(the prompt is kept whole; the cache is cut to ``compression.decode_budget`` while answering), and
``evaluation=multi_turn`` compresses the context alone whatever ``protocol`` says. A row labelled by the folder
name alone would read as a prefill run at a budget that did nothing; these columns say what ran instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NOT_ACTING = "-"
"""Shown where a setting did not act (the prefill budget of a decode-only run, decode settings of a prefill run)."""


@dataclass(frozen=True)
class ActedSettings:
    """What a run's row shows (strings, as table cells)."""

    budget: str
    """The prefill budget when eviction happened at the prompt's end, else `NOT_ACTING`."""
    phase: str
    """``prefill``, ``decode`` or ``both``; ``prefill/chunk=N`` under ``compression.prefill_chunk=N``."""
    decode_budget: str
    decode_interval: str
    evaluation: str
    """``generate``, ``fidelity`` or ``multi_turn`` (with ``-no-answers`` when answers are not kept between turns)."""
    protocol: str
    """The protocol that acted: ``query_agnostic`` for multi-turn runs, which compress the context alone."""


def evaluation_name(config: dict[str, Any]) -> str:
    """The evaluation's short name from its ``_target_`` (``restkv.eval.evaluation.MultiTurn`` -> multi_turn)."""
    evaluation = config.get("evaluation") or {}
    target = str(evaluation.get("_target_", "Generate")).rsplit(".", 1)[-1]
    name = {"Generate": "generate", "Fidelity": "fidelity", "MultiTurn": "multi_turn"}.get(target, target)
    if name == "multi_turn" and evaluation.get("append_answers") is False:
        name += "-no-answers"
    return name


def acted_settings(config: dict[str, Any], metrics: dict[str, Any], folder_budget: str) -> ActedSettings:
    """``config`` (the run's ``config.yaml``) and ``metrics`` read into the settings that acted."""
    compression = config.get("compression") or {}
    phase = str(compression.get("phase") or "prefill")
    decoding = phase != "prefill"
    evaluation = evaluation_name(config)
    protocol = str(metrics.get("protocol", config.get("protocol", "")))
    if evaluation.startswith("multi_turn"):
        protocol = "query_agnostic"
    return ActedSettings(
        budget=NOT_ACTING if phase == "decode" else folder_budget,
        phase=f"{phase}/chunk={compression['prefill_chunk']}" if compression.get("prefill_chunk") else phase,
        decode_budget=str(compression.get("decode_budget")) if decoding else NOT_ACTING,
        decode_interval=str(compression.get("decode_interval")) if decoding else NOT_ACTING,
        evaluation=evaluation,
        protocol=protocol,
    )
