"""Every paper preset runs the ReST-KV authors' protocol, setting by setting (docs/authors_protocol.md).

Each preset of ``configs/experiment`` is composed as its sweep runs it, once per combination of its
``hydra.sweeper.params``, and every setting of the table is asserted on the composed config and on
what it builds (the policy, the benchmark, the prompt's form): a preset, a policy default or a
benchmark table that drifts from the authors' scripts fails here. Nothing loads a model.

The expected values are the authors' (an-yongqi/rest-kv: ``scripts/*/run_*.sh`` over the argparse
defaults of ``run_longbench.py``, ``run_ruler.py``, ``run_needle_in_haystack.py`` and
``run_infinite_bench.py``), written as our knobs; the doc cites the file and line of each.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from restkv import ReSTKV
from restkv.baselines import H2O, FullCache, PyramidKV, RandomEviction, SnapKV, StreamingLLM
from restkv.eval.benchmarks import infinitebench, longbench, niah
from restkv.eval.evaluation.prompting import tokenize
from restkv.eval.harness.runner import RunSettings, plan_run
from restkv.eval.models.spec import ModelSpec, check_attention_backend
from restkv.eval.run import CONFIGS

MICRO_PAPER = "paper_micro"
"""Not the authors' protocol: the micro model's stand-in for every artifact (tested at the end of this file)."""
PRESETS = sorted(
    p.stem
    for p in (Path(CONFIGS) / "experiment").glob("*.yaml")
    if p.stem != MICRO_PAPER
    and not p.stem.startswith("kvpress_")  # kvpress's protocol: tests/test_kvpress_leaderboard.py
)
FIXTURES = Path(__file__).parent / "fixtures"

# --------------------------------------------------------------------------------------------------
# The authors' settings, as our knobs
# --------------------------------------------------------------------------------------------------

# Their model2maxlen (the prompt length cut in the middle) for the hub ids their scripts name.
AUTHORS_MODELS = {
    "llama-3.1-8b-instruct": ("meta-llama/Llama-3.1-8B-Instruct", 127000),
    "llama-2-7b-chat": ("meta-llama/Llama-2-7b-chat-hf", 3950),
    "mistral-7b-instruct-v0.3": ("mistralai/Mistral-7B-Instruct-v0.3", 31500),
    "qwen2.5-7b-instruct": ("Qwen/Qwen2.5-7B-Instruct", 127000),
    "gemma-7b-it": ("google/gemma-7b-it", 7950),
}

# Every evicting policy: window 32 (--window_size 32 / the needle script's 32), one selection per query
# head over repeated keys/values (repeat_kv before update_kv in every patched attention forward).
SHARED_KNOBS = {"window": 32, "gqa": "expand"}
# --use_wo --use_ema --alpha 0.3 --metric_mode after --pooling adaptive --scale 2000, kernel_sizes 5 (default)
RESTKV = {
    "indicator": "reconstruction",
    "use_wo": True,
    "temporal": "ema",
    "alpha": 0.3,
    "order": "after",
    "tau": 1.0,
    "normalize": False,
    "spatial": "adaptive",
    "scale": 2000.0,
    "kernel": 5,
    "schedule": "uniform",
}
# SnapKVCluster: window attention summed over its queries, avg_pool1d kernel 5 (defaults)
SNAPKV = {"indicator": "attention", "temporal": "sum", "spatial": "avgpool", "kernel": 5, "schedule": "uniform"}
AUTHORS_POLICIES: dict[str, tuple[type, dict[str, Any]]] = {
    "full": (FullCache, {}),
    # their window = budget - 4 and prefix budget - window: the first 4 tokens plus the last budget - 4
    "streamingllm": (StreamingLLM, {"variant": "sinks", "sinks": 4}),
    # the needle script's window 32: the first budget - 32 tokens plus the last 32
    "streamingllm_niah": (StreamingLLM, {"variant": "prefix"}),
    "h2o": (H2O, {"schedule": "uniform"}),
    "snapkv": (SnapKV, SNAPKV),
    "pyramidkv": (PyramidKV, {**SNAPKV, "schedule": "pyramid", "beta": 20.0}),
    "restkv": (ReSTKV, RESTKV),
    "restkv_ruler": (ReSTKV, {**RESTKV, "kernel": 21}),  # --kernel_sizes 21
    "random": (RandomEviction, {}),
    # ablation_indicator.sh rows (AblationCluster: EMA alpha 0.3, W_o, tau 1, kernel 5, scale 2000 fixed)
    "ablation/attn_v": (ReSTKV, {"indicator": "attention_value", "temporal": "sum", "spatial": "avgpool", "kernel": 5}),
    "ablation/recon_last": (ReSTKV, {**RESTKV, "temporal": "last", "spatial": "none"}),
    "ablation/recon_mean": (ReSTKV, {**RESTKV, "temporal": "mean", "spatial": "none"}),
    "ablation/recon_inv_ema": (ReSTKV, {**RESTKV, "temporal": "inv_ema", "spatial": "none"}),
    "ablation/recon_ema": (ReSTKV, {**RESTKV, "spatial": "none"}),
    "ablation/recon_ema_avgpool": (ReSTKV, {**RESTKV, "spatial": "avgpool"}),
    "ablation/recon_ema_maxpool": (ReSTKV, {**RESTKV, "spatial": "maxpool"}),
}

# run_longbench.py `datasets` and `dataset2maxlen`
LONGBENCH_TASKS = {
    "narrativeqa": 128,
    "qasper": 128,
    "multifieldqa_en": 64,
    "hotpotqa": 32,
    "2wikimqa": 32,
    "musique": 32,
    "gov_report": 512,
    "qmsum": 512,
    "multi_news": 512,
    "trec": 64,
    "triviaqa": 32,
    "samsum": 128,
    "passage_count": 32,
    "passage_retrieval_en": 32,
    "lcc": 64,
    "repobench-p": 64,
}
# run_infinite_bench.py `datasets` and `dataset2maxlen`
INFINITEBENCH_TASKS = {
    "code_debug": 5,
    "code_run": 5,
    "kv_retrieval": 80,
    "longbook_choice_eng": 40,
    "longbook_qa_chn": 40,
    "longbook_qa_eng": 40,
    "longbook_sum_eng": 1200,
    "longdialogue_qa_eng": 40,
    "math_calc": 30000,
    "math_find": 3,
    "number_string": 20,
    "passkey": 15,
}
# run_ruler.py `datasets` (no qa_1 / qa_2) and `dataset2maxlen` (64 for every task)
RULER_TASKS = [
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multiquery",
    "niah_multivalue",
    "cwe",
    "fwe",
    "vt",
]
RULER_NEW_TOKENS = 64


@dataclass
class Preset:
    """What one preset must sweep: model, benchmark, policies, budgets, and a swept knob if any."""

    model: str
    bench: str
    policies: list[str]
    budgets: list[int]
    knob: tuple[str, list[float]] | None = None
    bench_settings: dict[str, Any] = field(default_factory=dict)


LONGBENCH = {"tasks": ["en"], "chat_template": "authors", "samples": None, "max_new_tokens_cap": None}
LONGBENCH_POLICIES = ["full", "streamingllm", "h2o", "snapkv", "restkv"]
FIGURE_BUDGETS = [64, 128, 256, 512, 1024]
LLAMA31 = "llama-3.1-8b-instruct"
ABLATION_ROWS = [
    "attn_v",
    "recon_last",
    "recon_mean",
    "recon_inv_ema",
    "recon_ema",
    "recon_ema_avgpool",
    "recon_ema_maxpool",
]
ALPHAS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
SCALES = [200.0, 400.0, 800.0, 1200.0, 1600.0, 2000.0, 2400.0, 3000.0]  # the figure's (the script has the first 6)
INFINITEBENCH = {
    "tasks": ["all"],
    "chat_template": "authors",
    "generation_lengths": "authors",
    "samples": None,
    "max_new_tokens_cap": None,
}
NIAH = {
    "lengths": list(range(1000, 32001, 200)),
    "depths": [0, 11, 22, 33, 44, 56, 67, 78, 89, 100],
    "haystack": "data/PaulGrahamEssays",
    "prompt_format": "book",
}
RULER = {
    "tasks": RULER_TASKS,
    "lengths": [4096, 8192, 16384, 32768, 65536, 131072],
    "max_new_tokens": RULER_NEW_TOKENS,
    "answer_prefix": False,
    "chat_template": False,
    "data_dir": None,
    "haystack": "data/PaulGrahamEssays",
    "sentences": "punkt",  # RULER's generator splits essays with NLTK's punkt
    "english_words": "data/ruler/english_words.json",  # its english_words.json for long cwe lists
}
EXPECTED: dict[str, Preset] = {
    "longbench_llama3": Preset(LLAMA31, "longbench", LONGBENCH_POLICIES, FIGURE_BUDGETS, bench_settings=LONGBENCH),
    "longbench_llama2": Preset(
        "llama-2-7b-chat", "longbench", LONGBENCH_POLICIES, FIGURE_BUDGETS, bench_settings=LONGBENCH
    ),
    "longbench_mistral": Preset(
        "mistral-7b-instruct-v0.3", "longbench", LONGBENCH_POLICIES, FIGURE_BUDGETS, bench_settings=LONGBENCH
    ),
    "longbench_qwen2.5": Preset(
        "qwen2.5-7b-instruct",
        "longbench",
        ["full", "streamingllm", "snapkv", "restkv"],
        [64, 512],
        bench_settings=LONGBENCH,
    ),
    "longbench_gemma": Preset(
        "gemma-7b-it", "longbench", ["full", "streamingllm", "snapkv", "restkv"], [64, 512], bench_settings=LONGBENCH
    ),
    "ablation_llama3": Preset(
        LLAMA31,
        "longbench",
        ["random", "snapkv", *(f"ablation/{row}" for row in ABLATION_ROWS), "restkv"],
        [128],
        bench_settings=LONGBENCH,
    ),
    "sensitivity_alpha": Preset(LLAMA31, "longbench", ["restkv"], [128], ("alpha", ALPHAS), LONGBENCH),
    "sensitivity_scale": Preset(LLAMA31, "longbench", ["restkv"], [128], ("scale", SCALES), LONGBENCH),
    "infinitebench_llama3": Preset(
        LLAMA31, "infinitebench", ["snapkv", "restkv_ruler"], [1024], bench_settings=INFINITEBENCH
    ),
    "niah_llama3": Preset(LLAMA31, "niah", ["full", "streamingllm_niah", "snapkv", "restkv"], [128, 1024], None, NIAH),
    "ruler_llama3": Preset(
        LLAMA31, "ruler", ["full", "streamingllm", "snapkv", "pyramidkv", "restkv_ruler"], [1024], None, RULER
    ),
}

# --------------------------------------------------------------------------------------------------
# Composing a preset as its sweep does
# --------------------------------------------------------------------------------------------------


def sweep_jobs(preset: str) -> list[list[str]]:
    """The overrides of every job of ``preset``'s multirun (the cartesian product of its sweeper params)."""
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=[f"experiment={preset}"], return_hydra_config=True)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    assert isinstance(params, dict) and params, f"{preset} sweeps nothing"
    axes = [[f"{key}={value}" for value in str(values).split(",")] for key, values in params.items()]
    return [list(job) for job in itertools.product(*axes)]


def compose_jobs(preset: str, *extra: str, only: tuple[str, ...] = ()) -> list[tuple[list[str], DictConfig]]:
    """Every job of ``preset`` composed with ``extra`` overrides (``only``: the jobs with all these overrides)."""
    jobs = [job for job in sweep_jobs(preset) if all(item in job for item in only)]
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return [
            (
                job,
                compose(
                    config_name="config", overrides=[f"experiment={preset}", *job, *extra], return_hydra_config=True
                ),
            )
            for job in jobs
        ]


def swept(jobs: list[list[str]], key: str) -> list[str]:
    return list(dict.fromkeys(item.split("=", 1)[1] for job in jobs for item in job if item.startswith(f"{key}=")))


# --------------------------------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------------------------------


def check_model(cfg: DictConfig, expected: Preset) -> None:
    assert cfg.hydra.runtime.choices.model == expected.model
    path, max_context = AUTHORS_MODELS[expected.model]
    model = cfg.model
    assert (model.path, model.max_context) == (path, max_context), (
        f"model.path/max_context {model.path} {model.max_context}"
    )
    assert model.dtype == "float16", f"model.dtype={model.dtype}; the authors load every model in float16"
    assert model.attn_implementation == "flash_attention_2", f"model.attn_implementation={model.attn_implementation}"
    assert cfg.protocol == "query_aware", f"protocol={cfg.protocol}; the authors compress the question too"


def check_policy(cfg: DictConfig, swept_knob: str | None = None) -> None:
    name = cfg.hydra.runtime.choices.policy
    cls, knobs = AUTHORS_POLICIES[name]
    policy = instantiate(cfg.policy, _convert_="all")
    assert type(policy) is cls, name
    wanted = {**SHARED_KNOBS, **knobs} if policy.evicts else {"gqa": "expand"}
    wanted.pop(swept_knob, None)
    got = {knob: getattr(policy, knob) for knob in wanted}
    assert got == wanted, f"{name}: {got} != the authors' {wanted}"


def check_bench(cfg: DictConfig, expected: Preset) -> None:
    assert cfg.hydra.runtime.choices.bench == expected.bench
    bench = OmegaConf.to_container(cfg.bench, resolve=True)
    assert isinstance(bench, dict)
    got = {key: bench.get(key, "<missing>") for key in expected.bench_settings}
    assert got == expected.bench_settings, f"bench: {got} != the authors' {expected.bench_settings}"
    if expected.bench == "longbench":
        built = instantiate(cfg.bench, _convert_="all")
        assert built.longbench_e is False
        assert built.tasks == list(LONGBENCH_TASKS), "run_longbench.py datasets"
        assert {t: longbench.TASK_SPECS[t].max_new_tokens for t in built.tasks} == LONGBENCH_TASKS
    elif expected.bench == "infinitebench":
        built = instantiate(cfg.bench, _convert_="all")
        assert sorted(built.tasks) == sorted(INFINITEBENCH_TASKS), "run_infinite_bench.py datasets"
        lengths = {t: infinitebench.max_new_tokens(t, built.generation_lengths) for t in built.tasks}
        assert lengths == INFINITEBENCH_TASKS, "run_infinite_bench.py dataset2maxlen"
    elif expected.bench == "niah":
        assert niah.MAX_NEW_TOKENS == 30 and niah.FINAL_CONTEXT_LENGTH_BUFFER == 200
        assert cfg.model.chat_template is False


def check_job(cfg: DictConfig, expected: Preset) -> None:
    """Every setting of the table for one composed job (AssertionError naming the first that differs)."""
    check_model(cfg, expected)
    check_policy(cfg, expected.knob[0] if expected.knob else None)
    check_bench(cfg, expected)
    assert cfg.budget in expected.budgets, f"budget={cfg.budget}"


def test_every_preset_has_its_expected_settings() -> None:
    assert sorted(EXPECTED) == PRESETS, "a preset without expected settings (add it here and to the doc)"


@pytest.mark.parametrize("preset", PRESETS)
def test_the_preset_sweeps_the_authors_runs(preset: str) -> None:
    expected = EXPECTED[preset]
    jobs = sweep_jobs(preset)
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        base = compose(config_name="config", overrides=[f"experiment={preset}"], return_hydra_config=True)
    assert (swept(jobs, "policy") or [base.hydra.runtime.choices.policy]) == expected.policies
    assert ([int(b) for b in swept(jobs, "budget")] or [base.budget]) == expected.budgets
    if expected.knob is None:
        assert not [item for job in jobs for item in job if item.startswith("policy.")]
    else:
        knob, values = expected.knob
        assert [float(v) for v in swept(jobs, f"policy.{knob}")] == values


@pytest.mark.parametrize("preset", PRESETS)
def test_every_job_of_the_preset_runs_the_authors_settings(preset: str) -> None:
    expected = EXPECTED[preset]
    for job, cfg in compose_jobs(preset):
        try:
            check_job(cfg, expected)
        except AssertionError as error:
            raise AssertionError(f"{preset} with {' '.join(job)}: {error}") from error
        if expected.knob is not None:
            knob, _ = expected.knob
            value = float(next(item for item in job if item.startswith(f"policy.{knob}=")).split("=")[1])
            assert getattr(instantiate(cfg.policy), knob) == value


@pytest.mark.parametrize(
    ("override", "what"),
    [
        ("policy.gqa=mean", "gqa"),
        ("policy.window=64", "window"),
        ("policy.alpha=0.2", "alpha"),
        ("model.dtype=bfloat16", "model.dtype"),
        ("model.attn_implementation=sdpa", "model.attn_implementation"),
        ("model.max_context=131072", "model.path/max_context"),
        ("bench.chat_template=official", "chat_template"),
        ("bench.samples=10", "samples"),
        ("protocol=query_agnostic", "protocol"),
        ("budget=100", "budget"),
    ],
)
def test_a_drifted_setting_fails_the_check(override: str, what: str) -> None:
    """The checks compare values: one setting away from the authors' and the job is refused, naming it."""
    ((_, cfg),) = compose_jobs("longbench_llama3", override, only=("policy=restkv", "budget=128"))
    with pytest.raises(AssertionError, match=what):
        check_job(cfg, EXPECTED["longbench_llama3"])


def test_a_drifted_policy_knob_fails_the_check() -> None:
    ((_, cfg),) = compose_jobs("ruler_llama3", "policy.kernel=5", only=("policy=restkv_ruler",))
    with pytest.raises(AssertionError, match="kernel"):
        check_policy(cfg)


# --------------------------------------------------------------------------------------------------
# Our variants are one override away
# --------------------------------------------------------------------------------------------------


def test_our_shrinking_cache_and_sdpa_are_one_override_away() -> None:
    for job, cfg in compose_jobs("ruler_llama3", "policy.gqa=mean", "model.attn_implementation=sdpa"):
        assert instantiate(cfg.policy).gqa == "mean" and cfg.model.attn_implementation == "sdpa", job


def test_the_protocol_applies_to_any_run_on_its_own() -> None:
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=["experiment=authors/protocol", "policy=snapkv"])
    assert (cfg.model.dtype, cfg.model.attn_implementation) == ("float16", "flash_attention_2")
    assert cfg.policy.gqa == "expand"


# --------------------------------------------------------------------------------------------------
# The prompt's form: raw prompt, BOS, no chat template, the Llama-2 wrapper
# --------------------------------------------------------------------------------------------------


class RecordingTokenizer:
    """A character tokenizer that has a chat template, so that using it would show (it raises)."""

    bos_token_id = 1
    chat_template = "{{ messages }}"

    def __init__(self, name_or_path: str) -> None:
        self.name_or_path = name_or_path

    def __call__(self, text: str, add_special_tokens: bool = True, **kwargs: Any) -> dict[str, list[int]]:
        return {"input_ids": [self.bos_token_id] * add_special_tokens + [ord(c) + 2 for c in text]}

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i - 2) for i in ids if i != self.bos_token_id)

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> str:
        raise AssertionError("the authors apply no chat template")


@pytest.mark.parametrize(
    ("preset", "bench_dir"),
    [("longbench_llama3", "longbench"), ("longbench_llama2", "longbench"), ("infinitebench_llama3", "infinitebench")],
)
def test_prompts_are_the_raw_authors_prompt_with_bos(preset: str, bench_dir: str) -> None:
    first = tuple(sweep_jobs(preset)[0])
    ((_, cfg),) = compose_jobs(preset, f"bench.data_dir={FIXTURES / bench_dir}", "bench.hub=false", only=first)
    spec = ModelSpec(**OmegaConf.to_container(cfg.model))  # type: ignore[arg-type]
    assert spec.chat_template is True  # the model has one; the benchmark asks for the raw prompt
    tokenizer = RecordingTokenizer(spec.path)
    samples = instantiate(cfg.bench, _convert_="all").load_samples(tokenizer)
    assert samples
    llama2 = "llama-2" in spec.path.lower()
    for sample in samples:
        assert sample.chat_template is False and sample.answer_prefix == ""
        prompt = sample.context + sample.question
        assert (prompt.startswith("[INST] ") and prompt.endswith(" [/INST]")) is llama2
        ids = tokenize(sample, tokenizer, spec.chat_template, spec.max_context)
        whole = ids.context + ids.query
        assert whole[0] == tokenizer.bos_token_id and tokenizer.bos_token_id not in whole[1:]
        if not ids.truncated:
            assert tokenizer.decode(whole) == prompt


# --------------------------------------------------------------------------------------------------
# flash_attention_2 where installed, refused (before any work) where not
# --------------------------------------------------------------------------------------------------


def _spec(attn: str) -> ModelSpec:
    return ModelSpec(name="m", path="models/tiny-random-llama", attn_implementation=attn)


def test_flash_attention_without_flash_attn_is_refused_naming_the_override(monkeypatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"needs the 'flash_attn' package.*model\.attn_implementation=sdpa"):
        check_attention_backend(_spec("flash_attention_2"), "cuda")
    check_attention_backend(_spec("sdpa"), "cpu")


def test_flash_attention_off_a_gpu_is_refused(monkeypatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())
    with pytest.raises(ValueError, match=r"CUDA GPUs only.*'cpu'.*model\.attn_implementation=sdpa"):
        check_attention_backend(_spec("flash_attention_2"), "cpu")
    check_attention_backend(_spec("flash_attention_2"), "cuda")


def test_a_run_asking_for_flash_attention_here_stops_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "results"
    overrides = [
        "experiment=authors/protocol",
        "model=tiny-random-llama",
        "bench=niah",
        "bench.lengths=[600]",
        "bench.depths=[50]",
        "device=cpu",
        f"out_dir={out}",
    ]
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    with pytest.raises(ValueError, match=r"model\.attn_implementation=sdpa"):
        plan_run(cfg, RunSettings(bench="niah", model="tiny-random-llama", policy="restkv", out_dir=out))
    assert not out.exists()


# --------------------------------------------------------------------------------------------------
# The micro paper (experiment=paper_micro and its parts): one run folder per cell, shared where parts meet
# --------------------------------------------------------------------------------------------------

MICRO_PARTS = {
    MICRO_PAPER: 24,
    "paper_micro/ablation": 8,
    "paper_micro/alpha": 3,
    "paper_micro/scale": 3,
    "paper_micro/niah": 10,
    "paper_micro/quant": 6,
}


@pytest.mark.parametrize(("part", "cells"), MICRO_PARTS.items())
def test_the_micro_paper_parts_sweep_the_micro_model(part: str, cells: int) -> None:
    jobs = compose_jobs(part)
    assert len(jobs) == cells
    for overrides, cfg in jobs:
        assert cfg.model.name == "micro-llama", overrides
        if part != "paper_micro/niah":  # one bench setting everywhere: ReST-KV @ 128 is one run for every part
            assert (list(cfg.bench.lengths), cfg.bench.samples, cfg.bench.seed) == ([1024, 2048], 5, 11)
        else:
            assert cfg.bench._target_.endswith("MicroNiahBenchmark")
    knob_overrides = [o for overrides, _ in jobs for o in overrides if o.split("=")[0] not in ("policy", "budget")]
    assert all(o.startswith(("policy.", "quantization=")) for o in knob_overrides), knob_overrides
