"""KVzip natively (``policy=kvzip``) through the scoring-pass seam (`restkv.scoring_pass`).

The first tests need no kvpress: KVzip runs on the micro model under each level (uniform: a dense
cache; layer and global: variable-length), its reconstruction chunks are built as the authors and
kvpress build them, the prompt's cache is left as the prefill wrote it, and the pass is counted in
the record and the latency entries. The last ones compare its kept positions with kvpress's
``KVzipPress`` (in CI's kvpress leg; they skip without kvpress).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from restkv import get_policy
from restkv.baselines.kvzip import CARRIED, FIRST_PROMPT, LATER_PROMPT, KVzip
from restkv.cache import CompressedLayer
from restkv.eval.latency.records import prefill_entry
from restkv.eval.latency.timing import prefill
from restkv.head_selection import HeadSelection
from restkv.integrate import compress
from restkv.scoring_pass import ScoringContext
from restkv.storage.varlen import VarlenLayer

MICRO = Path(__file__).resolve().parents[1] / "models" / "micro-llama"
LENGTH = 200


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(MICRO, dtype=torch.float32, attn_implementation="sdpa").eval()


def prompt(seed: int = 0, length: int = LENGTH) -> torch.Tensor:
    return torch.randint(3, 8000, (1, length), generator=torch.Generator().manual_seed(seed))


def prefilled(model, policy, budget, ids):
    with compress(model, policy, budget=budget) as compressor, torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, cache=cache, use_cache=True)
        step = model(input_ids=ids[:, -1:], cache=cache, position_ids=torch.tensor([[ids.shape[1]]]))
    return compressor.record, cache, step.logits


@pytest.mark.parametrize("level", ["uniform", "layer", "global"])
def test_kvzip_runs_and_the_cache_shrinks(model, level: str) -> None:
    record, cache, logits = prefilled(model, get_policy("kvzip", level=level, chunk_size=64), 100, prompt())
    assert torch.isfinite(logits).all()
    heads = model.config.num_key_value_heads
    if level == "uniform":
        assert all(isinstance(layer, CompressedLayer) for layer in cache.layers)
        assert record.kept == [100] * 4 and all(lengths is None for lengths in record.head_lengths)
    else:
        assert all(isinstance(layer, VarlenLayer) for layer in cache.layers)
        assert all(isinstance(selection, HeadSelection) for selection in record.indices)
        totals = [sum(lengths) for lengths in record.head_lengths]
        assert sum(totals) == 4 * heads * 100  # the budget, shared as the level says
        if level == "layer":
            assert totals == [heads * 100] * 4
        else:
            assert len(set(totals)) > 1  # one budget over all layers: they keep different numbers
    # the sinks are always kept; 200 tokens in chunks of 64: four reconstruction forwards
    first = record.indices[0]
    rows = first.per_head() if isinstance(first, HeadSelection) else list(first[0])
    assert all(set(range(4)) <= set(row.tolist()) for row in rows)
    assert record.scoring_forwards == 4 and record.scoring_tokens > LENGTH and record.scoring_seconds > 0
    assert record.scoring_summary()["scoring_pass_forwards"] == 4


def test_the_reconstruction_chunks_are_the_authors(model) -> None:
    tokenizer = AutoTokenizer.from_pretrained(MICRO)
    ids = prompt(1, 150)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    for flavour in ("authors", "kvpress"):
        chunks = KVzip(chunk_size=64, flavour=flavour).scoring_chunks(ScoringContext(ids, str(MICRO)))
        assert [(c.start, c.end) for c in chunks] == [(0, 64), (64, 128), (128, 150)]
        newline = encode("\n")  # the suffix of a tokenizer without a chat template
        assert chunks[0].ids[0].tolist() == encode(FIRST_PROMPT) + newline + ids[0, :64].tolist()
        later = encode(LATER_PROMPT[flavour]) + ids[0, 64 - CARRIED : 64].tolist() + newline + ids[0, 64:128].tolist()
        assert chunks[1].ids[0].tolist() == later
    assert LATER_PROMPT["authors"] == LATER_PROMPT["kvpress"] + " "
    assert KVzip().scoring_chunks(ScoringContext(prompt(2, 2100), str(MICRO)))[0].end == 2000  # the authors' size
    assert KVzip(flavour="kvpress").scoring_chunks(ScoringContext(prompt(2, 2100), str(MICRO)))[0].end == 2048


def test_the_scoring_pass_leaves_the_prompts_cache_as_the_prefill_wrote_it(model) -> None:
    ids = prompt(3)
    full = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, cache=full, use_cache=True)
    record, cache, _ = prefilled(model, get_policy("kvzip", level="uniform", chunk_size=64), 100, ids)
    for index, layer in enumerate(cache.layers):
        kept = record.indices[index]
        keys = full.layers[index].keys
        expected = keys.gather(2, kept[..., None].expand(-1, -1, -1, keys.shape[-1]))
        assert torch.equal(layer.keys[:, :, :100], expected)


def test_the_extra_passes_are_in_the_latency_entries(model) -> None:
    policy = get_policy("kvzip", level="uniform", chunk_size=64)
    with compress(model, policy, budget=100, timed=True) as compressor:
        run, _ = prefill(model, prompt(4), compressor)
    assert run.scoring["scoring_pass_forwards"] == 4
    timed = [{"seconds": run.seconds, "eviction_seconds": run.eviction_seconds, "cache": run.cache}]
    timed[0]["scoring"] = run.scoring
    entry = prefill_entry({"job": {"context": LENGTH, "policy": "kvzip", "budget": 100}, "timed": timed}, 1)
    assert entry["scoring_pass_forwards"] == 4 and entry["scoring_pass_tokens"] == run.scoring["scoring_pass_tokens"]
    assert 0 < entry["scoring_pass_seconds_median"] <= entry["eviction_seconds_median"]


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"gqa": "mean"}, r"KVzip.gqa='mean' is not allowed: KVzip sets it itself \(gqa='max'\)"),
        ({"level": "pair"}, r"level"),
        ({"window": 8}, r"KVzip.window=8 is not allowed"),
        ({"flavour": "paper"}, r"flavour"),
        ({"schedule": "pyramid"}, r"KVzip.schedule='pyramid' is not allowed"),
        ({"merge": "cam"}, r"KVzip.merge='cam' is not allowed"),
        ({"think_ratio": 0.5}, r"KVzip.think_ratio=0.5 is not allowed"),
        ({"allocation": "adakv"}, r"KVzip.allocation='adakv' is not allowed"),
    ],
)
def test_bad_knobs_are_refused(knobs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KVzip(**knobs)


def test_a_prefill_without_token_ids_is_refused(model) -> None:
    ids = prompt(5)
    embeds = model.get_input_embeddings()(ids).detach()
    with compress(model, get_policy("kvzip"), budget=100), torch.no_grad(), pytest.raises(NotImplementedError):
        model(inputs_embeds=embeds, cache=DynamicCache(config=model.config))


# --- against kvpress's KVzipPress ------------------------------------------------------------------------


def kvpress_visible(model, ids: torch.Tensor, ratio: float, layerwise: bool, chunk: int) -> list[torch.Tensor]:
    kvpress = pytest.importorskip("kvpress", reason="kvpress is not installed (CI's kvpress leg)")
    press = kvpress.KVzipPress(compression_ratio=ratio, chunk_size=chunk, layerwise=layerwise)
    with torch.no_grad(), press(model):
        model(input_ids=ids, past_key_values=DynamicCache(config=model.config))
    visible = []
    for layer in model.model.layers:
        _, head, position = layer.self_attn.__dict__.pop("masked_key_indices")
        mask = torch.ones(model.config.num_key_value_heads, ids.shape[1], dtype=torch.bool)
        mask[head, position] = False
        visible.append(mask)
    return visible


@pytest.mark.parametrize(("ratio", "level", "chunk"), [(0.5, "global", 64), (0.75, "global", 2048), (0.5, "layer", 64)])
def test_kept_positions_match_kvpress_kvzip(model, ratio: float, level: str, chunk: int) -> None:
    ids = prompt(6)
    theirs = kvpress_visible(model, ids, ratio, level == "layer", chunk)
    budget = round(LENGTH * (1 - ratio))
    policy = get_policy("kvzip", level=level, chunk_size=chunk, flavour="kvpress")
    record, _, _ = prefilled(model, policy, budget, ids)
    for layer, selection in enumerate(record.indices):
        ours = torch.zeros_like(theirs[layer])
        for head, positions in enumerate(selection.per_head()):
            ours[head, positions] = True
        assert torch.equal(ours, theirs[layer]), f"layer {layer}: {int((ours != theirs[layer]).sum())} differ"
