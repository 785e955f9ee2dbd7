"""Every shipped preset and config option, typed as a user types it, starts or is refused in one line.

Each command runs in a subprocess, offline (``HF_HUB_OFFLINE=1``) and without data, and must end either ready to
work or with exit code 2 and one line: never a traceback, never exit code 1. The test registers and imports
nothing the command does not.

How the work is stopped before it starts: the commands run with ``--check``, the dry mode the entry points offer
users (``eval/run.py --check ...``, ``python -m restkv.eval.latency --check ...``). It runs the same check the
command runs before its work, on every job of a sweep, and stops there. Killing each run at its first progress
line was the other way; it would load a model for every option (minutes on two cores) and test the same check.
Options of one group go in one sweep (``--check -m policy=a,b,...``): the check composes and checks each job on its
own and reports each one (ready, or refused with its line), so one process covers a group. The commands of the
"Why" of the issue run as typed, without ``--check``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
RUN = [sys.executable, "eval/run.py"]
LATENCY = [sys.executable, "-m", "restkv.eval.latency"]
LIMIT_S = 240


def options(group: str) -> list[str]:
    """The configs a group can choose, as ``configs/<group>/**.yaml`` names them."""
    return sorted(str(p.relative_to(CONFIGS / group).with_suffix("")) for p in (CONFIGS / group).rglob("*.yaml"))


def run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=ROOT, env=OFFLINE, capture_output=True, text=True, timeout=LIMIT_S)


def assert_started_or_refused(done: subprocess.CompletedProcess, command: list[str]) -> None:
    """Ready (exit 0, every job ``ready``) or refused (exit 2: one line, or one line per job of a sweep)."""
    shown = " ".join(command[1:])
    text = done.stdout + done.stderr
    assert "Traceback" not in text, f"{shown}: a traceback\n{text[-3000:]}"
    assert done.returncode in (0, 2), f"{shown}: exit code {done.returncode}\n{text[-3000:]}"
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) == 1:  # one job: ready, or one line of refusal
        assert lines[0].startswith("ready: " if done.returncode == 0 else "error: "), f"{shown}: {lines}"
        return
    *jobs, closing = lines
    assert closing.startswith("checked "), f"{shown}: {lines[-3:]}"
    for line in jobs:
        assert line.startswith("job ") and (": ready: " in line or ": refused: " in line), f"{shown}: {line}"
    assert (done.returncode == 2) == any(": refused: " in line for line in jobs), shown


def commands() -> list[list[str]]:
    """Each preset alone, each group's options as one sweep, each latency preset, each launcher."""
    out = "out_dir=results/.entry-point-check"  # --check writes nothing; named so that no result folder is read
    found = [[*RUN, "--check", f"experiment={name}", out] for name in options("experiment")]
    for group in ("model", "policy", "bench", "evaluation", "quantization", "logger"):
        found.append([*RUN, "--check", "-m", f"{group}={','.join(options(group))}", out])
    for launcher in options("hydra/launcher"):
        found.append([*RUN, "--check", "-m", f"hydra/launcher={launcher}", "policy=snapkv,restkv", "bench=micro", out])
    found.append([*LATENCY, "--check", "-m", f"latency={','.join(options('latency'))}"])
    return found


def test_every_preset_and_option_starts_or_is_refused_in_one_line() -> None:
    found = commands()
    assert len(found) > 20  # every experiment preset, group and launcher is there
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(run, found))
    for command, done in zip(found, results, strict=True):
        assert_started_or_refused(done, command)
    assert not (ROOT / "results" / ".entry-point-check").exists()


@pytest.mark.parametrize(
    ("command", "says"),
    [
        ([*RUN, "experiment=niah_llama3"], "job 1 of 8 (policy=full budget=128): "),  # was: range_list unsupported
        ([*RUN, "experiment=ruler_llama3"], "job 1 of 5 (policy=full): "),  # was: a 39-line traceback, exit 1
        ([*LATENCY, "latency=tiny", "budgett=3"], "did you mean latency.budgets?"),  # was: Hydra's 7 lines, exit 1
        ([*LATENCY, "latency=tny"], "did you mean tiny?"),
        ([*RUN, "-m", "policy=rkv,snapkv", "policy.mix_lambda=0.5", "bench=micro"], "job 2 of 2 (policy=snapkv): "),
        ([*RUN, "policy=snapkv,restkv", "bench=micro"], "add -m"),
    ],
)
def test_the_commands_of_the_issue_are_refused_in_one_line(command: list[str], says: str) -> None:
    done = run(command)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == "" and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr


def test_ruler_without_punkt_names_the_download() -> None:
    from restkv.eval.benchmarks.ruler.haystacks import _punkt

    if _punkt() is not None:
        pytest.skip("NLTK's punkt data is installed here")
    done = run([*RUN, "experiment=ruler_llama3"])
    assert done.returncode == 2 and "python -m nltk.downloader punkt_tab" in done.stderr, done.stderr


def test_a_sweep_may_put_its_options_anywhere(tmp_path: Path) -> None:
    done = run([*RUN, "bench=micro", "-m", "policy=snapkv,restkv", f"out_dir={tmp_path}", "--check"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "job 2 of 2 (policy=restkv): ready: " in done.stdout and not any(tmp_path.iterdir())


PROGRESS = re.compile(r"\d+%\|")
"""A tqdm progress bar's line."""


def interrupt(command: list[str], after_s: float) -> subprocess.CompletedProcess:
    """``command`` stopped by Ctrl-C (SIGINT to its process group, as a terminal sends it) after ``after_s``."""
    started = subprocess.Popen(
        command,
        cwd=ROOT,
        env=OFFLINE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    time.sleep(after_s)
    os.killpg(started.pid, signal.SIGINT)
    stdout, stderr = started.communicate(timeout=LIMIT_S)
    return subprocess.CompletedProcess(command, started.returncode, stdout, stderr)


@pytest.mark.parametrize("after_s", [0.8, 2.5])
@pytest.mark.parametrize("command", [[*RUN, "bench=micro", "limit=1"], [*LATENCY, "latency=tiny"]], ids=["run", "lat"])
def test_ctrl_c_while_a_command_imports_is_one_line(command: list[str], after_s: float, tmp_path: Path) -> None:
    if command[:2] == RUN:
        command = [*command, f"out_dir={tmp_path}"]
    done = interrupt(command, after_s)
    text = done.stdout + done.stderr
    assert done.returncode in (130, -signal.SIGINT), text[-2000:]  # the shell shows 130 either way
    # on quiet cores the command may be past its imports by then: its progress bars are not messages
    lines = [line for line in text.replace("\r", "\n").splitlines() if line.strip() and not PROGRESS.search(line)]
    assert len(lines) == 1 and lines[0].startswith("stopped"), text[-2000:]
