"""Long-output math benchmarks: answer extraction on known outputs, the loaders on files shaped like the hub's,
the download conversion, and a run with decode-time eviction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from restkv.eval.benchmarks.math import TASKS, MathBenchmark
from restkv.eval.benchmarks.math.answers import extract_answer, gsm8k_reference, last_boxed, same_answer
from restkv.eval.benchmarks.math.sources import task_records, write_jsonl

FIXTURES = Path(__file__).parent / "fixtures" / "math"


@pytest.mark.parametrize(
    ("output", "answer"),
    [
        ("so the total is $\\boxed{\\frac{8}{21}}$.", "\\frac{8}{21}"),
        (
            "first \\boxed{1}, then correcting: \\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}",
            "\\left( 3, \\frac{\\pi}{2} \\right)",
        ),
        ("Hence the answer is 204.", "204"),
        ("She makes 9 * 2 = 18 dollars, so 18 per day", "18"),
        ("no digits at all", ""),
        ("\\boxed 5$ done", "5"),
    ],
)
def test_the_final_answer_is_found(output: str, answer: str) -> None:
    assert extract_answer(output) == answer


@pytest.mark.parametrize(
    ("prediction", "reference", "equal"),
    [
        ("0.5", "\\frac{1}{2}", True),
        ("\\dfrac{8}{21}", "\\frac{8}{21}", True),
        ("\\frac82", "4", True),
        ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
        ("\\$18.00", "18", True),
        ("26,000", "26000", True),
        ("x = 5", "5", True),
        ("10\\%", "10", True),
        ("204", "205", False),
        ("", "0", False),
        ("\\frac{1}{3}", "0.33", False),
    ],
)
def test_answers_are_compared_by_value_then_notation(prediction: str, reference: str, equal: bool) -> None:
    assert same_answer(prediction, reference) is equal


def test_gsm8k_reference_and_a_missing_marker() -> None:
    assert gsm8k_reference("so 1,234 in all\n#### 1,234") == "1234"
    with pytest.raises(ValueError, match="after '####'"):
        gsm8k_reference("no marker")
    assert last_boxed("\\boxed{a{b}c") is None  # unbalanced: no answer rather than a guess


def test_every_task_loads_from_files_shaped_like_the_hubs() -> None:
    bench = MathBenchmark(tasks=list(TASKS), data_dir=str(FIXTURES), max_new_tokens_cap=64)
    samples = bench.load_samples(None)
    by_task = {task: [s for s in samples if s.task == task] for task in TASKS}
    assert {task: len(found) for task, found in by_task.items()} == {"math500": 3, "aime24": 2, "aime25": 2, "gsm8k": 2}
    assert by_task["gsm8k"][0].references == ["18"] and by_task["aime25"][0].id == "aime25-I-1"
    assert by_task["math500"][0].id == "math500-test/precalculus/807.json"
    assert all(s.max_new_tokens == 64 and s.question.endswith("within \\boxed{}.") for s in samples)
    sample = by_task["math500"][2]
    assert bench.score(sample, "... = \\boxed{\\dfrac{8}{21}}") == 1.0 and bench.score(sample, "\\boxed{8/20}") == 0.0
    report = bench.report([{"task": "gsm8k", "new_tokens": 10}, {"task": "gsm8k", "new_tokens": 20}], FIXTURES)
    assert report == {"mean_new_tokens": {"gsm8k": 15.0}}


def test_bad_settings_and_missing_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="allowed tasks are math500, aime24, aime25, gsm8k"):
        MathBenchmark(tasks=["aime23"])
    with pytest.raises(ValueError, match=r"bench\.max_new_tokens=0"):
        MathBenchmark(tasks=["gsm8k"], max_new_tokens=0)
    with pytest.raises(FileNotFoundError, match=r"download_data\.py math"):
        MathBenchmark(tasks=["gsm8k"], data_dir=str(tmp_path)).check_data()


def test_the_download_writes_the_hub_records(tmp_path: Path) -> None:
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    rows = [json.loads(line) for line in (FIXTURES / "aime24.jsonl").read_text().splitlines()]
    pandas.DataFrame(rows).to_parquet(tmp_path / "train.parquet")
    halves = []
    for half in ("I", "II"):
        path = tmp_path / f"aime2025-{half}.jsonl"
        path.write_text(json.dumps({"question": f"problem {half}", "answer": "7"}) + "\n")
        halves.append(path)
    write_jsonl(task_records("aime24", [tmp_path / "train.parquet"]), tmp_path / "aime24.jsonl")
    write_jsonl(task_records("aime25", halves), tmp_path / "aime25.jsonl")
    assert [json.loads(line) for line in (tmp_path / "aime24.jsonl").read_text().splitlines()] == rows
    assert [json.loads(line)["id"] for line in (tmp_path / "aime25.jsonl").read_text().splitlines()] == ["I-1", "II-1"]
    loaded = MathBenchmark(tasks=["aime24", "aime25"], data_dir=str(tmp_path)).load_samples(None)
    assert [s.id for s in loaded] == ["aime24-60", "aime24-61", "aime25-I-1", "aime25-II-1"]
