"""Every press of kvpress 0.5.5, and whether it runs as ``policy=kvpress policy.press=<Name>``.

Three ways a press runs here (`restkv.interop.kvpress_policy`): a *scorer* press gives scores and we keep
the budget's best; a *wrapper* around a scorer press (``policy.inner``) or a press with its own selection
runs its own ``compress`` and we read back which positions it kept (head-wise ones through the mask kvpress
would apply); the rest are refused, for the reason below, and run in kvpress's own pipeline. The table in
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
    "KVzipPress": "it replays the context through extra forward passes after the prefill (its own hooks on "
    "model.model.forward), which our integration does not run",
    "KVgradPress": "it runs a forward and a backward pass per chunk with a cache class of its own",
    "KVComposePress": "it replaces model.model.forward and runs a second, eager forward over the prompt",
    "FinchPress": "it needs the question inside the prefill behind a delimiter token it adds to the tokenizer, and "
    "re-rotates the kept keys",
    "KeyRerotationPress": "it re-rotates the kept keys to new positions, which changes what the model computes after "
    "eviction (our caches keep each token's original position)",
    "MergingPress": "it merges evicted values into kept ones; policy.merge=cam is our value merging",
    "ThinKPress": "it zeroes key channels, not tokens; policy.think_ratio is ThinK on any policy here",
    "SimLayerKVPress": "its lazy layers are chosen by lazy_threshold, not by a budget, so a budget sweep cannot "
    "drive it",
    "PerLayerCompressionPress": "its per-layer compression_ratios replace the budget; policy.schedule sets per-layer "
    "budgets here",
    "ComposedPress": "it applies several presses in turn, so its budget is a product of ratios, not one budget",
    "DecodingPress": "it compresses during decoding; eviction here happens at the end of prefill",
    "CompressionRatioDecodingPress": "it compresses during decoding; eviction here happens at the end of prefill",
    "PrefillDecodingPress": "it pairs a prefill press with a decoding one; run its prefill press by name",
    "CAMPress": "it compresses and merges during decoding; policy.merge=cam is CAM at prefill",
    "DMSPress": "it evicts by a score threshold (not a budget), during decoding too, through kvpress's mask",
}
"""Presses that do not run here, and why (each names what to use instead where we have it)."""
