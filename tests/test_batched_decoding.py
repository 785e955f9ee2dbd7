"""Many prompts per decode step (``decode_batch``): the same answers as one prompt at a time.

Each prompt is prefilled and evicted alone, then decoded as one row of a static decoder shared with the
others (`restkv.decoding.rows`, `restkv.eval.evaluation.batched`). On a CPU the rows run the recorded step's
code eagerly (``exact`` attention per row); their tokens must be those of the eager loop for every policy
family and layout, both protocols and the four architectures, with rows finishing at different steps.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from restkv import compress
from restkv.eval.evaluation import Fidelity, Generate
from restkv.eval.evaluation.base import Session
from restkv.eval.evaluation.batched import batched_answers
from restkv.eval.evaluation.decoding import answer
from restkv.eval.evaluation.prompting import PromptTokens
from restkv.eval.harness.decode_plan import plan_decode
from restkv.eval.harness.run_folder import PREDICTIONS, TIMING_FIELDS
from restkv.eval.harness.settings import Settings
from restkv.registry import get_policy
from restkv.storage.quantize import Quantization

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
PROMPTS = [PromptTokens(context=[(i * k) % 120 + 3 for i in range(150 + 30 * k)], query=[7, 9, k]) for k in range(1, 8)]
LENGTHS = [5, 12, 3, 20, 9, 16, 7]  # answer lengths: rows finish at different steps, slots are refilled
CASES = [  # (policy, knobs, layout)
    ("snapkv", {}, "auto"),
    ("pyramidkv", {}, "auto"),
    ("restkv", {"gqa": "expand"}, "auto"),
    ("adakv", {}, "auto"),
    ("adakv", {}, "masked"),
    ("full", {}, "auto"),  # rows of different lengths; longer prompts make the decoder grow
    ("cam", {}, "auto"),
]


def one_at_a_time_and_batched(model, policy, layout: str, protocol: str, rows: int, eos: set[int]):
    with compress(model, policy, 64, layout=layout) as compressor:
        alone = [answer(model, p, compressor, protocol, n, eos, "eager") for p, n in zip(PROMPTS, LENGTHS, strict=True)]
        session = Session(model, None, compressor, protocol, eos, "static")
        work = [(index, p, n) for index, (p, n) in enumerate(zip(PROMPTS, LENGTHS, strict=True))]
        batched = list(batched_answers(session, work, rows, lambda: {"kept": compressor.record.kept}))
    return alone, batched


@pytest.mark.parametrize("protocol", ["query_aware", "query_agnostic"])
@pytest.mark.parametrize(("name", "knobs", "layout"), CASES)
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_batched_answers_are_those_of_one_prompt_at_a_time(make_model, arch, name, knobs, layout, protocol):
    model = make_model(arch)
    policy = get_policy(name, window=8, **knobs)
    alone, batched = one_at_a_time_and_batched(model, policy, layout, protocol, 3, set())
    assert [key for key, _, _ in batched] == list(range(len(PROMPTS)))  # in the order the prompts went in
    for single, (_, reply, extras) in zip(alone, batched, strict=True):
        assert reply.tokens == single.tokens and reply.kept_tokens == single.kept_tokens
        assert reply.decode_path == "static" and extras["decode_batch"] == 3
    eos = {alone[3].tokens[4]}  # an EOS met mid-answer by some rows
    alone, batched = one_at_a_time_and_batched(model, policy, layout, protocol, 3, eos)
    assert [reply.tokens for _, reply, _ in batched] == [single.tokens for single in alone]


def test_each_prompt_keeps_its_own_cache_record_and_time_share(make_model):
    model = make_model("llama")
    with compress(model, get_policy("adakv", window=8), 64) as compressor:
        session = Session(model, None, compressor, "query_aware", set(), "static")
        work = [(index, p, n) for index, (p, n) in enumerate(zip(PROMPTS, LENGTHS, strict=True))]
        batched = list(batched_answers(session, work, 4, lambda: {"kept": list(compressor.record.kept)}))
        alone = []
        for prompt, n in zip(PROMPTS, LENGTHS, strict=True):
            answer(model, prompt, compressor, "query_aware", n, set(), "eager")
            alone.append(list(compressor.record.kept))
    assert [extras["kept"] for _, _, extras in batched] == alone  # the snapshot right after each prompt's prefill
    assert all(reply.decode_seconds > 0 and reply.prefill_seconds > 0 for _, reply, _ in batched)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, r"decode_batch=0 is not allowed; use auto or an integer >= 1"),
        (-2, r"decode_batch=-2 is not allowed"),
        (1.5, r"decode_batch=1.5 is not allowed"),
        ("many", r"decode_batch='many' is not allowed"),
        (True, r"decode_batch=True is not allowed"),
    ],
)
def test_bad_decode_batch_values_are_refused(value, message):
    with pytest.raises(ValueError, match=message):
        Settings.of({"decode_batch": value})


def rows(value, device=CPU, decode="auto", evaluation=None, quantization=None):
    """The prompts per decode step the run's decode plan gives (`restkv.eval.harness.decode_plan`)."""
    run = Settings.of({"decode_batch": value, "decode": decode})
    policy = get_policy("snapkv", window=8)
    return plan_decode(run, device, evaluation or Generate(), quantization or Quantization(), policy).rows


def test_what_cannot_batch_is_refused_by_name_or_decoded_one_at_a_time():
    assert rows("auto") == 1  # a CPU decodes one prompt at a time by default
    assert rows(4) == 4  # unless asked
    assert rows("auto", torch.device("cuda")) == "auto"
    hqq = Quantization(backend="hqq")
    assert rows("auto", torch.device("cuda"), quantization=hqq) == 1
    with pytest.raises(ValueError, match=r"decode_batch=4 cannot batch this run: quantized caches \(hqq\)"):
        rows(4, quantization=hqq)
    with pytest.raises(ValueError, match=r"decode_batch=2 cannot batch this run: decode=eager decodes"):
        rows(2, decode="eager")
    with pytest.raises(ValueError, match=r"decode_batch=2 cannot batch this run: evaluation=fidelity evaluates one"):
        rows(2, evaluation=Fidelity())


def _run(out: Path, *overrides: str, check: bool = True) -> subprocess.CompletedProcess:
    command = [sys.executable, "eval/run.py", "bench=micro", "bench.lengths=[1024]", "bench.samples=2", "budget=64"]
    run = subprocess.run([*command, f"out_dir={out}", *overrides], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0 or not check, run.stderr[-2000:]
    return run


def _records(out: Path) -> tuple[Path, list[dict]]:
    (path,) = out.rglob(PREDICTIONS)
    lines = path.read_text().splitlines()
    return path.parent.relative_to(out), [
        {k: v for k, v in json.loads(x).items() if k not in TIMING_FIELDS} for x in lines
    ]


@pytest.mark.slow
def test_a_batched_run_writes_the_unbatched_runs_predictions_and_resumes_after_a_kill(tmp_path):
    tasks = "bench.tasks=[micro_single_1,micro_multikey_1,passkey,micro_vt]"
    _run(tmp_path / "one", tasks, "decode_batch=1")
    _run(tmp_path / "three", tasks, "decode_batch=3")
    folder, one = _records(tmp_path / "one")
    assert _records(tmp_path / "three") == (folder, one)  # same records, same folder: decode_batch is no identity
    (metrics,) = (tmp_path / "three").rglob("metrics.json")
    assert json.loads(metrics.read_text())["decode"]["batch"] == {"setting": 3, "sizes": {"3": 8}}
    killed = tmp_path / "killed"
    killed.mkdir()
    command = [sys.executable, "eval/run.py", "bench=micro", "bench.lengths=[1024]", "bench.samples=2", "budget=64"]
    process = subprocess.Popen([*command, tasks, "decode_batch=3", f"out_dir={killed}"], cwd=ROOT)
    try:
        while process.poll() is None and not any(p.read_text().count("\n") >= 2 for p in killed.rglob(PREDICTIONS)):
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    written = sum(p.read_text().count("\n") for p in killed.rglob(PREDICTIONS))
    assert 1 <= written < 8, "the run ended before it could be killed"
    resumed = _run(killed, tasks, "decode_batch=3")
    assert f"{written} of 8 samples already done" in resumed.stdout
    assert _records(killed) == (folder, one)


def test_quantized_runs_refuse_an_explicit_batch_before_any_work(tmp_path):
    run = _run(tmp_path, "quantization=kivi", "decode_batch=2", check=False)
    assert run.returncode == 2 and "decode_batch=2 cannot batch this run: quantized caches (hqq)" in run.stderr
    assert not any(tmp_path.rglob(PREDICTIONS))
    fidelity = _run(tmp_path, "evaluation=fidelity", "decode_batch=2", check=False)
    assert fidelity.returncode == 2 and "evaluation=fidelity evaluates one prompt at a time" in fidelity.stderr


def test_kvpress_presses_batch_as_our_policies(make_model):
    """A kvpress scorer press evicts through our integration: its caches batch like ours (kvpress installed)."""
    pytest.importorskip("kvpress", reason='kvpress is not installed (pip install -e ".[kvpress]")')
    from restkv.interop import KVPressPolicy

    model = make_model("llama")
    for press in (KVPressPolicy(press="SnapKVPress", window_size=8), KVPressPolicy(press="KnormPress")):
        alone, batched = one_at_a_time_and_batched(model, press, "auto", "query_aware", 3, set())
        assert [reply.tokens for _, reply, _ in batched] == [single.tokens for single in alone]
