"""Nothing silent, round three: the rows of issue 44's silent table and unclear groups owned here, one test each.

Run folders read by one reader (symlinks followed, stale metrics or locks unfinished with a note, skipped folders
named), rows labelled by the settings that acted, data records checked by one checker, data edits seen whatever
their size and mtime, the Python API's argument types, one-line errors naming paths and the right option.
"""

from __future__ import annotations

import ast
import errno
import json
import os
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def run_folder(
    root: Path, samples: int = 2, counted: int | None = None, policy: str = "snapkv", leaf: str = "budget64", **config
) -> Path:
    """A run folder as the runner leaves it: ``samples`` predictions, ``metrics.json`` counting ``counted``."""
    folder = root / "micro" / "micro-llama" / policy / leaf
    folder.mkdir(parents=True)
    records = [{"id": f"s{i}", "task": "passkey", "score": 1.0, "new_tokens": 10 + i} for i in range(samples)]
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    counted = samples if counted is None else counted
    metrics = {
        "average": 100.0,
        "tasks": {"passkey": 100.0},
        "samples": {"passkey": counted},
        "bench": "micro",
        "model": "micro-llama",
        "policy": policy,
        "budget": "64",
        "protocol": "query_aware",
        "ran": {"tasks": ["passkey"], "samples": counted, "limit": None},
    }
    (folder / "metrics.json").write_text(json.dumps(metrics))
    (folder / "config.yaml").write_text(yaml.safe_dump({"budget": 64, "protocol": "query_aware", **config}))
    return folder


def load(root: Path) -> tuple[list, list[str]]:
    from restkv.eval.report.collect import load_runs

    notes: list[str] = []
    return load_runs(root, notes), notes


def load_script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- silent rows ---------------------------------------------------------------------------------------------------


def test_a_symlinked_run_folder_is_followed(tmp_path: Path) -> None:
    real = run_folder(tmp_path / "elsewhere")
    link = tmp_path / "results" / "micro" / "micro-llama" / "snapkv" / "budget64"
    link.parent.mkdir(parents=True)
    link.symlink_to(real, target_is_directory=True)
    (tmp_path / "results" / "micro" / "micro-llama" / "snapkv" / "budget128").symlink_to(tmp_path / "gone")
    runs, notes = load(tmp_path / "results")
    assert [run.folder for run in runs] == [link]
    assert any("budget128" in note and "broken link" in note for note in notes)  # a skipped folder is named


def test_a_killed_extension_is_unfinished_not_finished(tmp_path: Path) -> None:
    folder = run_folder(tmp_path, samples=20, counted=8)  # limit=40 killed at 20 lines; metrics.json says 8
    (folder / ".lock").write_text('{"pid": 999999}\n')  # the killed run's lock, no live holder
    runs, notes = load(tmp_path)
    assert runs == []
    (note,) = notes
    assert str(folder) in note and "holds 20 samples but metrics.json counts 8" in note and "unfinished" in note


def test_stale_metrics_after_a_full_disk_are_flagged(tmp_path: Path) -> None:
    folder = run_folder(tmp_path, samples=8, counted=2)
    runs, notes = load(tmp_path)
    assert runs == [] and len(notes) == 1 and str(folder) in notes[0] and "counts 2" in notes[0]


def test_a_stale_lock_is_noted_by_plot_long_outputs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = run_folder(tmp_path)
    (folder / ".lock").touch()
    plots = load_script("plot_long_outputs")
    assert plots.main(["lengths", "--runs", str(tmp_path), "--out", str(tmp_path / "figures")]) == 2
    err = capsys.readouterr().err
    assert f"note: left out {folder}" in err and "no live holder" in err
    (folder / ".lock").unlink()  # the same folder without its stale lock is drawn
    assert plots.main(["lengths", "--runs", str(tmp_path), "--out", str(tmp_path / "figures")]) == 0


def test_decode_time_and_multi_turn_runs_show_the_settings_that_acted(tmp_path: Path) -> None:
    from restkv.eval.report.table import run_table

    decode = {"compression": {"phase": "decode", "decode_budget": 48, "decode_interval": 8}}
    run_folder(tmp_path, leaf="budget128-aaaaaaaa", **decode)
    turns = {"evaluation": {"_target_": "restkv.eval.evaluation.MultiTurn", "append_answers": True}}
    run_folder(tmp_path, leaf="budget64-bbbbbbbb", **turns)
    table = run_table(tmp_path, resamples=50)
    rows = table[(table.task == "average") & (table.length == "all")].set_index("variant")
    assert rows.loc["aaaaaaaa", ["budget", "phase", "decode_budget", "decode_interval"]].tolist() == [
        "-",
        "decode",
        "48",
        "8",
    ]
    assert rows.loc["bbbbbbbb", ["budget", "phase", "evaluation", "protocol"]].tolist() == [
        "64",
        "prefill",
        "multi_turn",
        "query_agnostic",
    ]


def test_an_empty_math_problem_is_refused_naming_file_and_line(tmp_path: Path) -> None:
    from restkv.eval.benchmarks.math import MathBenchmark

    good = {"problem": "1+1?", "answer": "2", "unique_id": "a"}
    lines = [good, {**good, "problem": "", "unique_id": "b"}]
    (tmp_path / "math500.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(ValueError, match=r"math500\.jsonl:2: math task 'math500': field 'problem' is empty"):
        MathBenchmark(tasks=["math500"], data_dir=str(tmp_path)).load_samples(None)


@pytest.mark.parametrize("answer", [None, {"v": 1}, ""])
def test_a_null_or_object_scbench_answer_is_refused(tmp_path: Path, answer: object) -> None:
    from restkv.eval.benchmarks.scbench import SCBenchBenchmark

    turns = [{"input": "q1", "answer": "a"}, {"input": "q2", "answer": answer}]
    (tmp_path / "scbench_kv.jsonl").write_text(json.dumps({"id": 0, "context": "c", "multi_turns": turns}) + "\n")
    with pytest.raises(ValueError, match=r"scbench_kv\.jsonl:1: SCBench task 'kv': field 'multi_turns\[1\]\.answer'"):
        SCBenchBenchmark(tasks=["kv"], data_dir=str(tmp_path)).load_samples(None)


def test_a_data_file_edited_in_place_with_size_and_mtime_kept_is_hashed_again(tmp_path: Path, monkeypatch) -> None:
    from restkv.eval.models.fingerprint import file_digests

    monkeypatch.setenv("RESTKV_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "niah_single_1.jsonl"
    data.write_text(json.dumps({"input": "x", "outputs": ["1234"]}) + "\n")
    old = data.stat()
    os.utime(data, ns=(old.st_atime_ns, old.st_mtime_ns - 10**10))  # older than the racy window: cached
    before = data.stat()
    first = file_digests([data])[data]
    assert file_digests([data])[data] == first  # from the cache
    data.write_text(json.dumps({"input": "x", "outputs": ["9876"]}) + "\n")  # same size
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))  # touch -r: the mtime put back
    assert (data.stat().st_size, data.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert file_digests([data])[data] != first


# --- unclear groups ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task", "record", "field"),
    [
        ("math500", {"problem": "1+1?", "answer": "2"}, "unique_id"),  # was a raw KeyError
        ("aime24", {"problem": "1+1?", "answer": None, "id": 3}, "answer"),
    ],
)
def test_malformed_math_records_name_file_line_and_field(tmp_path: Path, task: str, record: dict, field: str) -> None:
    from restkv.eval.benchmarks.math import MathBenchmark
    from restkv.eval.benchmarks.shared.jsonl import DataFileError

    (tmp_path / f"{task}.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(DataFileError, match=rf"{task}\.jsonl:1: .*'{field}'"):
        MathBenchmark(tasks=[task], data_dir=str(tmp_path)).load_samples(None)


def test_a_scbench_record_without_id_or_turn_input_names_the_field(tmp_path: Path) -> None:
    from restkv.eval.benchmarks.scbench import SCBenchBenchmark
    from restkv.eval.benchmarks.shared.jsonl import DataFileError

    path = tmp_path / "scbench_kv.jsonl"
    for record, field in [
        ({"context": "c", "multi_turns": [{"input": "q", "answer": "a"}]}, "id"),
        ({"id": 1, "context": "c", "multi_turns": [{"answer": "a"}]}, r"multi_turns\[0\]\.input"),
    ]:
        path.write_text(json.dumps(record) + "\n")
        with pytest.raises(DataFileError, match=rf"scbench_kv\.jsonl:1: .*missing field '{field}'"):
            SCBenchBenchmark(tasks=["kv"], data_dir=str(tmp_path)).load_samples(None)


def test_the_python_api_names_a_wrongly_typed_argument() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from restkv import ReSTKV, compress

    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=64,
    )
    model = LlamaForCausalLM(config)
    with pytest.raises(TypeError, match=r"^compress: policy must be a policy object .*got str 'restkv'.*get_policy"):
        compress(model, "restkv", 64)
    with pytest.raises(TypeError, match=r"^compress: decode_eviction must be .*DecodeEviction.*, got dict"):
        compress(model, ReSTKV(), 64, decode_eviction={"budget": 16})
    with pytest.raises(TypeError, match=r"^compress: budget must be an int .*got str '64'"):
        compress(model, ReSTKV(), "64")


def test_plot_long_outputs_reads_a_torn_line_and_corrupt_metrics_in_one_line(tmp_path: Path, capsys) -> None:
    torn = run_folder(tmp_path)
    with (torn / "predictions.jsonl").open("a") as f:
        f.write('{"id": "s9", "ta')  # a run killed mid-write
    corrupt = run_folder(tmp_path, policy="h2o")
    (corrupt / "metrics.json").write_text('{"average": 1')
    plots = load_script("plot_long_outputs")
    assert plots.main(["lengths", "--runs", str(tmp_path), "--out", str(tmp_path / "figures")]) == 0  # torn: drawn
    err = capsys.readouterr().err
    assert "JSONDecodeError" not in err and "Traceback" not in err
    assert f"{torn}: 1 unreadable line(s)" in err and f"{corrupt / 'metrics.json'} cannot be read" in err


def test_a_full_disk_names_the_file_it_could_not_write(tmp_path: Path) -> None:
    from restkv.eval.harness.errors import user_message
    from restkv.eval.harness.run_folder import PredictionLog

    log = PredictionLog(tmp_path)
    log._file.close()

    class FullDisk:
        """A file on a full disk: every write raises ENOSPC naming no file, as the kernel's error does."""

        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    log._file = FullDisk()
    with pytest.raises(OSError) as caught:
        log.append({"id": "a", "task": "t", "score": 1.0})
    assert caught.value.errno == errno.ENOSPC
    assert user_message(caught.value).startswith(f"No space left on device: {tmp_path / 'predictions.jsonl'}; ")


def test_make_figures_hints_name_its_out_option(tmp_path: Path, capsys, monkeypatch) -> None:
    from restkv.eval.report import artifacts

    run_folder(tmp_path)

    def refused(path: Path, text: str) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(artifacts, "write_atomically", refused)
    figures = load_script("make_figures")
    with pytest.raises(SystemExit) as ended:
        figures.main(["table", "--runs", str(tmp_path), "--out", str(tmp_path / "figures")])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and "(--out DIR)" in err and "out_dir=" not in err


# --- structure -----------------------------------------------------------------------------------------------------

READER = {"eval/harness/folder_state.py", "eval/harness/run_folder.py"}
"""The one reader of run folders, and the runner's writer (which reads back what it wrote through the same code)."""
RUN_FILE = r"""(PREDICTIONS|METRICS|["'](predictions\.jsonl|metrics\.json)["'])"""
PARSING = [
    re.compile(RUN_FILE + r"\s*\)?\s*\.(read_text|read_bytes|open)\("),  # (folder / "metrics.json").read_text()
    re.compile(r"\bopen\([^)]*" + RUN_FILE),  # open(folder / PREDICTIONS)
    re.compile(r"r?glob\(\s*" + RUN_FILE),  # rglob("metrics.json"): a second finder of run folders
]


def test_no_module_parses_run_folders_outside_the_reader() -> None:
    offenders = []
    for path in sorted([*ROOT.glob("eval/**/*.py"), *ROOT.glob("restkv/**/*.py"), *ROOT.glob("scripts/*.py")]):
        name = path.relative_to(ROOT).as_posix()
        if name in READER or path.is_symlink():
            continue
        text = path.read_text(encoding="utf-8")
        ast.parse(text)  # a real module
        offenders += [f"{name}: {m.group(0)}" for pattern in PARSING for m in pattern.finditer(text)]
    assert offenders == [], "read run folders through restkv.eval.harness.folder_state instead"
