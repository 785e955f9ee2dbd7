"""The rules that make the rivals decide as their authors' code decides, each on a case small enough to read:
Layer-DefensiveKV's window competing in one ranking of every layer, DefensiveKV's fractional budget counted per
layer, R-KV's newest-copy rule, its cache left in score order and its authors' cut timing.

The recorded cases of the authors' own code are replayed in `tests/test_rival_golden.py`."""

from __future__ import annotations

import pytest
import torch

from restkv import get_policy
from restkv.baselines import RKV, DefensiveKV
from restkv.baselines.rkv import rkv_redundancy
from restkv.decoding.eviction import DecodeEviction, DecodeEvictor
from restkv.policy import LayerInputs
from restkv.select import Budget
from restkv.stages.allocation import shared_past_tokens, window_ranked_selection

HEADS, KV_HEADS, DIM = 4, 2, 8


def inputs(length: int, seed: int) -> LayerInputs:
    generator = torch.Generator().manual_seed(seed)
    queries = torch.randn(1, HEADS, length, DIM, generator=generator) * 2
    keys = torch.randn(1, KV_HEADS, length, DIM, generator=generator)
    values = torch.randn(1, KV_HEADS, length, DIM, generator=generator)
    weight = torch.randn(16, HEADS * DIM, generator=generator)
    return LayerInputs(queries, keys, values, 0, 1, output_weight=lambda: weight)


def test_a_layer_can_lose_its_window_in_the_authors_global_ranking() -> None:
    # two layers, window 2: layer 0's scores dwarf layer 1's, so layer 1's window (ranked at its own top, 0.3) loses
    layer0 = torch.tensor([[9.0, 8.0, 7.0], [6.0, 5.0, 4.0]])
    layer1 = torch.tensor([[0.1, 0.3, 0.2], [0.05, 0.02, 0.01]])
    first, second = window_ranked_selection([layer0, layer1], window=2, total=12)
    # layer 0's padded row: [9 8 7 9 9 | 6 5 4 9 9]: all ten win; layer 1 gets the two best of its [0.1 .3 .2 .3 .3 ...]
    assert first.lengths.tolist() == [5, 5]
    assert second.total == 2
    kept = second.per_head()
    assert set(kept[0].tolist()) <= {1, 3, 4} and set(kept[1].tolist()) <= {3, 4}  # two of the ties at 0.3
    assert sum(int((head >= 3).sum()) for head in kept) <= 2  # at most two of layer 1's four window slots kept


def test_layer_defensivekv_is_the_authors_selection_and_global_keeps_every_window() -> None:
    layers = [inputs(120, seed) for seed in range(3)]
    for index, layer in enumerate(layers):
        layer.layer, layer.num_layers = index, 3
        layer.keys.mul_(1 + 3 * index)  # layers that differ
    authors = get_policy("layer_defensivekv", window=8).select_layers(layers, Budget(24))
    kept_window = get_policy("layer_defensivekv", window=8, allocation="global").select_layers(layers, Budget(24))
    assert sum(s.total for s in authors) == sum(s.total for s in kept_window) == 3 * KV_HEADS * 24
    for selection in kept_window:
        for head in selection.per_head():
            assert set(range(112, 120)) <= set(head.tolist())  # 'global': every window kept
    assert [s.lengths.tolist() for s in authors] != [s.lengths.tolist() for s in kept_window]


def test_defensivekv_counts_a_fraction_per_layer_as_its_authors() -> None:
    layer = inputs(301, 0)
    selection = DefensiveKV(window=8).select(layer, Budget(0.3))
    assert selection.total == int(301 * 0.3 * KV_HEADS) == 180  # round(0.3 * 301) = 90 per head would give 180 too
    odd = inputs(303, 1)
    selection = DefensiveKV(window=8).select(odd, Budget(0.3))
    assert selection.total == int(303 * 0.3 * KV_HEADS) == 181  # per head: 2 x round(90.9) = 182
    assert shared_past_tokens(303, 0.3, KV_HEADS, 8) == 181 - 16
    assert DefensiveKV(window=8).select(odd, Budget(91)).total == 2 * 91  # a token budget: per head, as before


def test_the_newest_copy_of_a_repeated_key_is_the_least_redundant() -> None:
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(1, 1, 40, DIM, generator=generator)
    keys[0, 0, 20] = keys[0, 0, 30] = keys[0, 0, 5]  # three copies: 5, 20, 30
    with_rule = rkv_redundancy(keys, window=4, threshold=0.5)[0, 0]
    without_rule = rkv_redundancy(keys, window=4, threshold=1.0)[0, 0]  # no similarity passes: the rule is off
    assert without_rule[5] == without_rule[30]  # equal keys, equal redundancy when nothing is excluded
    assert with_rule[30] < with_rule[5]  # the newest copy is spared its older twins' similarity
    layer = LayerInputs(torch.randn(1, 1, 40, DIM), keys, keys, 0, 1)
    ranked = RKV(window=4, mix_lambda=0.0).score(layer, 20)[0, 0]  # redundancy alone decides
    assert ranked[30] > ranked[5]  # the newest copy is kept before the oldest
    off = RKV(window=4, mix_lambda=0.0, threshold=1.0).score(layer, 20)[0, 0]
    assert off[30] == off[5]  # with the rule off nothing tells them apart


def test_rkv_leaves_its_cache_in_score_order_and_position_order_sorts_it() -> None:
    layer = inputs(80, 3)
    by_score = RKV().select(layer, Budget(32))
    by_position = RKV(cache_order="position").select(layer, Budget(32))
    assert torch.equal(by_score.sort(dim=-1).values, by_position)  # the same tokens
    past = by_score[..., :-8]
    scores = RKV().score(layer, 32)
    assert torch.equal(scores.gather(-1, past), scores.gather(-1, past).sort(dim=-1, descending=True).values)
    assert by_score[0, 0, -8:].tolist() == list(range(72, 80))  # then the window, in order
    exact = RKV().select(inputs(32, 4), Budget(32))  # a cache holding exactly the budget is still re-ranked
    assert exact is not None and sorted(exact[0, 0].tolist()) == list(range(32))
    assert RKV(cache_order="position").select(inputs(32, 4), Budget(32)) is None
    with pytest.raises(ValueError, match="cache_order"):
        RKV(cache_order="random")


def cut_steps(schedule: str, prompt: int, steps: int, budget: int, interval: int) -> list[int]:
    """The decoding steps at which a layer is cut, from the evictor alone (a stand-in policy keeps the last tokens)."""

    class Last:
        window = 2

        def select(self, layer_inputs: LayerInputs, budget: Budget) -> torch.Tensor:
            return torch.arange(layer_inputs.length - budget.value, layer_inputs.length).view(1, 1, -1)

    evictor = DecodeEvictor(DecodeEviction(budget, interval, "both", schedule), window=2)
    evictor.start()
    evictor.observe(0, torch.zeros(1, 1, 2, 1))
    evictor.after_prefill(0, torch.arange(prompt - budget, prompt).view(1, 1, -1), prompt, 1, "cpu")
    length, cuts = budget, []
    for step in range(1, steps + 1):
        length += 1
        make = lambda q, n=length: LayerInputs(q, torch.zeros(1, 1, n, 1), torch.zeros(1, 1, n, 1), 0, 1)  # noqa: E731
        if evictor.step(0, length, make, Last()) is not None:
            cuts.append(step)
            length = budget
        evictor.end_step([length])
    return cuts


def test_the_authors_cut_on_the_step_after_the_sequence_reaches_a_multiple_of_128() -> None:
    # a 600-token prompt: the sequence holds 640, 768, 896 tokens after steps 40, 168, 296; the cut comes next
    assert cut_steps("length", prompt=600, steps=300, budget=128, interval=128) == [41, 169, 297]
    assert cut_steps("interval", prompt=600, steps=100, budget=128, interval=32) == [32, 64, 96]
    with pytest.raises(ValueError, match="cut_schedule"):
        DecodeEviction(64, 32, "both", "every")


def test_the_rkv_authors_preset_runs_their_loop_over_their_budgets() -> None:
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from restkv.eval.evaluation import Generate
    from restkv.eval.harness.decode_plan import plan_decode
    from restkv.eval.harness.settings import Settings
    from restkv.eval.run import CONFIGS
    from restkv.storage.quantize import Quantization

    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=["experiment=rivals/rkv_authors"], return_hydra_config=True)
    assert cfg.hydra.sweeper.params["compression.decode_budget"] == "128,256,512,1024,1536,2048"
    assert cfg.model.path == "deepseek-ai/DeepSeek-R1-Distill-Llama-8B" and cfg.hydra.runtime.choices.bench == "math"
    plain = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    policy = instantiate(cfg.policy, _convert_="all")
    assert (policy.window, policy.kernel, policy.mix_lambda, policy.cache_order) == (8, 7, 0.07, "score")
    run = Settings.of(OmegaConf.to_container(plain, resolve=True))
    eviction = plan_decode(run, torch.device("cpu"), Generate(), Quantization(), policy).eviction
    assert eviction == DecodeEviction(128, 128, "both", "length") and plain.budget == 128


def test_a_layer_that_keeps_nothing_still_decodes_in_every_layout(monkeypatch) -> None:
    """The authors' global ranking can leave a layer empty: each decoded token then attends to itself there."""
    from transformers import AutoModelForCausalLM

    import restkv.stages.allocation as allocation
    from restkv import compress
    from restkv.stages.allocation import HeadSelection

    ranked = allocation.window_ranked_selection

    def second_layer_emptied(scores, window, total):
        selections = ranked(scores, window, total)
        empty = torch.zeros(selections[1].heads, dtype=torch.long)
        selections[1] = HeadSelection(torch.zeros(0, dtype=torch.long), empty)
        return selections

    monkeypatch.setattr(allocation, "window_ranked_selection", second_layer_emptied)
    model = AutoModelForCausalLM.from_pretrained("models/micro-llama").eval()
    ids = torch.randint(10, 8000, (1, 300), generator=torch.Generator().manual_seed(0))
    answers = []
    for layout in ("auto", "varlen", "masked"):
        with compress(model, get_policy("layer_defensivekv", window=8), budget=40, layout=layout) as compressor:
            answers.append(model.generate(ids, max_new_tokens=4, do_sample=False)[0, -4:].tolist())
        assert sum(compressor.record.head_lengths[1]) == 0
    assert answers[0] == answers[1] == answers[2]


def test_fractions_are_the_authors_floats_and_per_head_counting_stays_a_knob() -> None:
    from restkv.rankings import kept_share

    assert kept_share(0.2) == 1 - 0.8 == 0.19999999999999996  # their 1 - compression_ratio, for a compression of 0.8
    length = next(n for n in range(100, 400) if int(n * kept_share(0.2) * 2) != int(n * 0.2 * 2))
    assert shared_past_tokens(length, 0.2, 2, 0) == int(length * (1 - 0.8) * 2)
    layer = inputs(303, 1)
    assert DefensiveKV(window=8, fraction_count="head").select(layer, Budget(0.3)).total == 2 * round(0.3 * 303)
    with pytest.raises(ValueError, match="fraction_count"):
        DefensiveKV(fraction_count="model")


def test_a_pyramid_gives_each_layer_its_own_keep_whatever_the_fraction_count() -> None:
    policy = DefensiveKV(window=8, schedule="pyramid")
    assert not policy.stages.allocation.fraction_per_layer
    first, last = inputs(400, 2), inputs(400, 3)
    first.num_layers = last.num_layers = 8
    last.layer = 7
    keeps = [policy.layer_keep(400, Budget(0.3), layer.layer, 8) for layer in (first, last)]
    totals = [policy.select(layer, Budget(0.3)).total for layer in (first, last)]
    assert keeps[0] != keeps[1] and totals == [2 * keep for keep in keeps]


def test_a_folder_written_before_the_decode_schedule_resumes() -> None:
    import copy

    from restkv.eval.harness.identity import with_added_defaults
    from restkv.eval.harness.runner import added_defaults

    compression = {
        "phase": "prefill",
        "decode_budget": None,
        "decode_interval": 32,
        "decode_schedule": "interval",
        "prefill_chunk": None,
    }
    identity = {"config": {"policy": {"window": 32}, "compression": compression}, "inputs": {}}
    older = copy.deepcopy(identity)
    del older["config"]["compression"]["decode_schedule"]
    oldest = copy.deepcopy(identity)
    del oldest["config"]["compression"]
    for saved in (older, oldest):
        assert with_added_defaults(saved, identity, added_defaults("snapkv", identity)) == identity
    length = copy.deepcopy(identity)
    length["config"]["compression"]["decode_schedule"] = "length"  # a setting that acts is never filled in
    assert with_added_defaults(older, length, added_defaults("snapkv", length)) != length


def test_the_authors_timing_runs_through_the_model_and_counts_the_question() -> None:
    """Through the real integration: the cuts fall on the steps the sequence's length says, the question included."""
    from transformers import AutoModelForCausalLM

    from restkv import compress

    model = AutoModelForCausalLM.from_pretrained("models/micro-llama").eval()
    ids = torch.randint(10, 8000, (1, 203), generator=torch.Generator().manual_seed(1))
    eviction = DecodeEviction(64, 16, "both", "length")
    with compress(model, RKV(), budget=64, decode_eviction=eviction) as compressor:
        model.generate(ids, max_new_tokens=40, min_new_tokens=40, do_sample=False)
    steps = [entry["step"] for entry in compressor.decoder.sizes]
    assert steps == [k for k in range(1, 40) if (203 + k - 1) % 16 == 0] == [6, 22, 38]
