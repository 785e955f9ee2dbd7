"""Run folders cannot mix or corrupt results silently: the lock, the predictions checks, strict metrics."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from restkv.eval.harness.run_folder import (
    CORRUPT,
    LOCK,
    METRICS,
    PREDICTIONS,
    PredictionLog,
    PredictionsError,
    RunLock,
    RunLockedError,
    format_table,
    summarize,
    write_metrics,
)

# Takes the lock on argv[1], says so on stdout, then holds it until its stdin is closed.
HOLDER = """
import sys
from pathlib import Path
from restkv.eval.harness.run_folder import RunLock
with RunLock(Path(sys.argv[1])):
    print("locked", flush=True)
    sys.stdin.read()
"""


@contextmanager
def lock_held_elsewhere(folder: Path) -> Iterator[subprocess.Popen[str]]:
    """A second process holding ``folder``'s lock for the duration (no sleeps: it reports when it holds it)."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "locked\n"
        yield process
    finally:
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()  # the holder's stdin closing is its signal to release and exit
        process.wait(timeout=60)


def test_a_second_process_is_refused_with_who_holds_the_lock(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    with lock_held_elsewhere(folder) as holder:
        with pytest.raises(RunLockedError) as refused, RunLock(folder):
            pytest.fail("the lock was taken twice")
        message = str(refused.value)
        assert message.startswith(f"{folder} is in use by process {holder.pid} on host {socket.gethostname()} since ")
        assert message.endswith(
            ": a second run there would mix its results in. "
            "Wait for that run to finish, or pass another out_dir=... to run beside it"
        )
        assert refused.value.holder is not None and refused.value.holder["pid"] == holder.pid
        assert not (folder / PREDICTIONS).exists()
    with RunLock(folder) as lock:  # released when the holder finished
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    assert not (folder / LOCK).exists()  # deleted on release: a finished folder keeps no .lock


def test_a_lock_file_deleted_between_open_and_lock_is_opened_again(tmp_path: Path, monkeypatch) -> None:
    """Release deletes the file: a run that opened it just before must lock the new one, not the orphan."""
    from restkv.eval.harness import run_folder

    real_flock, locked = run_folder.fcntl.flock, []

    def flock(fd: int, operation: int) -> None:
        if not locked:
            (tmp_path / LOCK).unlink()  # the previous holder released (deleted) it after our open
        locked.append(fd)
        real_flock(fd, operation)

    monkeypatch.setattr(run_folder.fcntl, "flock", flock)
    with RunLock(tmp_path) as lock:
        assert len(locked) == 2  # the orphan was let go, the file now named .lock was locked
        assert os.fstat(locked[1]).st_ino == (tmp_path / LOCK).stat().st_ino
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()


def test_a_lock_file_left_by_a_killed_run_does_not_block(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    with lock_held_elsewhere(folder) as holder:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=60)
    stale = json.loads((folder / LOCK).read_text())
    assert stale["pid"] == holder.pid  # its text is still there, its lock is not
    with RunLock(folder) as lock:
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()


def test_garbage_in_a_free_lock_file_does_not_block(tmp_path: Path) -> None:
    (tmp_path / LOCK).write_text("not json at all")
    with RunLock(tmp_path) as lock:
        assert json.loads(lock.path.read_text())["host"] == socket.gethostname()


def test_a_held_lock_without_details_yet_is_still_refused(tmp_path: Path) -> None:
    with RunLock(tmp_path) as lock:
        lock.path.write_text("")  # as in the instant between the holder's flock and its write
        with pytest.raises(RunLockedError) as refused, RunLock(tmp_path):
            pytest.fail("the lock was taken twice")
    assert str(refused.value) == (
        f"{tmp_path} is in use by another process (it has not written its PID yet): a second run there would mix "
        "its results in. Wait for that run to finish, or pass another out_dir=... to run beside it"
    )


def record(sample_id: str, score: object = 1.0, **fields: object) -> str:
    values = {"id": sample_id, "task": "t", "prediction": "p", "score": score, "prefill_seconds": 0.1, **fields}
    return json.dumps(values)


def write(folder: Path, *lines: str) -> Path:
    path = folder / PREDICTIONS
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_identical_duplicates_are_collapsed_keeping_the_first(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, record("a"), record("b"), record("a", prefill_seconds=9.0, decode_seconds=2.0))
    before = path.read_text()
    with PredictionLog(tmp_path) as log:
        assert list(log.records) == ["a", "b"] and log.records["a"]["prefill_seconds"] == 0.1
        assert log.duplicates == [f"{path}:3"]
    assert capsys.readouterr().err == f"note: {path}: line(s) 3 repeat identical earlier results; ignored\n"
    assert path.read_text() == before


def test_different_results_for_one_id_name_the_file_both_lines_and_the_id(tmp_path: Path) -> None:
    path = write(tmp_path, record("a"), record("b"), record("a", score=0.0, prediction="q"))
    before = path.read_text()
    with pytest.raises(PredictionsError) as error:
        PredictionLog(tmp_path)
    assert str(error.value) == (
        f"{path}: sample 'a' has two different results, at lines 1 and 3 (they differ in prediction, score): "
        "this folder mixes results of different runs. Keep the right line and delete the other, or move the run "
        "folder away and run again"
    )
    assert path.read_text() == before


@pytest.mark.parametrize(
    ("score", "said"),
    [
        ('"0.5"', 'score "0.5" is a string, not a number'),
        ("true", "score true is a boolean, not a number"),
        ("null", "score null is null, not a number"),
        ("NaN", "score NaN is not a finite number"),
        ("Infinity", "score Infinity is not a finite number"),
        ("-Infinity", "score -Infinity is not a finite number"),
        ("1e999", "score Infinity is not a finite number"),
    ],
)
def test_a_score_that_is_not_a_finite_number_is_refused_with_file_and_line(
    tmp_path: Path, score: str, said: str
) -> None:
    line = '{"id": "b", "task": "t", "prediction": "p", "score": ' + score + "}"
    path = write(tmp_path, record("a"), line, record("c")[:20])  # a torn last line too: nothing is moved
    before = path.read_text()
    with pytest.raises(PredictionsError) as error:
        PredictionLog(tmp_path)
    assert str(error.value) == f"{path}:2: sample 'b': {said}; fix that line, or delete it to have its sample redone"
    assert path.read_text() == before and not (tmp_path / CORRUPT).exists()


def test_a_torn_last_line_is_still_set_aside_and_redone(tmp_path: Path, capsys) -> None:
    torn = record("c")[:25]
    path = write(tmp_path, record("a"), record("b", score=0), torn)
    with PredictionLog(tmp_path) as log:
        assert list(log.records) == ["a", "b"] and not log.done("c")
        assert log.recovered == [f"{path}:3"]
        log.append(json.loads(record("c", score=0.5)))
    assert capsys.readouterr().err == (
        f"warning: unreadable result line {path}:3 moved to {CORRUPT}; its sample will be redone\n"
    )
    assert (tmp_path / CORRUPT).read_text() == torn + "\n"
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["a", "b", "c"]


def test_append_refuses_what_the_next_resume_could_not_read(tmp_path: Path) -> None:
    with PredictionLog(tmp_path) as log:
        log.append(json.loads(record("a")))
        with pytest.raises(PredictionsError) as nan:
            log.append(json.loads(record("b", score=float("nan"))))
        with pytest.raises(PredictionsError) as other:
            log.append(json.loads(record("a", score=0.0)))
        log.append(json.loads(record("a", prefill_seconds=5.0)))  # an identical repeat: not written again
    path = tmp_path / PREDICTIONS
    assert (
        str(nan.value)
        == f"{path}: sample 'b': score NaN is not a finite number; not written: the scorer must return a real number"
    )
    assert str(other.value) == (
        f"{path}: sample 'a' is already recorded with another result (differing in score); not written: "
        "two samples share this id, or two runs share this folder"
    )
    assert path.read_text() == record("a") + "\n"


def test_an_empty_summary_has_no_average_and_prints(tmp_path: Path) -> None:
    summary = summarize([])
    assert summary == {"average": None, "tasks": {}, "samples": {}}
    assert format_table(summary).splitlines()[-1] == "average     n/a     0"
    write_metrics(tmp_path, summary)
    assert json.loads((tmp_path / METRICS).read_text())["average"] is None


def strict(text: str) -> object:
    def refuse(token: str) -> object:
        raise ValueError(f"metrics.json holds {token}, which is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_metrics_json_is_strict_json_with_non_finite_values_as_null(tmp_path: Path, capsys) -> None:
    summary = {
        "average": 50.0,
        "tasks": {"a": 50.0, "b": float("nan")},
        "lengths": {"4096": {"a": float("inf")}},
        "curve": [1.0, float("-inf")],
    }
    path = write_metrics(tmp_path, summary)
    assert strict(path.read_text()) == {
        "average": 50.0,
        "tasks": {"a": 50.0, "b": None},
        "lengths": {"4096": {"a": None}},
        "curve": [1.0, None],
    }
    assert capsys.readouterr().err == (
        f"warning: {path}: non-finite value(s) written as null: tasks.b, lengths.4096.a, curve[1]\n"
    )
    assert summary["tasks"]["b"] != summary["tasks"]["b"]  # the caller's summary is left as it was
