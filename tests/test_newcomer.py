"""A newcomer's first hour: a bad command refused in about a second, one line each, with the closest valid name; a
hub model that cannot be had refused without retries; Ctrl-C saying what is saved; the README's smoke command
working as written; the names users import where they look for them; no chatter in a run's output."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """``python -X importtime eval/run.py ...`` from the repository root: its exit, output and every import."""
    command = [sys.executable, "-X", "importtime", "eval/run.py", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, timeout=timeout)


def _imported(done: subprocess.CompletedProcess[str]) -> set[str]:
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


def _message(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("import time:")]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--policy", "restkv"], "'--policy' is not an option of eval/run.py: settings are key=value overrides"),
        (["budgett=128"], "budgett is not a setting of eval/run.py; did you mean budget?"),
        (["+budgett=128"], "budgett is not a setting of eval/run.py; did you mean budget?"),
        (["policy=snapk"], "policy=snapk is not a policy config; did you mean snapkv?"),
        (["-m", "policy=snapkv,restkvv"], "policy=restkvv is not a policy config; did you mean restkv?"),
        (["bench=rulr"], "bench=rulr is not a bench config; did you mean ruler?"),
        (["budget=abc"], "budget='abc' is not allowed; it must be a token count (integer) or a fraction in (0, 1)"),
        (["-m", "budget=64,abc"], "budget='abc' is not allowed"),
        (["limit=0"], "limit=0 is not allowed; it must be an integer >= 1"),
        (
            ["protocol=query_awar"],
            "protocol='query_awar' is not allowed; choose one of: query_aware, query_agnostic; "
            "did you mean query_aware?",
        ),
        (["decode_batch=0"], "decode_batch=0 is not allowed; use auto or an integer >= 1"),
        (["device=tpu0"], "device='tpu0' is not a device; use auto, cpu, cuda or cuda:N"),
        (["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=0"], "hydra.launcher.n_jobs=0 is not allowed"),
        (["budget"], "Error parsing override 'budget' (settings are written key=value)"),
    ],
)
def test_a_mistyped_command_is_refused_in_one_line_before_torch_is_imported(args, says):
    """Every refusal took 15-70 s (imports before the arguments were read); typos exited 1 through Hydra, whose
    advice ("use +budgett=128") led away from the fix."""
    done = _run(*args)
    assert done.returncode == 2, done.stderr[-1500:]
    assert _message(done) == [f"error: {_message(done)[0].removeprefix('error: ')}"]  # one line
    assert says in _message(done)[0]
    assert "torch" not in _imported(done)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["policy.windw=8"], "policy.windw is not a setting of policy; did you mean window? (its settings: "),
        (["model.dtyp=float16"], "model.dtyp is not a setting of model; did you mean dtype?"),
        (["bench.lenghts=[512]"], "bench.lenghts is not a setting of bench; did you mean lengths?"),
        (["policy.alpha=abc"], "policy.alpha=abc is not allowed: Value 'abc' of type 'str' could not be converted"),
        (["policy.window=0"], "ReSTKV.window=0 is not allowed; it must be an integer in [1, inf]"),
        (["bench=micro", "bench.samples=0"], "bench.samples=0 must be >= 1"),
        (
            ["bench=longbench", "bench.hub=false", "bench.tasks=[qasper]", "bench.data_dir=/nonexistent"],
            "LongBench data missing: /nonexistent/qasper.jsonl. The hub was not used: it is off (bench.hub=false). To "
            "get the data, run `python scripts/download_data.py longbench`",
        ),
    ],
)
def test_a_bad_setting_is_refused_in_one_line_before_the_model_stack_is_imported(args, says):
    """A setting of the chosen policy, benchmark or model needs the classes (torch), never transformers."""
    done = _run(*args)
    assert done.returncode == 2, done.stderr[-1500:]
    (line,) = _message(done)
    assert says in line
    assert "transformers" not in _imported(done)


def test_a_hub_model_that_cannot_be_had_is_refused_at_once(tmp_path):
    """Offline, ``model=llama-3.1-8b-instruct`` printed 109 lines of retries over 116 s, then a traceback."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "cache")}
    done = _run("model=llama-3.1-8b-instruct", f"out_dir={tmp_path / 'out'}", env=env)
    assert done.returncode == 2, done.stderr[-1500:]
    (line,) = _message(done)
    assert line.startswith("error: model.path='meta-llama/Llama-3.1-8B-Instruct' is not on this machine")
    assert "HF_HUB_OFFLINE is set" in line and "`hf download meta-llama/Llama-3.1-8B-Instruct`" in line
    assert "transformers" not in _imported(done) and not (tmp_path / "out").exists()


def test_ctrl_c_ends_with_one_line_saying_what_is_saved_and_how_to_resume(tmp_path):
    """Ctrl-C printed a 129-line KeyboardInterrupt traceback and did not say that the same command resumes."""
    command = [sys.executable, "eval/run.py", "bench=micro", "bench.lengths=[2048]", "limit=40", f"out_dir={tmp_path}"]
    # a shell running the tests in the background ignores SIGINT, and children inherit that: restore it
    restore = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=restore
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not any(p.stat().st_size for p in tmp_path.rglob("predictions.jsonl")):
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-2000:]
    last = stderr.strip().splitlines()[-1]
    (folder,) = {p.parent for p in tmp_path.rglob("predictions.jsonl")}
    saved = len((folder / "predictions.jsonl").read_text().splitlines())
    assert last == f"stopped: {saved} of 40 samples are saved in {folder}; run the same command again to resume"
    assert "Traceback" not in stderr and 1 <= saved < 40
    assert not (folder / ".lock").exists()


def test_the_readmes_smoke_command_runs_as_written(tmp_path):
    """``python eval/run.py model=tiny-random-llama`` (the documented pipeline check) exited 2: RULER's default
    length did not fit the tiny model's prompts."""
    readme = (ROOT / "README.md").read_text()
    (command,) = re.findall(r"^\s+(python eval/run\.py model=tiny-random-llama[^#\n]*?)\s+#", readme, re.M)
    args = command.split()[2:]
    done = subprocess.run(
        [sys.executable, "eval/run.py", *args, f"out_dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "results: " in done.stdout and "random weights" in done.stdout  # it says what its scores mean


def test_every_policy_class_is_importable_from_restkv():
    """``from restkv import SnapKV`` raised ImportError (the class lives in restkv.baselines)."""
    import restkv
    from restkv import SnapKV, StreamingLLM
    from restkv.baselines import SnapKV as FromBaselines
    from restkv.registry import policy_names, resolve_policy

    assert SnapKV is FromBaselines and StreamingLLM.__name__ == "StreamingLLM"
    for name in policy_names():
        cls, _ = resolve_policy(name)
        assert getattr(restkv, cls.__name__) is cls, name
        assert cls.__name__ in dir(restkv)


def test_library_chatter_stays_out_of_a_runs_output():
    """rouge_score's absl logger printed "Using default tokenizer." on stdout in every LongBench/NIAH run.

    Run in a process of its own: logging configured the way a run configures it must not outlive the test.
    """
    script = (
        "import logging.config, yaml\n"
        f"logging.config.dictConfig(yaml.safe_load(open({str(ROOT / 'configs/hydra/job_logging/restkv.yaml')!r})))\n"
        "from rouge_score import rouge_scorer\n"
        "rouge_scorer.RougeScorer(['rougeL'])\n"
        "logging.getLogger('restkv.test').info(\"the run's own line\")\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "the run's own line\n"


def test_the_niah_heatmap_title_reads_in_the_tables_unit():
    """The title said "average score 0.01" where the table said 1.32."""
    from restkv.eval.benchmarks.niah.heatmap import heatmap_title

    results = [{"score": 1.0}, *([{"score": 0.0}] * 75)]
    assert heatmap_title("Needle in a Haystack", results) == "Needle in a Haystack — average 1.32"


def test_a_finished_run_leaves_no_lock_file(tmp_path):
    from test_reliability import MICRO
    from test_reliability import _run as run_in_process

    run_in_process(tmp_path, "snapkv", *MICRO, "limit=1")
    (folder,) = {p.parent for p in tmp_path.rglob("metrics.json")}
    assert not (folder / ".lock").exists()


def test_the_latency_benchmark_writes_outside_the_committed_records():
    """``latency=tiny`` left five untracked files in the committed results/efficiency/."""
    import yaml

    base = yaml.safe_load((ROOT / "configs" / "latency" / "base.yaml").read_text())
    assert base["out_dir"] == "results/latency"
    if (ROOT / ".git").exists():
        done = subprocess.run(["git", "check-ignore", "-q", "results/latency/tiny.json"], cwd=ROOT)
        assert done.returncode == 0, "results/latency/ must be ignored by git"


def test_a_sweep_ends_with_a_summary_of_its_runs(tmp_path):
    """A multirun printed no summary at the end: the scores were scattered over each job's output."""
    args = [
        "-m",
        "bench=micro",
        "bench.lengths=[512]",
        "bench.tasks=[passkey]",
        "limit=1",
        "budget=64,128",
        "policy=snapkv",
        f"out_dir={tmp_path}",
    ]
    done = subprocess.run([sys.executable, "eval/run.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = done.stdout[done.stdout.index("sweep summary") :]
    rows = [line for line in summary.splitlines() if "snapkv" in line]
    assert len(rows) == 2 and all("100.00" in row or "0.00" in row for row in rows), summary
    assert {"64", "128"} == {re.search(r"budget(\d+)", row).group(1) for row in rows}
    assert json.loads(next(tmp_path.rglob("metrics.json")).read_text())["average"] is not None
