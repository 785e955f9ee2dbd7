"""The last kvpress presses that needed more than a ratio, on kvpress's hooks (`restkv.interop.press_builds`).

KVComposePress, FinchPress, ThinKPress, SimLayerKVPress, PerLayerCompressionPress, ComposedPress and DMSPress run
on the micro model (CI's kvpress leg; skipped without kvpress): a prefill, a few decoded tokens, the route and what
drove the press in the record. Each keeps what kvpress's own hooks keep on the same prompt (FinchPress: behind its
delimiter token, on a copy of the model with the token added, as kvpress's pipeline runs it), and the settings
these presses cannot run with are refused with the reason.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from conftest import prefill_and_decode
from transformers import AutoModelForCausalLM, DynamicCache

from restkv.integrate import compress
from restkv.interop import compression_ratio, kvpress_kept
from restkv.interop.kvpress_policy import KVPressPolicy
from restkv.interop.press_builds import DRIVERS, composed_ratios, question_in_prefill
from restkv.interop.press_catalogue import HOOKED, NOT_BUDGETED, REFUSED
from restkv.interop.press_hooks import press_hooks
from restkv.select import Budget

MICRO = Path(__file__).resolve().parents[1] / "models" / "micro-llama"
TABLE = Path(__file__).resolve().parents[1] / "docs" / "kvpress-presses.md"
LENGTH, BUDGET, STEPS, QUESTION = 200, 100, 6, 24
RATIOS = [0.2, 0.4, 0.6, 0.8]

KNOBS: dict[str, dict] = {
    "KVComposePress": {},
    "FinchPress": {},
    "ThinKPress": {"key_channel_compression_ratio": 0.5},
    "SimLayerKVPress": {"lazy_threshold": 0.3, "n_recent": 32, "n_initial": 4},
    "PerLayerCompressionPress": {"inner": "KnormPress", "compression_ratios": RATIOS},
    "ComposedPress": {
        "presses": ["SnapKVPress", "KnormPress", "ThinKPress"],
        "window_size": 16,
        "key_channel_compression_ratio": 0.25,
    },
    "DMSPress": {"inner": "KnormPress", "threshold": -6.0, "sliding_window_size": 32, "decoding": True},
}
"""Each press with settings that make it act on a 200-token prompt of the micro model."""


@pytest.fixture(scope="module")
def model():
    pytest.importorskip("kvpress", reason="kvpress is not installed (CI's kvpress leg)")
    return AutoModelForCausalLM.from_pretrained(MICRO, dtype=torch.float32, attn_implementation="sdpa").eval()


def prompt() -> torch.Tensor:
    return torch.randint(3, 8000, (1, LENGTH), generator=torch.Generator().manual_seed(0))


def run(model, policy: KVPressPolicy, steps: int = STEPS):
    """Prefill (the last `QUESTION` tokens said to be the question) and ``steps`` greedy tokens, as the runner does."""
    return prefill_and_decode(model, policy, BUDGET, prompt(), steps, lambda: question_in_prefill(QUESTION))


def test_the_seven_presses_are_no_longer_refused() -> None:
    assert not set(KNOBS) & set(REFUSED) and set(KNOBS) <= set(HOOKED)


def test_the_press_table_says_the_route_and_what_the_budget_does_not_drive() -> None:
    rows = {line.split("`")[1]: line for line in TABLE.read_text().splitlines() if line.startswith("| `")}
    for press in KNOBS:
        assert "| yes, kvpress's hooks |" in rows[press]
        budgetless = press in NOT_BUDGETED
        assert ("**the budget does not drive it**" in rows[press]) == budgetless
        assert not budgetless or f"its {DRIVERS[press]}" in rows[press]


@pytest.mark.parametrize("press", sorted(KNOBS))
def test_each_press_runs_says_its_route_and_what_drove_it(model, press: str) -> None:
    policy = KVPressPolicy(press=press, **KNOBS[press])
    assert policy.route == "kvpress_hooks" and not policy.evicts
    record, cache, logits, masks = run(model, policy)
    assert torch.isfinite(logits).all()
    assert record.notes["kvpress_route"] == "kvpress_hooks" and record.prompt_length == LENGTH
    driven = record.notes["kvpress_driven_by"]
    if press == "ComposedPress":  # the budget for the tokens, ThinK's ratio for the key channels
        assert driven == "budget (the tokens kept); ThinKPress's key channels: key_channel_compression_ratio=0.25"
    else:
        assert driven == "budget" if press not in NOT_BUDGETED else driven.startswith(f"{DRIVERS[press]}=")
    lengths = [layer.keys.shape[2] for layer in cache.layers]
    if press in ("FinchPress", "ComposedPress"):
        assert record.kept == [BUDGET] * 4 and lengths == [BUDGET + STEPS] * 4
    elif press == "KVComposePress":  # the budget shared out across layers: their mean is the budget
        assert sum(record.kept) == 4 * BUDGET and len(set(record.kept)) > 1
        assert lengths == [kept + STEPS for kept in record.kept]
    elif press == "ThinKPress":  # every token kept, half of each head's key channels zeroed
        assert record.kept == [LENGTH] * 4 and "not the budget" in driven
        zeroed = [(layer.keys[0, :, :LENGTH] == 0).all(dim=1).sum(dim=-1).tolist() for layer in cache.layers]
        assert zeroed == [[16, 16]] * 4
    elif press == "SimLayerKVPress":  # lazy layers keep n_initial + n_recent - n_last tokens, the others all
        assert set(record.kept) == {LENGTH, 4 + 32 - 1}
    elif press == "PerLayerCompressionPress":
        assert record.kept == [kvpress_kept(LENGTH, ratio) for ratio in RATIOS]
    else:  # DMSPress: masked below its threshold, its window kept, masking on while decoding
        assert record.notes["kvpress_cache"] == "masked" and lengths == [LENGTH + STEPS] * 4
        assert all(32 <= length < LENGTH for heads in record.head_lengths for length in heads)
        after = [m.self_attn.masked_key_indices for m in model.model.layers]
        assert all(len(later[0]) > len(first[0]) for first, later in zip(masks, after, strict=True))


def native_cache(model, press, ids: torch.Tensor) -> DynamicCache:
    """The cache kvpress's own hooks leave after a prefill of ``ids`` (as its pipeline runs it: no positions)."""
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model.model(input_ids=ids, past_key_values=cache)
    return cache


def same_caches(ours: DynamicCache, theirs: DynamicCache) -> bool:
    pairs = zip(ours.layers, theirs.layers, strict=True)
    return all(
        a.keys.shape == b.keys.shape
        and torch.allclose(a.keys, b.keys, atol=1e-5)
        and torch.allclose(a.values, b.values)
        for a, b in pairs
    )


def kvpress_press(kvpress, press: str):
    ratio = compression_ratio(BUDGET, LENGTH)
    if press == "KVComposePress":
        return kvpress.KVComposePress(compression_ratio=ratio)
    if press == "ComposedPress":
        first, last = composed_ratios(2, BUDGET, LENGTH)
        members = [kvpress.SnapKVPress(compression_ratio=first, window_size=16), kvpress.KnormPress(last)]
        return kvpress.ComposedPress([*members, kvpress.ThinKPress(0.25, window_size=16)])
    if press == "PerLayerCompressionPress":
        return kvpress.PerLayerCompressionPress(press=kvpress.KnormPress(), compression_ratios=RATIOS)
    if press == "DMSPress":
        return kvpress.DMSPress(press=kvpress.KnormPress(), threshold=-6.0, sliding_window_size=32)
    return getattr(kvpress, press)(**KNOBS[press])


@pytest.mark.parametrize("press", sorted(set(KNOBS) - {"FinchPress"}))
def test_each_press_keeps_what_kvpress_keeps(model, press: str) -> None:
    kvpress = pytest.importorskip("kvpress")
    knobs = {**KNOBS[press], "decoding": None} if press == "DMSPress" else KNOBS[press]
    _, cache, _, masks = run(model, KVPressPolicy(press=press, **knobs), steps=0)
    theirs = native_cache(model, kvpress_press(kvpress, press), prompt())
    assert same_caches(cache, theirs)
    if press == "DMSPress":
        native = [m.self_attn.__dict__.pop("masked_key_indices") for m in model.model.layers]
        assert all(
            torch.equal(a, b)
            for ours, theirs in zip(masks, native, strict=True)
            for a, b in zip(ours, theirs, strict=True)
        )


def test_finch_keeps_what_kvpress_keeps_behind_its_delimiter(model) -> None:
    """kvpress's pipeline: the delimiter token added (a new embedding row), context + delimiter + question prefilled,
    the answer at the kept length. Ours: the question's length said, the answer at the prompt's end position."""
    kvpress = pytest.importorskip("kvpress")
    theirs_model, vocab = copy.deepcopy(model), model.config.vocab_size
    theirs_model.resize_token_embeddings(vocab + 1)
    press = kvpress.FinchPress(compression_ratio=compression_ratio(BUDGET, LENGTH))
    press.delimiter_token_id = vocab  # what update_model_and_tokenizer sets, without a tokenizer
    ids = prompt()
    delimited = torch.cat([ids[:, :-QUESTION], torch.tensor([[vocab]]), ids[:, -QUESTION:]], dim=1)
    theirs = native_cache(theirs_model, press, delimited)
    assert press.window_size == QUESTION
    policy, cache, token = KVPressPolicy(press="FinchPress"), DynamicCache(config=model.config), torch.tensor([[7]])
    with press_hooks(model, policy, Budget(BUDGET)), torch.no_grad(), question_in_prefill(QUESTION):
        model(input_ids=ids, cache=cache, position_ids=torch.arange(LENGTH)[None])
        assert same_caches(cache, theirs)
        ours = model(input_ids=token, cache=cache, position_ids=torch.tensor([[LENGTH]])).logits  # moved to kept
    with torch.no_grad():
        at = torch.tensor([[theirs.get_seq_length()]])  # kvpress's pipeline goes on at the kept length
        native_logits = theirs_model(input_ids=token, past_key_values=theirs, position_ids=at).logits
    assert torch.allclose(ours, native_logits[..., :vocab], atol=1e-4)


def test_the_runner_records_what_drove_the_press(model, tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir

    from restkv.eval.harness.runner import RunSettings, run_benchmark
    from restkv.eval.run import CONFIGS

    overrides = ["model=micro-llama", "bench=micro", "bench.lengths=[512]", "bench.samples=1", "bench.tasks=[passkey]"]
    cases = [
        ("FinchPress", []),
        ("ComposedPress", ["policy.presses=[SnapKVPress,KnormPress]", "policy.window_size=16"]),
        ("ThinKPress", ["policy.key_channel_compression_ratio=0.25"]),
    ]
    for press, extra in cases:
        given = [*overrides, "policy=kvpress", f"policy.press={press}", "budget=128", "protocol=query_aware", *extra]
        with initialize_config_dir(config_dir=CONFIGS, version_base=None):
            cfg = compose(config_name="config", overrides=[*given, f"out_dir={tmp_path / press}"])
        metrics = run_benchmark(cfg, RunSettings("micro", "micro-llama", "kvpress", given, tmp_path / press))
        assert metrics["cache"]["kvpress_route"] == "kvpress_hooks"
        record = json.loads(next((tmp_path / press).rglob("predictions.jsonl")).read_text().splitlines()[0])
        if press != "ThinKPress":
            assert metrics["cache"]["kvpress_driven_by"] == ["budget"] and record["kept_tokens"] == 128
        else:
            assert metrics["cache"]["kvpress_driven_by"][0].startswith("key_channel_compression_ratio=0.25 (not the")
            assert record["kept_tokens"] == record["context_length"]


def test_composed_ratios_leave_exactly_the_budget() -> None:
    for evicting, keep, length in [(1, 100, 200), (2, 100, 200), (3, 37, 501), (2, 1, 9)]:
        reaching = length
        for ratio in composed_ratios(evicting, keep, length):
            reaching = kvpress_kept(reaching, ratio)
        assert reaching == keep


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"press": "KVComposePress", "structured": False}, "leaves the second copy of the prompt"),
        ({"press": "DMSPress", "inner": "KnormPress"}, "below policy.threshold: set it"),
        ({"press": "PerLayerCompressionPress", "inner": "KnormPress"}, "needs one ratio in \\[0, 1\\) per layer"),
        ({"press": "PerLayerCompressionPress", "inner": "KnormPress", "compression_ratios": [1.0]}, "per layer"),
        ({"press": "ComposedPress"}, "needs a list of presses"),
        ({"press": "ComposedPress", "presses": ["ThinKPress"]}, "at least one of them a scorer press"),
        ({"press": "ComposedPress", "presses": ["ObservedAttentionPress"]}, "needs a list of presses"),
        ({"press": "ComposedPress", "presses": ["KnormPress"], "window_size": 8}, "none of them takes window_size"),
        ({"press": "SnapKVPress", "presses": ["KnormPress"]}, "does not take presses"),
        ({"press": "ThinKPress", "compression_ratios": [0.5]}, "does not take compression_ratios"),
    ],
)
def test_settings_these_presses_cannot_run_with_are_refused(knobs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KVPressPolicy(**knobs)


def test_finch_without_the_question_in_the_prefill_is_refused(model) -> None:
    policy = KVPressPolicy(press="FinchPress")
    with press_hooks(model, policy, Budget(BUDGET)), pytest.raises(ValueError, match="protocol=query_aware"):
        model(input_ids=prompt(), cache=DynamicCache(config=model.config))
    with press_hooks(model, policy, Budget(BUDGET)), question_in_prefill(BUDGET), pytest.raises(ValueError) as error:
        model(input_ids=prompt(), cache=DynamicCache(config=model.config))
    assert "give a budget above the question's length" in str(error.value)


def test_finch_under_the_query_agnostic_protocol_is_refused_before_the_run() -> None:
    from restkv.eval.harness.validate import check_combinations

    values = {"policy": {"press": "FinchPress"}, "protocol": "query_agnostic", "compression": {"phase": "prefill"}}
    with pytest.raises(ValueError, match=r"policy\.press=FinchPress with protocol=query_agnostic is not allowed"):
        check_combinations(values)
    check_combinations({**values, "protocol": "query_aware"})


def test_per_layer_ratios_for_another_number_of_layers_are_refused(model) -> None:
    policy = KVPressPolicy(press="PerLayerCompressionPress", inner="KnormPress", compression_ratios=[0.5, 0.5])
    with press_hooks(model, policy, Budget(BUDGET)), torch.no_grad(), pytest.raises(ValueError) as error:
        model(input_ids=prompt(), cache=DynamicCache(config=model.config))
    assert "has 2 ratios; the model has 4 layers: give one per layer" in str(error.value)


@pytest.mark.parametrize("press", ["KVComposePress", "SimLayerKVPress", "PerLayerCompressionPress"])
def test_a_question_after_layers_of_different_lengths_reads_each_layers_cache(model, press: str) -> None:
    """These presses leave layers of different lengths (kvpress runs them under flash attention only); under our
    integration a question appended in one call (``protocol=query_agnostic``) gets what token-by-token calls get."""
    policy, cache = KVPressPolicy(press=press, **KNOBS[press]), DynamicCache(config=model.config)
    question = torch.randint(3, 8000, (1, 10), generator=torch.Generator().manual_seed(1))
    with press_hooks(model, policy, Budget(BUDGET)), compress(model, policy, budget=BUDGET), torch.no_grad():
        model(input_ids=prompt(), cache=cache, position_ids=torch.arange(LENGTH)[None])
        assert len({layer.keys.shape[2] for layer in cache.layers}) > 1
        apart = copy.deepcopy(cache)
        at = torch.arange(LENGTH, LENGTH + 10)[None]
        whole = model(input_ids=question, cache=cache, position_ids=at).logits
        steps = [
            model(input_ids=question[:, i : i + 1], cache=apart, position_ids=at[:, i : i + 1]).logits
            for i in range(10)
        ]
    assert torch.allclose(whole, torch.cat(steps, dim=1), atol=1e-4)
