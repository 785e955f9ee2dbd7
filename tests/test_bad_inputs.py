"""Bad input gets a clear error naming the key, the value and what is allowed, before anything is written.

Each case is a command line as a user would type it (on the tiny model). The error may come from
Hydra's composition (typed policy and model knobs, unknown choices) or from the run's own checks
(`restkv.eval.harness.validate`, the classes' ``__post_init__``, the model and data checks); either way it must
name the offending key and what is allowed, and the output folder must stay empty.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException

from restkv.eval.harness.runner import RunSettings, run_benchmark
from restkv.eval.run import CONFIGS

FAST = ["model=tiny-random-llama", "bench.lengths=[512]", "bench.samples=1", "bench.tasks=[niah_single_1]"]


def _message(error: BaseException) -> str:
    """The error and its causes, as a user reads them."""
    parts = []
    while error is not None:
        parts.append(str(error))
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return "\n".join(parts)


def error_of(tmp_path: Path, *overrides: str, base: list[str] | None = None) -> str:
    out = tmp_path / "out"
    args = [*(FAST if base is None else base), f"out_dir={out}", *overrides]
    try:
        with initialize_config_dir(config_dir=CONFIGS, version_base=None):
            cfg = compose(config_name="config", overrides=args)
        run_benchmark(cfg, RunSettings("bench", "tiny-random-llama", "policy", out_dir=out))
    except (HydraException, ValueError, TypeError, RuntimeError) as error:
        assert not out.exists() or not any(out.iterdir()), f"{overrides} wrote into out_dir before failing"
        return _message(error)
    pytest.fail(f"{overrides} was accepted")


TOP_LEVEL = [
    (["limit=-1"], r"limit=-1 is not allowed; it must be an integer >= 1"),
    (["limit=0"], r"limit=0 is not allowed; it must be an integer >= 1"),
    (["limit=1.5"], r"limit=1\.5 is not allowed; it must be an integer or null"),
    (["limit=abc"], r"limit='abc' is not allowed; it must be an integer or null"),
    (["limit=true"], r"limit=True is not allowed; it must be an integer or null"),
    (["budget=0"], r"budget 0 is not allowed: a token budget must be >= 1"),
    (["budget=-5"], r"budget -5 is not allowed: a token budget must be >= 1"),
    (["budget=1.5"], r"budget=1\.5 is not allowed; a fraction of the prompt must lie in \(0, 1\)"),
    (["budget=abc"], r"budget='abc' is not allowed; it must be a token count \(integer\) or a fraction"),
    (["budget=true"], r"budget=True is not allowed; it must be a token count"),
    (["budget=16"], r"budget=16 is not more than the window \(policy.window=32\): .* must exceed the window"),
    (["protocol=sideways"], r"protocol='sideways' is not allowed; choose one of: query_aware, query_agnostic"),
    (["device=cuda"], r"device='cuda' but CUDA is not available on this machine; use device=cpu or auto"),
    (["device=tpu0"], r"device='tpu0' is not a device; use auto, cpu, cuda or cuda:N"),
    (["allow_skips=maybe"], r"allow_skips='maybe' is not allowed; it must be true or false"),
    (["on_change=sometimes"], r"on_change='sometimes' is not allowed; choose one of: refuse, new_folder, adopt"),
    (["policy=snapk"], r"Could not find 'policy/snapk'"),
    (["bench=rulr"], r"Could not find 'bench/rulr'"),
    (["evaluation=nope"], r"Could not find 'evaluation/nope'"),
    (["model=llama-9"], r"Could not find 'model/llama-9'"),
]

POLICY = [
    (["policy.use_wo=maybe"], r"policy.use_wo=maybe[\s\S]*'maybe' is not a valid bool"),
    (["policy.normalize=yes please"], r"policy.normalize[\s\S]*not a valid bool"),
    (["policy.window=2.5"], r"policy.window=2.5[\s\S]*could not be converted to Integer"),
    (["policy.window=0"], r"ReSTKV.window=0 is not allowed; it must be an integer in \[1"),
    (["policy.alpha=2"], r"ReSTKV.alpha=2.0 is not allowed; it must be a number in \(0, 1\]"),
    (["policy.alpha=abc"], r"policy.alpha=abc[\s\S]*could not be converted to Float"),
    (["policy.temporal=foo"], r"ReSTKV.temporal='foo' is not allowed; choose one of: .*ema"),
    (["policy.spatial=foo"], r"ReSTKV.spatial='foo' is not allowed; choose one of: .*adaptive"),
    (["policy.indicator=foo"], r"ReSTKV.indicator='foo' is not allowed; choose one of: .*reconstruction"),
    (["policy.order=sideways"], r"ReSTKV.order='sideways' is not allowed; choose one of: after, before"),
    (["policy.gqa=sum"], r"ReSTKV.gqa='sum' is not allowed; choose one of: .*expand"),
    (["policy.schedule=flat"], r"ReSTKV.schedule='flat' is not allowed; choose one of: uniform, pyramid"),
    (["policy.kernel=0"], r"ReSTKV.kernel=0 is not allowed"),
    (["policy.colour=1"], r"Could not override 'policy.colour'"),
    (["policy=streamingllm", "policy.variant=middle"], r"StreamingLLM.variant='middle' is not allowed; choose one"),
    (["policy=streamingllm", "policy.sinks=-1"], r"StreamingLLM.sinks=-1 is not allowed"),
    (["policy=h2o", "policy.max_elements=0"], r"H2O.max_elements=0 is not allowed"),
    (["policy=random", "policy.seed=1.5"], r"policy.seed=1.5[\s\S]*could not be converted to Integer"),
]

MODEL = [
    (["model.chat_template=maybe"], r"model.chat_template[\s\S]*(true or false|not a valid bool)"),
    (["model.random_init=maybe"], r"model.random_init[\s\S]*(true or false|not a valid bool)"),
    (["model.dtype=float64"], r"model.dtype='float64' is not allowed; choose one of: float32, bfloat16, float16"),
    (["model.max_context=1"], r"model.max_context=1 is not allowed"),
    (["model.max_context=abc"], r"model.max_context[\s\S]*(integer|Integer)"),
    (["model.attn_implementation=fast"], r"model.attn_implementation='fast' is not allowed[\s\S]*sdpa"),
    (["model.seed=abc"], r"model.seed[\s\S]*(integer|Integer)"),
    (["model.path=/no/such/model/folder", "model.random_init=false"], r"model.path='/no/such/model/folder'"),
]

BENCH = [
    (["bench.lengths=[512.5]"], r"bench.lengths=\[512.5\] is not allowed; it must be a list of integers"),
    (["bench.samples=1.5"], r"bench.samples=1.5 is not allowed; it must be an integer"),
    (["bench.samples=abc"], r"bench.samples='abc' is not allowed; it must be an integer"),
    (["bench.samples=0"], r"bench.samples=0 must be >= 1"),
    (["bench.lengths=[]"], r"bench.lengths=\[\] must be a non-empty list of positive token counts"),
    (["bench.lengths=[-5]"], r"bench.lengths=\[-5\] must be a non-empty list of positive token counts"),
    (["bench.seed=1.5"], r"bench.seed=1.5 is not allowed; it must be an integer"),
    (["bench.hub=maybe"], r"bench.hub='maybe' is not allowed; it must be true or false"),
    (["bench.tasks=[nope]"], r"nope[\s\S]*niah_single_1"),
    (["bench.tasks=niah_single_1"], r"bench.tasks='niah_single_1' is not allowed; it must be a list of strings"),
    (["bench.tasks=[]"], r"bench=bench gives no sample to run"),
    (["bench.haystack=/typo"], r"bench.haystack='/typo' does not exist"),
    (["bench.colour=1"], r"Could not override 'bench.colour'"),
    (
        ["bench.tasks=[niah_single_1,qa_1]", "bench.hub=false"],
        r"cannot run every task \(qa_1: .*squad.*allow_skips=true",
    ),
    (["bench.tasks=[qa_1]", "bench.hub=false"], r"gives no sample to run; skipped: qa_1: .*squad"),
]

OTHER_BENCHES = [
    (["bench=niah", "bench.prompt_format=poem"], r"bench.prompt_format='poem' is not allowed; choose one of"),
    (["bench=niah", "bench.haystack=/typo"], r"bench.haystack='/typo' does not exist"),
    (["bench=niah", "bench.lengths=[1.5]"], r"bench.lengths=\[1.5\] is not allowed; it must be a list of integers"),
    (["bench=micro", "bench.tasks=[nope]"], r"nope[\s\S]*micro_single_1"),
    (["bench=micro", "bench.haystack=/typo"], r"bench.haystack='/typo' does not exist"),
    (["bench=micro", "bench.samples=2.5"], r"bench.samples=2.5 is not allowed; it must be an integer"),
    (["bench=fidelity", "evaluation.tokens=0"], r"evaluation.tokens=0 must be an integer >= 1"),
    (["bench=fidelity", "evaluation.tokens=1.5"], r"evaluation.tokens=1.5 is not allowed; it must be an integer"),
    (["bench=fidelity", "bench.source.samples=1.5"], r"bench.source.samples=1.5 is not allowed; it must be an int"),
    (["bench=longbench", "bench.chat_template=sometimes"], r"chat_template='sometimes' is not allowed; choose one"),
    (["bench=longbench", "bench.samples=-2"], r"bench.samples=-2"),
    (["bench=infinitebench", "bench.generation_lengths=long"], r"generation_lengths='long' is not allowed"),
]

CASES = TOP_LEVEL + POLICY + MODEL + BENCH + OTHER_BENCHES
NO_FAST = {"bench=niah", "bench=micro", "bench=fidelity", "bench=longbench", "bench=infinitebench"}


@pytest.mark.parametrize(("overrides", "message"), CASES, ids=[" ".join(o) for o, _ in CASES])
def test_bad_input_is_named(tmp_path: Path, overrides: list[str], message: str) -> None:
    base = ["model=tiny-random-llama"] if NO_FAST & set(overrides) else None
    assert len(CASES) >= 60
    found = error_of(tmp_path, *overrides, base=base)
    assert re.search(message, found), f"{overrides}: {found}"


def test_out_dir_that_is_a_file_is_named(tmp_path: Path) -> None:
    file = tmp_path / "a_file"
    file.write_text("x")
    found = error_of(tmp_path, f"out_dir={file / 'results'}")
    assert f"out_dir='{file / 'results'}' is not allowed: {file} is a file, not a folder" in found


def test_an_empty_infinitebench_file_is_refused_by_name(tmp_path: Path) -> None:
    data = tmp_path / "ib"
    data.mkdir()
    (data / "passkey.jsonl").write_text("")
    found = error_of(
        tmp_path,
        "bench=infinitebench",
        "bench.tasks=[passkey]",
        f"bench.data_dir={data}",
        "bench.hub=false",
        base=["model=tiny-random-llama"],
    )
    assert f"{data / 'passkey.jsonl'}: InfiniteBench task 'passkey': the file holds no record" in found


def test_metrics_of_a_run_with_allowed_skips_say_what_was_skipped(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(
            config_name="config",
            overrides=[
                *FAST[:3],
                "bench.tasks=[niah_single_1,qa_1]",
                "bench.hub=false",
                "allow_skips=true",
                "budget=64",
                f"out_dir={out}",
            ],
        )
    summary = run_benchmark(cfg, RunSettings("ruler", "tiny-random-llama", "restkv", out_dir=out))
    assert list(summary["skipped"]) == ["qa_1"] and summary["ran"]["tasks"] == ["niah_single_1"]
    (metrics,) = out.rglob("metrics.json")
    strict = json.loads(metrics.read_text(), parse_constant=lambda c: pytest.fail(f"metrics.json holds {c}"))
    assert "squad" in strict["skipped"]["qa_1"]
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    assert notes[-2].startswith("note: skipped qa_1") and "random weights" in notes[-1]  # then the model's own note
