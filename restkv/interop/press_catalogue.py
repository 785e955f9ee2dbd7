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

DOWNLOADS = "it downloads {what} from the Hugging Face hub when attached to the whole model (post_init_from_model)"

REFUSED: dict[str, str] = {
    "BasePress": "it is the base class of every press, not a method",
    "ScorerPress": "it is the base class of the scorer presses, not a method",
    "QFilterPress": DOWNLOADS.format(what="its per-model filters"),
    "KVzapPress": DOWNLOADS.format(what="its per-model scoring network"),
    "ExpectedAttentionStatsPress": DOWNLOADS.format(what="per-model query statistics"),
    "FastKVzipPress": DOWNLOADS.format(what="its per-model gates"),
    "RestoreKVPress": DOWNLOADS.format(what="restore embeddings and a LoRA adapter")
    + " and runs an extra forward with them",
    "DuoAttentionPress": "it downloads per-model head patterns over HTTP (or scores heads with 50 extra forwards on "
    "a hub dataset) when attached to the whole model",
    "LUKVPress": "it downloads a budget curve over HTTP, known for one model only (Llama-3.1-8B-Instruct)",
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
)
"""Of those, the ones that wrap a scorer press (``policy.inner``)."""

DECODING = ("DecodingPress", "CompressionRatioDecodingPress", "CAMPress")
"""Presses that compress while decoding (their context stays entered while the prompt decodes)."""
SIZED = ("DecodingPress", "CAMPress")
"""Of those, the ones whose budget is a number of tokens (their ``target_size``), not a ratio."""

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
