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
}
"""Presses that do not run here, and why (each names what to use instead where we have it)."""

FILE_HOOKED: dict[str, tuple[str, ...]] = {
    "FastKVzipPress": ("layerwise", "n_sink"),
    "RestoreKVPress": ("layerwise", "n_sink", "chunk_size"),
    "DuoAttentionPress": (),
    "LUKVPress": (),
}
"""Presses that load per-model files and run through kvpress's hooks (part of `HOOKED`)."""

HOOKED: dict[str, tuple[str, ...]] = {
    "KVzipPress": ("layerwise", "n_sink", "chunk_size"),
    "KVgradPress": ("layerwise", "n_sink", "chunk_size"),
    "KeyRerotationPress": (),
    "DecodingPress": ("compression_interval",),
    "CompressionRatioDecodingPress": ("compression_interval",),
    "CAMPress": ("compression_interval",),
    "PrefillDecodingPress": (),
    "MergingPress": (),
    "KVComposePress": (
        "structured",
        "agg_task",
        "agg_group",
        "agg_head",
        "add_v_norm",
        "add_mean_across_heads",
        "keep_token_lower_bound",
    ),
    "FinchPress": ("chunk_length", "normalize_scores", "rerotate_keys"),
    "ThinKPress": ("key_channel_compression_ratio", "window_size"),
    "SimLayerKVPress": ("lazy_threshold", "n_last", "n_recent", "n_initial"),
    "PerLayerCompressionPress": ("compression_ratios",),
    "ComposedPress": ("presses",),
    "DMSPress": ("threshold", "sliding_window_size", "decoding"),
    **FILE_HOOKED,
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
    "PerLayerCompressionPress",
    "DMSPress",
    "LUKVPress",
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

NOT_BUDGETED: dict[str, str] = {
    "ThinKPress": "its key_channel_compression_ratio: it zeroes that share of each head's key channels and keeps "
    "every token",
    "SimLayerKVPress": "its lazy_threshold: a layer it finds lazy keeps its first n_initial and last n_recent "
    "tokens, the others keep every token",
    "PerLayerCompressionPress": "its compression_ratios: each layer keeps the share of the prompt its ratio leaves",
    "DMSPress": "its threshold: it masks the tokens its inner press scores below it, all but the last "
    "sliding_window_size (while decoding too with decoding=true)",
}
"""Presses on kvpress's hooks that the budget does not drive, and what does. They run on every prompt (not only
those longer than the budget), and each record says what drove them (``kvpress_driven_by``)."""

QUESTION_WINDOW = ("FinchPress",)
"""Presses whose observation window is the question, inside the prefill (``protocol=query_aware`` only)."""

REROTATING = ("KeyRerotationPress", "FinchPress")
"""Presses that re-rotate the kept keys onto positions ``0..kept-1`` (FinchPress unless ``rerotate_keys=false``):
what follows the prefill continues at position ``kept``, as in kvpress's pipeline."""

COMPOSED_EXTRA = ("ThinKPress",)
"""Presses ComposedPress may list besides the scorer presses (ThinK's key channels, after the tokens are chosen)."""

HOOKED_HOW: dict[str, str] = {
    "KVComposePress": "a second, eager pass over the prompt scores it; the budget is the mean per layer, up to "
    "kvpress's rounding (it shares the whole cache's budget out across layers, so layers keep different counts); "
    "`structured=false` is refused (kvpress 0.5.5 leaves that pass's copy of the prompt in the cache, unmasked)",
    "FinchPress": "its window is the question, inside the prefill (`protocol=query_aware` only; kvpress's delimiter "
    "token is replaced by the question's length); the kept keys are re-rotated and what follows continues at the "
    "kept length",
    "ComposedPress": "`policy.presses=[SnapKVPress,KnormPress,...]` (scorer presses, and ThinKPress) in turn; each "
    "press that evicts tokens keeps the same share of what reaches it, the last exactly the budget; a setting goes "
    "to every listed press that takes it",
}
"""For the table: how the hooked presses that need more than a ratio run (the budget-free ones: `NOT_BUDGETED`)."""
