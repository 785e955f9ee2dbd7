"""When a run evicts: the ``compression`` settings (phase, decode-time budget and interval) as a `DecodeEviction`.

``compression.phase=prefill`` (the default, the paper's protocol) evicts once, at the end of the prompt;
``decode`` keeps the prompt whole and cuts every layer to ``compression.decode_budget`` tokens every
``compression.decode_interval`` decoded tokens (``compression.decode_schedule=length``: R-KV's authors' timing);
``both`` does the two (`restkv.decode_eviction`). Decode-time
eviction runs in the model's own decoding loop, one prompt at a time: the static and recorded decoders
preallocate a cache that cannot shrink, so asking for them is refused by name.
"""

from __future__ import annotations

from typing import Any

from restkv.chunked_prefill import check_chunked_prefill
from restkv.decode_eviction import DecodeEviction, check_decode_eviction
from restkv.policy import Policy
from restkv.quantize import Quantization


def decode_eviction_of(cfg: Any, policy: Policy, quantization: Quantization) -> DecodeEviction | None:
    """The run's `DecodeEviction` (None for ``phase=prefill``), checked against the policy and the run's settings."""
    settings = cfg.get("compression") or {}
    phase = settings.get("phase", "prefill")
    budget = settings.get("decode_budget")
    if phase == "prefill":
        if settings.get("decode_schedule", "interval") != "interval":
            raise ValueError(
                f"compression.decode_schedule={settings.get('decode_schedule')!r} is set but compression.phase="
                "'prefill' evicts at the end of the prompt only: add compression.phase=decode (or both)"
            )
        if budget is not None:
            raise ValueError(
                f"compression.decode_budget={budget} is set but compression.phase='prefill' evicts at the end of "
                "the prompt only: add compression.phase=decode (or both)"
            )
        return None
    if budget is None:
        raise ValueError(
            f"compression.phase={phase!r} evicts during decoding and needs compression.decode_budget (tokens each "
            "layer keeps, window included)"
        )
    interval, schedule = settings.get("decode_interval", 32), settings.get("decode_schedule", "interval")
    eviction = DecodeEviction(budget, interval, phase, schedule)
    check_decode_eviction(policy, eviction, cfg.get("layout", "auto"), quantization if quantization.enabled else None)
    decode, batch = cfg.get("decode", "auto"), cfg.get("decode_batch", "auto")
    if decode in ("static", "graph"):
        raise ValueError(
            f"decode={decode} preallocates a cache that decode-time eviction cannot shrink: use decode=eager "
            "(or auto, which decodes eagerly under compression.phase=" + phase + ")"
        )
    if batch not in ("auto", 1):
        raise ValueError(f"decode_batch={batch}: decode-time eviction decodes one prompt at a time; use 1 (or auto)")
    return eviction


def prefill_chunk_of(cfg: Any, policy: Policy, eviction: DecodeEviction | None, model_config: Any = None) -> int | None:
    """``compression.prefill_chunk`` (None: the prompt in one forward), checked against the policy, the decode-time
    eviction and the model's config when it is known (`restkv.chunked_prefill.check_chunked_prefill`)."""
    chunk = (cfg.get("compression") or {}).get("prefill_chunk")
    if chunk is not None:
        check_chunked_prefill(policy, chunk, model_config, eviction)
    return chunk
