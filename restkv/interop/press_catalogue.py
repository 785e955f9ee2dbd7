"""Every press of kvpress 0.5.5, and whether it runs as ``policy=kvpress policy.press=<Name>``.

Four ways a press runs here (`restkv.interop.kvpress_policy`): a *scorer* press gives scores and we keep
the budget's best; a *wrapper* around a scorer press (``policy.inner``) or a press with its own selection
runs its own ``compress`` and we read back which positions it kept (head-wise ones through the mask kvpress
would apply); a press that needs more (extra forwards, re-rotation, decoding) runs through kvpress's own
hooks around our prefill (`restkv.interop.press_hooks.HOOKED`); the rest are refused, for the reason below. The table in
``docs/kvpress-presses.md`` is generated from this module (``python scripts/kvpress_table.py``) and tested
against the installed kvpress.
"""

from __future__ import annotations

REFUSED: dict[str, str] = {
    "BasePress": "it is the base class of every press, not a method",
    "ScorerPress": "it is the base class of the scorer presses, not a method",
    "KVComposePress": "it replaces model.model.forward and runs a second, eager forward over the prompt",
    "FinchPress": "it needs the question inside the prefill behind a delimiter token it adds to the tokenizer, and "
    "re-rotates the kept keys",
    "ThinKPress": "it zeroes key channels, not tokens; policy.think_ratio is ThinK on any policy here",
    "SimLayerKVPress": "its lazy layers are chosen by lazy_threshold, not by a budget, so a budget sweep cannot "
    "drive it",
    "PerLayerCompressionPress": "its per-layer compression_ratios replace the budget; policy.schedule sets per-layer "
    "budgets here",
    "ComposedPress": "it applies several presses in turn, so its budget is a product of ratios, not one budget",
    "DMSPress": "it evicts by a score threshold (not a budget), during decoding too, through kvpress's mask",
}
"""Presses that do not run here, and why (each names what to use instead where we have it)."""

HOOKED: dict[str, tuple[str, ...]] = {
    "KVzipPress": ("layerwise", "n_sink", "chunk_size"),
    "KVgradPress": ("layerwise", "n_sink", "chunk_size"),
    "KeyRerotationPress": (),
    "DecodingPress": ("compression_interval",),
    "CompressionRatioDecodingPress": ("compression_interval",),
    "CAMPress": ("compression_interval",),
    "PrefillDecodingPress": (),
    "MergingPress": (),
}
"""Presses run through kvpress's own hooks around our prefill (`restkv.interop.press_hooks`), and the settings each
takes (besides the budget's ratio or size)."""

HOOKED_WRAPPERS = (
    "KeyRerotationPress",
    "DecodingPress",
    "CompressionRatioDecodingPress",
    "CAMPress",
    "PrefillDecodingPress",
    "MergingPress",
)
"""Of those, the ones that wrap a scorer press (``policy.inner``)."""

DECODING = ("DecodingPress", "CompressionRatioDecodingPress", "CAMPress")
"""Presses that compress while decoding (their context stays entered while the prompt decodes)."""
SIZED = ("DecodingPress", "CAMPress")
"""Of those, the ones whose budget is a number of tokens (their ``target_size``), not a ratio."""


FILE_SCORERS: dict[str, tuple[str, ...]] = {
    "QFilterPress": (),
    "KVzapPress": ("model_type",),
    "ExpectedAttentionStatsPress": ("n_future_positions", "n_sink", "use_covariance", "use_vnorm", "epsilon"),
}
"""Scorer presses that load per-model files (`restkv.interop.press_files`), then score through our integration."""

FILE_HOOKED: dict[str, tuple[str, ...]] = {
    "FastKVzipPress": ("layerwise", "n_sink"),
    "RestoreKVPress": ("layerwise", "n_sink", "chunk_size"),
    "DuoAttentionPress": (),
    "LUKVPress": (),
}
"""Presses that load per-model files and run through kvpress's hooks (in `HOOKED` too)."""
HOOKED.update(FILE_HOOKED)
HOOKED_WRAPPERS += ("LUKVPress",)

FILES: dict[str, str] = {
    "QFilterPress": "its filters, from the hub's nthngdy/<model>_qfilt",
    "KVzapPress": "its scoring network, from the hub's nvidia/KVzap-<model_type>-<model>",
    "ExpectedAttentionStatsPress": "query statistics, from the hub's alessiodevoto/exp_att_stats_<model>_..., or "
    "the folder `policy.files` names",
    "FastKVzipPress": "its gates, from the hub's Jang-Hyun/Fast-KVzip",
    "RestoreKVPress": "restore embeddings and a LoRA adapter (peft), from the hub's higokri/RestoreKV-<model>",
    "DuoAttentionPress": "head patterns over HTTP (DuoAttention's GitHub), for the six models kvpress lists, or from "
    "the folder `policy.files` names; the budget sets the share of streaming heads (met on average, to one head's "
    "share)",
    "LUKVPress": "a budget curve over HTTP (LU-KV's GitHub), for Llama-3.1-8B-Instruct over ExpectedAttentionPress "
    "only, or from the folder `policy.files` names",
}
"""What each of those loads per model, and from where (for the docs table); offline, each is refused before any work
when its files are not here, naming what to fetch."""
