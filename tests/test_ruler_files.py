"""Official RULER files (bench.data_dir): both layouts scored end to end, and bad folders named.

The files are written here the way the official generator writes them: ``input`` is the prompt up to
the end of the question, ``answer_prefix`` its own field, ``outputs`` the answers, ``length`` the prompt's
tokens plus the generation length.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from restkv.eval.benchmarks.ruler import RulerBenchmark, find_files, read_samples
from restkv.eval.benchmarks.ruler.metrics import ruler_string_match_all
from restkv.eval.harness.runner import RunSettings, run_benchmark
from restkv.eval.run import CONFIGS

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def niah_record(key: str, value: str) -> dict:
    haystack = "\n".join([NOISE] * 3 + [f"One of the special magic numbers for {key} is: {value}."] + [NOISE] * 3)
    text = (
        "A special magic number is hidden within the following text. Make sure to memorize it. I will quiz you "
        f"about the number afterwards.\n{haystack}\nWhat is the special magic number for {key} mentioned in the "
        "provided text?"
    )
    prefix = f" The special magic number for {key} mentioned in the provided text is"
    return {"index": 3, "input": text, "outputs": [value], "length": 200, "answer_prefix": prefix}


def vt_record() -> dict:
    text = (
        "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
        f"{NOISE}\nVAR QWERT = 51234\n{NOISE}\nVAR ASDFG = VAR QWERT \n{NOISE}\n"
        "Question: Find all variables that are assigned the value 51234 in the text above."
    )
    prefix = " Answer: According to the chain(s) of variable assignment in the text above, 2 variables are assigned"
    return {"index": 0, "input": text, "outputs": ["QWERT", "ASDFG"], "length": 150, "answer_prefix": prefix}


def write(path: Path, records: list[dict] | list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n")


def prepare_layout(root: Path) -> Path:
    """NVIDIA/RULER prepare.py: <root>/<length>/<task>/validation.jsonl."""
    for length in (512, 1024):
        write(root / str(length) / "niah_single_1" / "validation.jsonl", [niah_record("red-kite", "1234567")] * 2)
        write(root / str(length) / "vt" / "validation.jsonl", [vt_record()])
    return root


def authors_layout(root: Path) -> Path:
    """The ReST-KV authors' run_ruler.py: <root>/<length>/<task>.jsonl."""
    write(root / "512" / "niah_single_1.jsonl", [niah_record("blue-door", "7654321")] * 3)
    write(root / "512" / "vt.jsonl", [vt_record()] * 2)
    return root


def run(tmp_path: Path, data_dir: Path, *overrides: str) -> tuple[dict, list[dict]]:
    out = tmp_path / "out"
    args = [
        "model=tiny-random-llama",
        "policy=full",
        f"bench.data_dir={data_dir}",
        "bench.lengths=null",
        "bench.samples=null",
        "bench.tasks=[niah_single_1,vt]",
        f"out_dir={out}",
        *overrides,
    ]
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=args)
    summary = run_benchmark(cfg, RunSettings("ruler", "tiny-random-llama", "full", out_dir=out))
    (predictions,) = out.rglob("predictions.jsonl")
    return summary, [json.loads(line) for line in predictions.read_text().splitlines()]


@pytest.mark.parametrize("layout", [prepare_layout, authors_layout])
def test_official_files_are_scored_end_to_end(tmp_path: Path, layout, capsys) -> None:
    data_dir = layout(tmp_path / "data")
    summary, records = run(tmp_path, data_dir)
    found = find_files(data_dir)
    expected = {length: tasks for length, tasks in found.lengths().items()}
    assert summary["source"]["files"]["found"] == {str(n): t for n, t in expected.items()}
    assert set(summary["lengths"]) == {str(n) for n in expected}
    per_task = sum(1 for f in found.files for _ in f.path.read_text().splitlines())
    assert len(records) == per_task
    for record in records:
        assert record["score"] == ruler_string_match_all(record["prediction"], record["references"])
    assert "RULER files in" in capsys.readouterr().err


def test_prompt_is_the_files_input_with_the_question_split_off(tmp_path: Path) -> None:
    data_dir = prepare_layout(tmp_path / "data")
    (file,) = [f for f in find_files(data_dir).files if f.task == "niah_single_1" and f.length == 512]
    record = niah_record("red-kite", "1234567")
    (sample, _) = read_samples(file, None, None, answer_prefix=True, chat_template=False)
    assert sample.context + sample.question == record["input"]
    assert sample.question.startswith("\nWhat is the special magic number for red-kite")
    assert sample.answer_prefix == record["answer_prefix"] and sample.max_new_tokens == 128
    assert not sample.chat_template and sample.meta["context_length"] == 512
    # the authors' prompt form: the input alone, one generation length for every task
    (authors, _) = read_samples(file, None, 64, answer_prefix=False, chat_template=False)
    assert authors.answer_prefix == "" and authors.max_new_tokens == 64


def test_lengths_and_samples_select_what_is_read(tmp_path: Path) -> None:
    data_dir = prepare_layout(tmp_path / "data")
    bench = RulerBenchmark(tasks=["niah_single_1", "vt"], lengths=[1024], samples=1, data_dir=str(data_dir))
    samples = bench.load_samples(None)  # type: ignore[arg-type]
    assert [(s.task, s.meta["context_length"]) for s in samples] == [("niah_single_1", 1024), ("vt", 1024)]
    missing = RulerBenchmark(tasks=["niah_single_1", "cwe"], lengths=None, samples=None, data_dir=str(data_dir))
    missing.load_samples(None)  # type: ignore[arg-type]
    assert set(missing.skipped) == {"cwe@512", "cwe@1024"}
    with pytest.raises(ValueError, match=r"bench.lengths=\[4096\]: 4096 not in .* which holds 512, 1024"):
        RulerBenchmark(lengths=[4096], data_dir=str(data_dir)).load_samples(None)  # type: ignore[arg-type]


BAD = [
    ("no task files", lambda root: write(root / "512" / "notes.txt", ["hello"]), r"holds no RULER task files"),
    (
        "length not a number",
        lambda root: write(root / "long" / "vt.jsonl", [vt_record()]),
        r"long holds task files but its name is not a context length",
    ),
    ("empty task file", lambda root: write(root / "512" / "vt.jsonl", [""]), r"vt.jsonl: no records"),
    (
        "missing input",
        lambda root: write(root / "512" / "vt.jsonl", [vt_record(), {"outputs": ["A"]}]),
        r"vt.jsonl:2: .*missing field 'input'",
    ),
    (
        "missing outputs",
        lambda root: write(root / "512" / "vt.jsonl", [{"input": "x"}]),
        r"vt.jsonl:1: .*missing field 'outputs'",
    ),
    (
        "outputs not strings",
        lambda root: write(root / "512" / "vt.jsonl", [{**vt_record(), "outputs": [1]}]),
        r"vt.jsonl:1: .*field 'outputs\[0\]' must be one of str, got int",
    ),
    (
        "not JSON",
        lambda root: write(root / "512" / "vt.jsonl", [vt_record(), "{oops"]),
        r"vt.jsonl:2: malformed JSON line",
    ),
    (
        "no question",
        lambda root: write(root / "512" / "vt.jsonl", [{**vt_record(), "input": "no question here"}]),
        r"vt.jsonl:1: no vt question in 'input'",
    ),
    (
        "two files for one task",
        lambda root: (authors_layout(root), prepare_layout(root)),
        r"two files for niah_single_1 at 512",
    ),
]


@pytest.mark.parametrize(("case", "make", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_folder_is_named_and_nothing_is_lost(tmp_path: Path, case: str, make, message: str) -> None:
    good = authors_layout(tmp_path / "good")
    run(tmp_path, good)
    (predictions,) = (tmp_path / "out").rglob("predictions.jsonl")
    before = predictions.read_bytes()
    bad = tmp_path / "bad"
    make(bad)
    with pytest.raises(ValueError, match=message):
        RulerBenchmark(tasks=["niah_single_1", "vt"], lengths=None, samples=None, data_dir=str(bad)).load_samples(None)  # type: ignore[arg-type]
    # the same folder made bad under a finished run: the rerun stops before any write
    for path in sorted(good.rglob("*.jsonl")):
        path.unlink()
    make(good)
    with pytest.raises(ValueError, match=message):
        run(tmp_path, good, "on_change=adopt")
    assert predictions.read_bytes() == before


def test_other_folders_are_listed_not_fatal_and_runs_nest_in_data(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write(root / "logs" / "prepare.log", ["ok"])  # the generator's logs beside the length folders
    write(root / "1024" / "data" / "vt" / "validation.jsonl", [vt_record()])  # RULER's own run.sh layout
    found = find_files(root)
    assert [(f.task, f.length) for f in found.files] == [("vt", 1024)]
    assert "logs" in found.ignored


def test_the_line_after_the_limit_is_not_read(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write(root / "512" / "vt.jsonl", [vt_record(), "{broken"])
    (file,) = find_files(root).files
    assert len(read_samples(file, 1, None, answer_prefix=True, chat_template=False)) == 1
    with pytest.raises(ValueError, match=r"vt\.jsonl:2: malformed JSON line"):
        read_samples(file, None, None, answer_prefix=True, chat_template=False)


def test_each_family_is_scored_by_its_metric(tmp_path: Path) -> None:
    """Known predictions: all answers for niah/vt (string_match_all), any answer for qa (string_match_part)."""
    root = tmp_path / "data"
    qa = {
        "input": "Answer the question based on the given documents. Only give me the answer and do not output any "
        "other words.\n\nThe following are given documents.\n\nDocument 1:\nBo lives in Oslo.\n\nAnswer the "
        "question based on the given documents. Only give me the answer and do not output any other words."
        "\n\nQuestion: Where does Bo live?",
        "outputs": ["Oslo", "in Oslo"],
        "answer_prefix": " Answer:",
    }
    write(root / "512" / "qa_1.jsonl", [qa])
    write(root / "512" / "vt.jsonl", [vt_record()])
    bench = RulerBenchmark(tasks=["qa_1", "vt"], lengths=None, samples=None, data_dir=str(root))
    by_task = {s.task: s for s in bench.load_samples(None)}  # type: ignore[arg-type]
    assert by_task["qa_1"].question.startswith("\n\nAnswer the question") and by_task["qa_1"].max_new_tokens == 32
    assert bench.score(by_task["qa_1"], "Oslo, I think") == 1.0  # one answer is enough
    assert bench.score(by_task["vt"], "QWERT") == 0.5  # every answer is needed
    assert bench.score(by_task["vt"], "QWERT ASDFG") == 1.0
    assert bench.source["files"]["records"] == {"qa_1@512": 1, "vt@512": 1}


def test_repeated_tasks_or_lengths_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"bench.tasks=.* names vt twice"):
        RulerBenchmark(tasks=["vt", "vt"], lengths=[1024], samples=1)
    with pytest.raises(ValueError, match=r"bench.lengths=.* names 1024 twice"):
        RulerBenchmark(lengths=[1024, 1024], samples=1, data_dir=str(tmp_path))


def test_reading_files_needs_no_essay_and_no_punkt(tmp_path: Path) -> None:
    root = authors_layout(tmp_path / "data")
    bench = RulerBenchmark(
        tasks=["vt"], lengths=None, samples=None, data_dir=str(root), haystack="data/missing-essays", sentences="punkt"
    )
    assert [s.task for s in bench.load_samples(None)] == ["vt", "vt"]  # type: ignore[arg-type]


def test_files_with_a_model_template_are_fed_as_given_and_never_wrapped_twice(tmp_path: Path) -> None:
    root = tmp_path / "data"
    record = vt_record()
    record["input"] = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n" + record["input"]
    write(root / "512" / "vt.jsonl", [record])
    bench = RulerBenchmark(tasks=["vt"], lengths=None, samples=None, data_dir=str(root))
    (sample,) = bench.load_samples(None)  # type: ignore[arg-type]
    assert not sample.chat_template and bench.source["files"]["templated"] == ["vt@512"]
    wrapped = RulerBenchmark(tasks=["vt"], lengths=None, samples=None, data_dir=str(root), chat_template=True)
    with pytest.raises(ValueError, match="second chat template"):
        wrapped.load_samples(None)  # type: ignore[arg-type]
