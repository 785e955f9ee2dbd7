"""Nothing silent, round two: every case a hostile but fair user found is refused clearly or handled right.

Each test names the case it covers. Mechanisms first: capacities validated where they are computed, every
input file a run reads hashed into its identity, scores range-checked on write and read, the predictions
file's last line repaired before an append, one reader of run folders for the runner and the report, and
one handler of file-system errors around a run.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from restkv.registry import get_policy
from restkv.stages.allocation import headkv_capacities, load_head_scores, top_positions

# -- head-wise capacities -----------------------------------------------------------------------------------


def test_head_beta_below_one_is_refused():
    """``policy.head_beta=0.5`` kept 426 of 476 tokens per head under "budget 64": below 1 HeadKV's pool exceeds
    the budget and the least important heads get negative budgets."""
    with pytest.raises(ValueError, match=r"HeadKV.head_beta=0.5 is not allowed; it must be a number in \[1, inf\]"):
        get_policy("headkv", head_beta=0.5)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"0-0": [-1.0, 2.0]}', r"must map to a non-empty list of finite numbers >= 0"),
        ('{"0-0": [true, false]}', r"must map to a non-empty list of finite numbers >= 0"),
        ('{"0-0": [NaN]}', r"must map to a non-empty list of finite numbers >= 0"),
        ("{}", r"must be a non-empty JSON object"),
        ("[1, 2]", r"must be a non-empty JSON object"),
    ],
)
def test_head_files_with_negative_boolean_or_no_scores_are_refused(tmp_path, content, message):
    path = tmp_path / "heads.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_head_scores(path, 1, 1)


def test_a_head_file_that_is_not_text_is_refused(tmp_path):
    path = tmp_path / "heads.json"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ValueError, match=r"is not UTF-8 text"):
        load_head_scores(path, 1, 1)


def test_capacities_are_checked_where_they_are_computed():
    with pytest.raises(ValueError, match="must not be negative"):
        headkv_capacities(torch.tensor([[1.0, -0.5]]), 64, 1.01)
    assert (headkv_capacities(torch.tensor([[1.0, 0.0, 3.0]]), 64, 1.0) >= 0).all()
    with pytest.raises(ValueError, match=r"head budgets \[-2, 5\] must lie in \[0, 10\]"):
        top_positions(torch.randn(2, 10), torch.tensor([-2, 5]), 4)
    with pytest.raises(ValueError, match=r"must lie in \[0, 10\]"):
        top_positions(torch.randn(2, 10), torch.tensor([11, 5]), 4)


# -- data a run reads belongs to its identity ---------------------------------------------------------------


def _compose(out, *overrides):
    from hydra import compose, initialize_config_dir

    import restkv.eval.harness.runner  # noqa: F401  (registers the config resolvers)
    from restkv.eval.run import CONFIGS

    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return compose(config_name="config", overrides=[f"out_dir={out}", *overrides])


def _run(out, policy: str, *overrides: str) -> dict:
    """One in-process run of eval/run.py's code (the folder named as eval/run.py names it)."""
    from restkv.eval.harness.runner import RunSettings, run_benchmark
    from restkv.eval.run import other_overrides

    settings = RunSettings("micro", "micro-llama", policy, overrides=other_overrides(list(overrides)), out_dir=out)
    return run_benchmark(_compose(out, "bench=micro", f"policy={policy}", *overrides), settings)


MICRO = ("bench.lengths=[512]", "bench.tasks=[micro_single_1]", "budget=64")


def test_a_head_file_edited_between_two_runs_of_one_folder_is_another_experiment(tmp_path):
    """The identity held the head file's path only: an edited file resumed silently (96 then 132 tokens kept)."""
    from restkv.eval.harness.identity import IdentityMismatch

    heads = tmp_path / "heads.json"
    heads.write_text(Path("models/micro-llama/head_scores.json").read_text())
    _run(tmp_path / "out", "headkv", *MICRO, "limit=1", f"policy.head_scores={heads}")
    scores = json.loads(heads.read_text())
    first = next(iter(scores))
    scores[first] = [value + 1.0 for value in scores[first]]
    heads.write_text(json.dumps(scores))
    with pytest.raises(IdentityMismatch, match=r"inputs\..*heads\.json: 'sha256:"):
        _run(tmp_path / "out", "headkv", *MICRO, "limit=2", f"policy.head_scores={heads}")


def test_ruler_files_whose_answers_change_are_another_experiment(tmp_path):
    """RULER files under bench.data_dir with other answers resumed beside the old records."""
    from test_ruler_files import prepare_layout

    from restkv.eval.harness.identity import IdentityMismatch
    from restkv.eval.harness.runner import RunSettings, run_benchmark

    data = prepare_layout(tmp_path / "ruler")
    overrides = (
        f"bench.data_dir={data}",
        "bench.lengths=null",
        "bench.samples=null",
        "limit=1",
        "budget=64",
        "model=tiny-random-llama",
        "policy.window=8",
        "bench.tasks=[niah_single_1]",
    )
    settings = RunSettings("ruler", "tiny-random-llama", "restkv", overrides=[], out_dir=tmp_path / "out")
    run_benchmark(_compose(tmp_path / "out", "bench=ruler", *overrides), settings)
    task_file = sorted(data.rglob("niah_single_1/validation.jsonl"))[0]
    records = [json.loads(line) for line in task_file.read_text().splitlines()]
    records[0]["outputs"] = ["7654321"]  # the same prompt, another answer
    task_file.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(IdentityMismatch, match=r"inputs\..*validation.jsonl"):
        run_benchmark(_compose(tmp_path / "out", "bench=ruler", *overrides), settings)


def test_old_identities_without_data_hashes_still_resume_and_say_so(tmp_path, capsys):
    _run(tmp_path, "snapkv", *MICRO, "limit=1")
    (identity,) = tmp_path.rglob("identity.json")
    saved = json.loads(identity.read_text())
    del saved["inputs"]
    identity.write_text(json.dumps(saved))
    _run(tmp_path, "snapkv", *MICRO, "limit=2")
    assert "predates data-file hashing" in capsys.readouterr().out


# -- files and scores that cannot be trusted ------------------------------------------------------------------


def test_an_empty_or_blank_longbench_task_file_is_refused():
    from restkv.eval.benchmarks.shared.jsonl import DataFileError, JsonlSource, iter_lines, task_records

    for text in (b"", b"\n   \n"):
        source = JsonlSource("qasper.jsonl", iter_lines(text.splitlines(keepends=True), "qasper.jsonl"))
        with pytest.raises(DataFileError, match=r"qasper.jsonl: LongBench task 'qasper': the file holds no record"):
            list(task_records(source, {}, benchmark="LongBench", task="qasper", id_field="_id"))


@pytest.mark.parametrize("score", [55, -0.5, 1.5])
def test_scores_outside_zero_one_are_refused_on_write_and_on_read(tmp_path, score):
    from restkv.eval.harness.run_folder import PredictionLog, PredictionsError

    with PredictionLog(tmp_path) as log:
        with pytest.raises(PredictionsError, match=r"is outside \[0, 1\]"):
            log.append({"id": "a", "task": "t", "score": score})
        log.append({"id": "b", "task": "t", "score": 1})
    with (tmp_path / "predictions.jsonl").open("a") as handle:
        handle.write(json.dumps({"id": "c", "task": "t", "score": score}) + "\n")
    with pytest.raises(PredictionsError, match=r"predictions.jsonl:2: sample 'c': score .* is outside \[0, 1\]"):
        PredictionLog(tmp_path)


def test_a_last_line_without_its_newline_is_ended_before_the_next_append(tmp_path, capsys):
    """The next record was glued onto it; the following resume then set both aside and redid them."""
    from restkv.eval.harness.run_folder import PredictionLog

    (tmp_path / "predictions.jsonl").write_text(json.dumps({"id": "a", "task": "t", "score": 1.0}))
    with PredictionLog(tmp_path) as log:
        log.append({"id": "b", "task": "t", "score": 0.0})
    assert "its last line had no line end" in capsys.readouterr().out
    assert set(PredictionLog(tmp_path).records) == {"a", "b"}
    assert not (tmp_path / "predictions.corrupt.jsonl").exists()


def test_a_rerun_with_a_lower_limit_keeps_the_whole_folders_metrics(tmp_path, capsys):
    _run(tmp_path, "snapkv", *MICRO, "limit=4")
    (metrics,) = tmp_path.rglob("metrics.json")
    before = json.loads(metrics.read_text())
    _run(tmp_path, "snapkv", *MICRO, "limit=2")
    after = json.loads(metrics.read_text())
    assert after["average"] == before["average"] and after["ran"]["samples"] == 4
    assert "metrics.json covers all 4 samples this folder holds" in capsys.readouterr().out


def test_budget_one_point_zero_is_refused_as_ambiguous():
    from restkv.select import Budget

    with pytest.raises(ValueError, match=r"budget=1.0 is ambiguous.*policy=full.*budget=1"):
        Budget(1.0)
    assert Budget(128.0).value == 128 and Budget(0.5).is_ratio


# -- the report reads folders as the runner does, and never hides or mixes runs ---------------------------------


def _report(root: Path):
    from restkv.eval.report.artifacts import build_report

    return build_report(root, root / "figures")


def _headline(report) -> list[tuple[str, str, float, int]]:
    rows = report.headline()
    return [(r.policy, r.budget, round(r.score, 1), r.samples) for r in rows.itertuples()]


def _one_run(root: Path, **options) -> Path:
    from test_report import write_run

    return write_run(
        root,
        "micro",
        options.pop("policy", "snapkv"),
        options.pop("budget", 64),
        0.5,
        samples=2,
        lengths=(1024,),
        tasks=("passkey",),
        **options,
    )


def test_an_empty_predictions_file_beside_valid_metrics_keeps_the_run(tmp_path):
    """The run vanished from the table; it is now shown from its metrics.json, without an interval."""
    folder = _one_run(tmp_path)
    (folder / "predictions.jsonl").write_text("")
    report = _report(tmp_path)
    ((policy, budget, score, _),) = _headline(report)
    assert (policy, budget) == ("snapkv", "64")
    assert score == json.loads((folder / "metrics.json").read_text())["average"]


def test_a_run_still_writing_is_left_out_and_said_so(tmp_path):
    """A locked folder showed as a finished row (5 samples, 80.0)."""
    from restkv.eval.harness.run_folder import RunLock

    folder = _one_run(tmp_path)
    with RunLock(folder):
        report = _report(tmp_path)
        assert report.headline().empty
        assert any("a run is still writing it (2 samples so far)" in note for note in report.notes)
    assert len(_report(tmp_path).headline()) == 1


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"id": "x", "task": "passkey", "score": NaN}', "is not a finite number"),
        ('{"id": "x", "task": "passkey", "score": 55}', r"is outside \[0, 1\]"),
        ('{"id": "x", "task": "passkey", "score": "1"}', "is a string, not a number"),
    ],
)
def test_a_score_the_runner_would_refuse_leaves_the_run_out_with_the_line_named(tmp_path, line, says):
    """A NaN score showed 66.7 over 4 samples without an interval; 55 made a table average of 1425.0."""
    folder = _one_run(tmp_path)
    with (folder / "predictions.jsonl").open("a") as log:
        log.write(line + "\n")
    report = _report(tmp_path)
    assert report.headline().empty
    (note,) = report.notes
    assert "predictions.jsonl:3: sample 'x'" in note and re.search(says, note)


@pytest.mark.parametrize(
    ("metrics", "says"),
    [
        ("{not json", "cannot be read"),
        ('{"average": "n/a", "tasks": {}}', "its 'average' is 'n/a', not a number or null"),
        ("[]", "is list, not the object a run writes"),
        ('{"average": 50.0, "tasks": {"passkey": "x"}}', "its 'tasks' is not a mapping of task names to numbers"),
    ],
)
def test_a_metrics_file_that_cannot_be_used_is_named_not_fatal(tmp_path, metrics, says):
    """A corrupt metrics.json refused the whole report; "n/a" and [] raised tracebacks."""
    _one_run(tmp_path, policy="full")
    folder = _one_run(tmp_path)
    (folder / "metrics.json").write_text(metrics)
    report = _report(tmp_path)
    assert [row[0] for row in _headline(report)] == ["full"]
    (note,) = report.notes
    assert str(folder / "metrics.json") in note and says in note and "run the same command again" in note


def test_a_corrupt_config_yaml_is_named_not_fatal(tmp_path):
    folder = _one_run(tmp_path)
    (folder / "config.yaml").write_text("policy: [unclosed\n")
    report = _report(tmp_path)
    assert report.headline().empty
    (note,) = report.notes
    assert "config.yaml cannot be read" in note and "run the same command again to rewrite it" in note


@pytest.mark.parametrize(
    "line",
    [b'{"id": "x", "score": 1.0}\n', b"\xff\xfe\x00\x01 binary\n", b'{"id": "y", "task": "passkey", "sco'],
    ids=["record-without-task", "binary-bytes", "torn-line"],
)
def test_unreadable_lines_are_counted_out_with_a_note_and_the_run_stays(tmp_path, line):
    """A record without task, binary bytes or one torn line raised or blocked the whole report, no fix named."""
    folder = _one_run(tmp_path)
    with (folder / "predictions.jsonl").open("ab") as log:
        log.write(line)
    report = _report(tmp_path)
    ((_, _, _, samples),) = _headline(report)
    assert samples == 2
    (note,) = report.notes
    assert "1 unreadable line(s)" in note and "run the same command again to redo those samples" in note


def test_sibling_folders_are_labelled_and_drawn_as_their_own_curve(tmp_path):
    """``on_change=new_folder`` runs got a budget of "64~2" and vanished from budget curves."""
    from restkv.eval.report.accuracy import budgets

    for budget in (64, 128):
        _one_run(tmp_path, budget=budget)
        sibling = _one_run(tmp_path / "elsewhere", budget=budget)
        target = tmp_path / "micro" / "micro-llama" / "snapkv" / f"budget{budget}~2"
        sibling.rename(target)
    report = _report(tmp_path)
    rows = report.headline()
    assert sorted(zip(rows.budget, rows.sibling, strict=True)) == [("128", ""), ("128", "2"), ("64", ""), ("64", "2")]
    assert len(budgets(report)) == 2  # png + pdf: both series drawn (checked below through the labels)
    from restkv.eval.report.accuracy import _label

    assert {_label(r) for _, r in rows.iterrows()} == {"snapkv", "snapkv ~2"}


def test_runs_under_other_layouts_or_quantization_settings_get_rows_of_their_own(tmp_path):
    """Three layouts collapsed into one row (the masked run's bytes), two quantization group sizes into one."""
    from restkv.eval.report.accuracy import _row_labels

    for index, layout in enumerate(("auto", "varlen", "masked")):
        folder = _one_run(tmp_path, policy="adakv", variant=f"l{index}")
        config = yaml.safe_load((folder / "config.yaml").read_text())
        (folder / "config.yaml").write_text(yaml.safe_dump({**config, "layout": layout}))
    for index, group in enumerate((32, 64)):
        quant = {"backend": "kivi", "nbits": 2, "group_size": group}
        _one_run(tmp_path, policy="snapkv", variant=f"q{index}", quant=quant)
    rows = _report(tmp_path).headline()
    assert len(rows) == 5
    labels = _row_labels(rows)
    assert len(set(labels)) == 5, labels
    assert any("layout=varlen" in label for label in labels) and any("layout=masked" in label for label in labels)


def test_one_setting_in_two_nested_out_dirs_is_two_labelled_series(tmp_path):
    """Nested out_dirs (limit 2 and 4) made two points at one budget joined vertically, legend n=4."""
    from restkv.eval.report.accuracy import _label

    for source in ("limit2", "limit4"):
        for budget in (64, 128):
            _one_run(tmp_path / source, budget=budget)
    rows = _report(tmp_path).headline()
    assert sorted({_label(r) for _, r in rows.iterrows()}) == ["snapkv [limit2]", "snapkv [limit4]"]


def test_a_truncated_latency_record_is_named(tmp_path):
    """It was skipped with "nothing (no runs fit)" and no word about the file."""
    (tmp_path / "efficiency").mkdir()
    (tmp_path / "efficiency" / "tiny.json").write_text('{"settings": {"name": "tiny"}, "prefill": [')
    report = _report(tmp_path)
    (note,) = report.notes
    assert "tiny.json: not readable JSON" in note and "run its benchmark again" in note


# -- refusals before any work, one line each ----------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]


def _refused(tmp_path: Path, *overrides: str) -> str:
    from test_bad_inputs import error_of

    return error_of(tmp_path, *overrides, base=["bench=micro", "bench.lengths=[512]", "limit=1", "budget=64"])


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["policy=adakv", "quantization=kivi"], r"allocation='adakv' is not dense: use layout='auto'"),
        (["layout=masked", "quantization=kivi"], r"layout='masked' is not dense"),
        (["layout=varlen", "quantization=kivi"], r"layout='varlen' is not dense"),
        (["policy.gqa=expand", "quantization=kivi"], r"gqa='expand' on a grouped-query model stores query heads"),
        (["policy=cam", "policy.gqa=expand"], r"merge='cam' with gqa='expand' on a model with grouped key/value"),
    ],
)
def test_storage_that_cannot_work_is_refused_before_the_model_loads(tmp_path, monkeypatch, overrides, says):
    """Two of these failed after the model loaded and the folder existed."""
    from restkv.eval.harness import runner

    def no_model(*_):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(runner, "load_model", no_model)
    assert re.search(says, _refused(tmp_path, "policy=snapkv", *overrides))


def test_a_head_file_with_no_scores_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    from restkv.eval.harness import runner

    monkeypatch.setattr(runner, "load_model", lambda *_: pytest.fail("the model was loaded before the refusal"))
    heads = tmp_path / "heads.json"
    heads.write_text("{}")
    found = _refused(tmp_path, "policy=headkv", f"policy.head_scores={heads}")
    assert f"head-importance file {heads} must be a non-empty JSON object" in found


@pytest.mark.parametrize("name", [".lock", "predictions.jsonl", "metrics.json"])
def test_a_folder_where_a_run_file_belongs_is_refused_before_the_work(tmp_path, name):
    """``metrics.json`` as a directory failed after all the work, with a raw IsADirectoryError."""
    from restkv.eval.harness.run_folder import RunFolderError

    _run(tmp_path, "snapkv", *MICRO, "limit=1")
    (folder,) = {p.parent for p in tmp_path.rglob("config.yaml")}
    target = folder / name
    if target.is_file():
        target.unlink()
    target.mkdir()
    with pytest.raises(RunFolderError, match=rf"{re.escape(str(target))} is not a file \(a folder stands there\)"):
        _run(tmp_path, "snapkv", *MICRO, "limit=2")


def test_a_corrupt_identity_can_be_adopted_as_the_message_says(tmp_path):
    """The message suggested on_change=adopt, which then refused with the same message."""
    from restkv.eval.harness.identity import IdentityMismatch

    _run(tmp_path, "snapkv", *MICRO, "limit=1")
    (identity,) = tmp_path.rglob("identity.json")
    identity.write_text("garbage{")
    with pytest.raises(IdentityMismatch, match="pass on_change=adopt"):
        _run(tmp_path, "snapkv", *MICRO, "limit=2")
    _run(tmp_path, "snapkv", *MICRO, "limit=2", "on_change=adopt")
    assert json.loads(identity.read_text())["config"]["budget"] == 64
    assert not list(tmp_path.rglob("identity.tmp"))


def test_a_full_disk_while_writing_the_identity_leaves_no_temporary_file(tmp_path, monkeypatch):
    """A full disk on resume left ``identity.tmp`` behind."""
    import errno

    from restkv.eval.harness import identity

    real_write = Path.write_text

    def full_disk(self, text, *args, **kwargs):
        real_write(self, text[:10], *args, **kwargs)  # part of it reached the disk
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OSError, match="No space left"):
        identity._write(tmp_path / "identity.json", {"config": {}})
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_compress_names_a_quantization_given_as_text(make_model):
    """``compress(..., quantization="kivi")`` failed with "'str' object has no attribute 'enabled'"."""
    from restkv import compress

    with pytest.raises(TypeError, match=r"compress\(quantization=...\) takes a restkv.Quantization, .* got 'kivi'"):
        compress(make_model(), get_policy("snapkv"), 64, quantization="kivi")


def test_file_system_errors_become_one_line_with_the_way_out():
    import errno

    from restkv.eval.harness.errors import user_message

    full = OSError(errno.ENOSPC, "No space left on device", "/data/run/predictions.jsonl")
    assert user_message(full) == (
        "No space left on device: /data/run/predictions.jsonl; the disk is full: free some space, then run the "
        "same command again (finished samples are kept)"
    )
    assert "not writable by you" in user_message(PermissionError(errno.EACCES, "Permission denied", "/ro"))
    assert user_message(KeyError("bug")) is None  # a bug keeps its traceback


def test_latency_budgets_above_the_context_are_noted():
    """The SnapKV/ReST-KV rows were absent (budget above the context) without a note."""
    from types import SimpleNamespace

    from restkv.eval.latency.records import skipped_budgets

    settings = SimpleNamespace(contexts=[512, 2048], budgets=[1024], decode_budgets=[256, 1024])
    assert skipped_budgets(settings) == [
        "prefill at 512 tokens: budget(s) 1024 not measured, they keep the whole context (a budget must be below "
        "the context to evict anything)",
        "decode at 512 tokens: budget(s) 1024 not measured, they keep the whole context (a budget must be below "
        "the context to evict anything)",
    ]


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (
            ["eval/run.py", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=0", "bench=micro"],
            "hydra.launcher.n_jobs=0 is not allowed; use a positive integer, or -1",
        ),
        (
            ["-m", "restkv.eval.latency", "latency=tiny", "latency.contexts=[256,abc]"],
            "latency.contexts=[256, 'abc']: lengths must be positive integers",
        ),
        (
            ["eval/run.py", "bench=longbench", "bench.data_dir={tmp}/none", "bench.hub=false", "bench.tasks=[qasper]"],
            "LongBench data missing: {tmp}/none/qasper.jsonl. The hub was not used: it is off (bench.hub=false). "
            "To get the data, run `python scripts/download_data.py longbench`",
        ),
        (
            ["eval/run.py", "bench=micro", "out_dir={tmp}/a_file/results"],
            "out_dir='{tmp}/a_file/results' is not allowed: {tmp}/a_file is a file, not a folder",
        ),
        (
            ["scripts/make_figures.py", "table", "--runs", "{tmp}", "--out", "{tmp}/a_file/figures"],
            "--out {tmp}/a_file/figures: {tmp}/a_file is a file, not a folder; choose another output folder",
        ),
        (["scripts/compare_policies.py", "--policies", "snapkv", "nope"], "--policies: unknown nope; known: "),
        pytest.param(
            ["scripts/compare_policies.py", "--policies", "kvpress"],
            "--policies kvpress: ",
            marks=pytest.mark.skipif(bool(importlib.util.find_spec("kvpress")), reason="kvpress installed"),
        ),
        (
            ["scripts/compare_policies.py", "--quant", "--quant-group-size", "7"],
            "--quant-group-size 7 must divide the model's key/value row (64 = kv heads x head_dim)",
        ),
        (
            ["scripts/compare_policies.py", "--quant-group-size", "32"],
            "--quant-group-size 32 applies to the quantization table: add --quant (or --all)",
        ),
    ],
    ids=[
        "n_jobs",
        "latency-contexts",
        "longbench-offline",
        "parent-is-a-file",
        "figures-out",
        "compare-policy",
        "compare-kvpress-missing",
        "compare-group",
        "compare-group-without-table",
    ],
)
def test_command_line_refusals_are_one_line_exit_two(tmp_path, command, says):
    import subprocess
    import sys

    (tmp_path / "a_file").write_text("")
    command = [part.replace("{tmp}", str(tmp_path)) for part in command]
    if command[0] == "eval/run.py":
        command.append(f"hydra.run.dir={tmp_path}/h")
    done = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert says.replace("{tmp}", str(tmp_path)) in done.stderr, done.stderr[-2000:]
