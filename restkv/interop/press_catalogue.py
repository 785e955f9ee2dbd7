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
