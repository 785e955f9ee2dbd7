"""The micro suite: prompts fitted to the budget, every answer item findable from its cue, determinism."""

from __future__ import annotations

import re

import pytest
from _tokenizer import tokenizer_fixture  # noqa: F401
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from restkv.eval.benchmarks import micro
from restkv.eval.benchmarks.contract.base import Sample
from restkv.eval.benchmarks.ruler.metrics import ruler_string_match_all
from restkv.eval.run import CONFIGS

ESSAY_TASKS = {t for t, c in micro.TASK_CONFIGS.items() if c.haystack == "essay"}


def prompt(sample: Sample) -> str:
    return sample.context + sample.question + sample.answer_prefix


def count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("length", [512, 2048])
@pytest.mark.parametrize("task", micro.TASKS)
def test_prompts_fill_the_budget(tokenizer, task: str, length: int) -> None:
    samples = micro.generate(task, tokenizer, length, 2, seed=1)
    budget = length - micro.max_new_tokens(task)
    tolerance = 8 if task in ESSAY_TASKS else 60  # words vs. whole lines
    for sample in samples:
        tokens = count(tokenizer, prompt(sample))
        assert tokens == sample.meta["prompt_tokens"]
        assert budget - tolerance <= tokens <= budget
        assert sample.metric == "string_match_all" and not sample.chat_template
        assert sample.meta["context_length"] == length and sample.meta["benchmark"] == "micro"


def _cue_value_pairs(sample: Sample) -> dict[str, list[str]]:
    """Every ``cue value`` pair of the context (the needle lines), cue -> values."""
    pairs: dict[str, list[str]] = {}
    for cue, value in re.findall(r"([\w-]+(?: #\d)?) (\d{7})\.", sample.context):
        pairs.setdefault(cue, []).append(value)
    return pairs


@pytest.mark.parametrize("task", [t for t in micro.TASKS if micro.TASK_CONFIGS[t].kind in ("single", "multivalue")])
def test_each_value_follows_its_cue_once(tokenizer, task: str) -> None:
    for sample in micro.generate(task, tokenizer, 1024, 4, seed=2):
        pairs = _cue_value_pairs(sample)
        cues = sample.meta["cues"]
        assert sample.answer_prefix.endswith(cues[0])
        for cue, value in zip(cues, sample.references, strict=True):
            assert pairs[cue] == [value]
        if task == "micro_multikey_2":  # a haystack of needles: many other keys, none asked
            assert len(pairs) > 20
        if task == "micro_multikey_1":
            assert len(pairs) == 4


def test_multiquery_asks_four_keys_in_a_numbered_order(tokenizer) -> None:
    for sample in micro.generate("micro_multiquery", tokenizer, 1024, 4, seed=3):
        cues = sample.meta["cues"]
        assert [c.split(" ")[0] for c in cues] == ["#1", "#2", "#3", "#4"]
        assert all(cue in sample.question for cue in cues)
        pairs = _cue_value_pairs(sample)
        assert [pairs[k] for k in sample.meta["keys"]] == [[v] for v in sample.references]
        assert sample.answer_prefix.endswith(cues[0])


def test_vt_chain_leads_from_the_value_through_every_name(tokenizer) -> None:
    for sample in micro.generate("micro_vt", tokenizer, 1024, 4, seed=4):
        links = dict(re.findall(r"^VAR (\w+) (\w+)\.$", sample.context, flags=re.MULTILINE))
        (start,) = sample.meta["keys"]
        walked, node = [], start
        while node in links:
            node = links[node]
            walked.append(node)
        assert walked == sample.references and len(walked) == micro.VT_HOPS + 1
        assert sample.answer_prefix.endswith(f" {start}")
        # lines are shuffled: the context order alone does not give the answer in every sample
    orders = []
    for sample in micro.generate("micro_vt", tokenizer, 1024, 8, seed=5):
        names = re.findall(r"^VAR \w+ (\w+)\.$", sample.context, flags=re.MULTILINE)
        orders.append(names == sample.references)
    assert not all(orders)


@pytest.mark.parametrize("task", micro.TASKS)
def test_trained_answer_scores_one_and_a_single_wrong_value_does_not(tokenizer, task: str) -> None:
    (sample,) = micro.generate(task, tokenizer, 1024, 1, seed=6)
    answer = micro.trained_answer(sample)
    assert ruler_string_match_all(answer, sample.references) == 1.0
    broken = answer.replace(sample.references[-1], "0000000")
    assert ruler_string_match_all(broken, sample.references) < 1.0


def test_deterministic_and_seed_sensitive(tokenizer) -> None:
    for task in micro.TASKS:
        a = micro.generate(task, tokenizer, 1024, 2, seed=7)
        b = micro.generate(task, tokenizer, 1024, 2, seed=7)
        c = micro.generate(task, tokenizer, 1024, 2, seed=8)
        assert [prompt(s) for s in a] == [prompt(s) for s in b]
        assert [prompt(s) for s in a] != [prompt(s) for s in c]
        assert prompt(a[0]) != prompt(a[1])


def test_passkey_is_the_training_scripts_prompt(tokenizer) -> None:
    """The passkey prompt moved into the suite: the text is what the shipped models were trained on."""
    sample = micro.passkey_sample(tokenizer, 1024, 1_000_123, 0)
    key = sample.references[0]
    assert re.fullmatch(r"\d{5}", key)
    assert sample.context.count(micro.PASSKEY_NEEDLE.format(key=key)) == 1
    assert sample.context.startswith(micro.PASSKEY_PREAMBLE)
    assert sample.question == micro.PASSKEY_QUESTION and sample.answer_prefix == micro.PASSKEY_ANSWER_PREFIX


def test_essay_comes_from_the_given_haystack(tokenizer, tmp_path) -> None:
    path = tmp_path / "essay.txt"
    path.write_text("Zyzzyva ran far. " * 400)
    (sample,) = micro.generate("micro_single_2", tokenizer, 512, 1, seed=0, haystack=path)
    assert "Zyzzyva ran far." in sample.context
    assert micro.generate("micro_single_2", tokenizer, 512, 1, seed=0)[0].context != sample.context


def test_errors_name_the_value(tokenizer) -> None:
    with pytest.raises(ValueError, match="unknown micro task 'niah_single_1'; valid tasks: micro_single_1"):
        micro.generate("niah_single_1", tokenizer, 1024, 1, seed=0)
    with pytest.raises(ValueError, match="micro_vt cannot fit in context_length=100"):
        micro.generate("micro_vt", tokenizer, 100, 1, seed=0)
    with pytest.raises(ValueError, match=r"bench\.samples=0"):
        micro.MicroBenchmark(samples=0)


def test_bench_config_builds_the_whole_suite(tokenizer) -> None:
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=["bench=micro", "bench.lengths=[600]", "bench.samples=1"])
    bench = instantiate(cfg.bench)
    samples = bench.load_samples(tokenizer)
    assert [s.task for s in samples] == list(micro.TASKS)
    records = [{"task": s.task, "score": 1.0, "meta": s.meta} for s in samples]
    assert bench.report(records, None) == {"lengths": {"600": 100.0}}


def test_fidelity_can_take_the_micro_suite_as_its_source() -> None:
    overrides = ["bench=fidelity", "bench@bench.source=micro", "bench.source.tasks=[micro_vt]"]
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
        default = compose(config_name="config", overrides=["bench=fidelity"])
    bench = instantiate(cfg.bench)
    assert isinstance(bench.source, micro.MicroBenchmark) and bench.source.tasks == ["micro_vt"]
    assert bench.source.lengths == [1024] and bench.source.seed == 1  # fidelity's own source settings
    assert instantiate(default.bench).source.name == "ruler"


def test_the_micro_needle_grid_places_its_needle_at_each_depth(tokenizer) -> None:
    from restkv.eval.benchmarks.micro.niah import MicroNiahBenchmark

    bench = MicroNiahBenchmark(lengths=[512, 1024], depths=[0, 50, 100], samples=2)
    samples = bench.load_samples(tokenizer)
    assert len(samples) == 2 * 3 * 2 and len({s.id for s in samples}) == len(samples)
    for sample in samples:
        assert sample.task == "micro_single_2" and count(tokenizer, prompt(sample)) <= sample.meta["context_length"]
        needle = f"{sample.meta['keys'][0]} {sample.references[0]}."
        at = sample.context.index(needle) / len(sample.context)
        assert abs(at - sample.meta["depth_percent"] / 100) < 0.1, (sample.id, at)
    again = MicroNiahBenchmark(lengths=[512, 1024], depths=[0, 50, 100], samples=2).load_samples(tokenizer)
    assert [s.context for s in again] == [s.context for s in samples]


def test_the_micro_needle_grid_names_bad_settings(tokenizer) -> None:
    from restkv.eval.benchmarks.micro.niah import MicroNiahBenchmark

    with pytest.raises(ValueError, match=r"bench.depths has 150"):
        MicroNiahBenchmark(depths=[0, 150])
    with pytest.raises(ValueError, match="one-needle essay task"):
        micro.sample("micro_multikey_1", tokenizer, 512, 0, depth=50.0)
    with pytest.raises(ValueError, match="one-needle essay task"):
        micro.sample("passkey", tokenizer, 512, 0, depth=50.0)
