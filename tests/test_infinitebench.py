"""InfiniteBench: task tables, loading the official jsonl layout, prompts, references, chat-template
rule, truncation, bad input, and one run through the runner on the tiny random model."""

from __future__ import annotations

import json
import re
import shutil
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from transformers import AutoTokenizer

from restkv.eval.benchmarks import infinitebench
from restkv.eval.benchmarks.contract.metrics import metric_names
from restkv.eval.benchmarks.infinitebench.benchmark import (
    PROMPTS,
    TASKS,
    InfiniteBenchBenchmark,
    max_new_tokens,
    references,
    split_prompt,
)
from restkv.eval.benchmarks.shared.jsonl import DataFileError
from restkv.eval.evaluation.prompting import tokenize
from restkv.eval.harness.run_folder import PREDICTIONS
from restkv.eval.harness.runner import RunSettings, run_benchmark
from restkv.eval.models import hub
from restkv.eval.run import CONFIGS

FIXTURES = Path(__file__).parent / "fixtures" / "infinitebench"
TINY = Path(__file__).resolve().parents[1] / "models" / "tiny-random-llama"

# Independent restatement: the authors' run_infinite_bench.py dataset2maxlen, and the official
# src/eval_utils.py DATA_NAME_TO_MAX_NEW_TOKENS where it differs.
AUTHORS = {
    "passkey": 15,
    "number_string": 20,
    "kv_retrieval": 80,
    "longbook_sum_eng": 1200,
    "longbook_choice_eng": 40,
    "longbook_qa_eng": 40,
    "longbook_qa_chn": 40,
    "longdialogue_qa_eng": 40,
    "math_find": 3,
    "math_calc": 30000,
    "code_run": 5,
    "code_debug": 5,
}
OFFICIAL_DIFFERENT = {"passkey": 6, "number_string": 12, "kv_retrieval": 50}


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(TINY)


def bench(**kwargs) -> InfiniteBenchBenchmark:
    kwargs.setdefault("data_dir", str(FIXTURES))
    kwargs.setdefault("hub", False)
    return InfiniteBenchBenchmark(**kwargs)


def records(task: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / f"{task}.jsonl").read_text(encoding="utf-8").splitlines()]


def first(samples, task: str):
    return next(s for s in samples if s.task == task)


@pytest.fixture(scope="module")
def samples(tok):
    return bench().load_samples(tok)


# ------------------------------------------------------------------------------ tables


def test_task_tables() -> None:
    assert len(TASKS) == 12 and set(TASKS) == set(PROMPTS) == set(AUTHORS)
    for task in TASKS:
        assert max_new_tokens(task) == AUTHORS[task]
        assert max_new_tokens(task, "official") == OFFICIAL_DIFFERENT.get(task, AUTHORS[task])
        assert f"infbench_{task}" in metric_names()
        assert PROMPTS[task].count("{context}") == 1


def test_fixtures_have_the_official_fields_and_types() -> None:
    for task in TASKS:
        for record in records(task):
            assert set(record) == {"id", "context", "input", "answer", "options"}
            assert isinstance(record["id"], int) and isinstance(record["context"], str)
            assert isinstance(record["input"], str) and isinstance(record["answer"], list)
            assert all(isinstance(o, str) for o in record["options"])
            assert len(record["options"]) == (4 if task in infinitebench.CHOICE_TASKS else 0)


# ------------------------------------------------------------------------------ prompts and references


def test_exact_prompts(samples) -> None:
    passkey = first(samples, "passkey")
    assert passkey.context == (
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz "
        "you about the important information.\n\n" + records("passkey")[0]["context"]
    )
    assert passkey.question == "\n\nWhat is the pass key?\n\nThe pass key is"
    code_run = first(samples, "code_run")
    assert code_run.context.startswith("There is a function called func_1 in the following Python code.\n\ndef func_0")
    assert code_run.question == "\n\nPlease compute the exact value of func_1(4). The value of func_1(4) is"
    math_find = first(samples, "math_find")
    assert (
        math_find.context
        == "What is the largest number in the following list?\n\n[34, 12, 98, 7, 56, 23, 81, 45, 3, 67]"
    )
    assert math_find.question == (
        "\n\nYou should answer with only one number, no other words. The largest number of the list is: "
    )
    choice = first(samples, "longbook_choice_eng")
    assert choice.question == (
        "\n\nQuestion: What did Edda carry to the capital besides honey?\nA. A letter from the harbour board\n"
        "B. A list of the ferry's passengers\nC. Her uncle's winch\nD. A map of the sandbar\n\n"
        "The letter of the correct answer is"
    )
    assert first(samples, "math_calc").context.endswith("Expression: 3 + 5 - 2 + 10 - 4")
    assert first(samples, "math_calc").question == "\nValues:"
    assert first(samples, "longbook_qa_chn").question == "\n\n问题：林秋的父亲从事什么工作？\n答案："
    assert all(s.answer_prefix == "" and s.metric == f"infbench_{s.task}" for s in samples)


def test_split_reassembles_the_official_prompt() -> None:
    fields = {
        "code_run": lambda r: {"func": "func_1", "func_call": "func_1(4)"},
        "math_find": lambda r: {"prefix": "What is the largest number in the following list?", "input": r["input"]},
        "longbook_choice_eng": lambda r: {
            "question": r["input"],
            **dict(zip(["OPTION_A", "OPTION_B", "OPTION_C", "OPTION_D"], r["options"], strict=True)),
        },
        "code_debug": lambda r: dict(zip(["OPTION_A", "OPTION_B", "OPTION_C", "OPTION_D"], r["options"], strict=True)),
        "longbook_qa_eng": lambda r: {"question": r["input"]},
        "longbook_qa_chn": lambda r: {"question": r["input"]},
    }
    for task in TASKS:
        record = records(task)[0]
        values = fields.get(task, lambda r: {"input": r["input"]})(record)
        context, question = split_prompt(task, record)
        assert context + question == PROMPTS[task].format(context=record["context"], **values), task


def test_references(samples) -> None:
    got = {s.id: s.references for s in samples}
    assert got["infinitebench/passkey/0"] == ["71432"]
    assert got["infinitebench/longbook_choice_eng/0"] == ["A list of the ferry's passengers", "B"]
    assert got["infinitebench/longbook_choice_eng/1"] == ["Bram", "C"]
    assert got["infinitebench/code_debug/1"] == ["parse_header", "D"]
    assert got["infinitebench/math_calc/0"] == ["3", "8", "6", "16", "12"]  # nested official list unwrapped
    assert got["infinitebench/math_calc/1"] == ["7", "-2", "18", "19"]
    assert got["infinitebench/math_find/0"] == ["98"] and got["infinitebench/math_find/1"] == ["47.5"]
    assert got["infinitebench/code_run/1"] == ["-4"]
    assert got["infinitebench/longdialogue_qa_eng/1"] == ["CONDUCTOR", "THE CONDUCTOR"]
    # the other answer shapes the official get_answer accepts
    base = {"id": 0, "context": "", "input": "", "options": ["w", "x", "y", "z"]}
    assert references("code_debug", {**base, "answer": "y"}) == ["y", "C"]
    assert references("code_debug", {**base, "answer": ["x", "B"]}) == ["x", "B"]
    assert references("math_calc", {**base, "answer": [1, 3]}) == ["1", "3"]
    assert references("kv_retrieval", {**base, "answer": "abc-1"}) == ["abc-1"]
    assert references("math_find", {**base, "answer": 5}) == ["5"]


def test_scores_of_right_answers(samples) -> None:
    b = bench()
    right = {
        "passkey": " 71432.",
        "number_string": " 5823914470",
        "kv_retrieval": f'"{records("kv_retrieval")[0]["answer"][0]}"',
        "longbook_choice_eng": " B. A list of the ferry's passengers",
        "longbook_qa_eng": "On the roof of the old customs house",
        "longbook_qa_chn": "摆渡人",
        "longdialogue_qa_eng": " Harlow.",
        "math_find": " 98",
        "math_calc": " [3, 8, 6, 16, 12]",
        "code_run": " 14",
        "code_debug": " B. merge_rows",
    }
    for task, prediction in right.items():
        assert b.score(first(samples, task), prediction) == 1.0, task
    assert b.score(first(samples, "math_calc"), " [3, 8, 7, 16, 12]") == pytest.approx(0.4)
    assert 0.0 < b.score(first(samples, "longbook_sum_eng"), "Edda saves the ferry and learns to pilot it.") < 1.0


def test_samples_cap_aliases_and_generation_lengths(tok) -> None:
    assert bench().tasks == list(TASKS)
    official = bench(tasks=["passkey", "math_calc"], generation_lengths="official", samples=1).load_samples(tok)
    assert [(s.task, s.max_new_tokens) for s in official] == [("passkey", 6), ("math_calc", 30000)]
    capped = bench(tasks=["passkey", "math_calc"], max_new_tokens_cap=10).load_samples(tok)
    assert [s.max_new_tokens for s in capped] == [10, 10, 10, 10]
    with pytest.raises(ValueError, match="generation_lengths='paper'"):
        bench(generation_lengths="paper")


# ------------------------------------------------------------------------------ chat template and truncation


def test_chat_template_rule(tok) -> None:
    for mode, expected in (("authors", False), ("official", False), ("none", False), ("chat", True)):
        assert {s.chat_template for s in bench(chat_template=mode).load_samples(tok)} == {expected}, mode
    llama2 = SimpleNamespace(name_or_path="meta-llama/Llama-2-7b-chat-hf")
    wrapped = bench(tasks=["passkey"], samples=1).load_samples(llama2)[0]
    assert wrapped.context.startswith("[INST] There is an important info")
    assert wrapped.question.endswith("The pass key is [/INST]")
    assert "[INST]" not in bench(tasks=["passkey"], chat_template="official").load_samples(llama2)[0].context


def test_truncation_keeps_the_question_and_options(tok, samples) -> None:
    choice = first(samples, "longbook_choice_eng")
    cut = tokenize(choice, tok, chat=False, max_context=250)
    assert cut.truncated > 0 and cut.length == 250
    assert tok.decode(cut.query) == choice.question
    assert tok.decode(cut.context, skip_special_tokens=True).startswith("Read the book and answer the question.")


# ------------------------------------------------------------------------------ bad input


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def test_malformed_line_names_file_and_line(tmp_path, tok) -> None:
    path = tmp_path / "passkey.jsonl"
    good = (FIXTURES / "passkey.jsonl").read_text(encoding="utf-8")
    path.write_text(good + '{"id": 2, "context": "cut here\n', encoding="utf-8")
    with pytest.raises(DataFileError, match=rf"^{re.escape(str(path))}:3: malformed JSON line"):
        bench(tasks=["passkey"], data_dir=str(tmp_path)).load_samples(tok)


@pytest.mark.parametrize(
    ("task", "edit", "message"),
    [
        ("longbook_choice_eng", lambda r: r.pop("options"), r"task 'longbook_choice_eng': missing field 'options'"),
        ("kv_retrieval", lambda r: r.pop("answer"), r"task 'kv_retrieval': missing field 'answer'"),
        ("passkey", lambda r: r.pop("context"), r"task 'passkey': missing field 'context'"),
        ("longbook_qa_eng", lambda r: r.update(input=["q"]), r"task 'longbook_qa_eng': field 'input' must be a string"),
        (
            "code_debug",
            lambda r: r.update(answer=["nope"]),
            r"task 'code_debug': field 'answer' must be one of the options",
        ),
        (
            "code_run",
            lambda r: r.update(input="What does it return?"),
            r"task 'code_run': field 'input' has no function",
        ),
        (
            "math_find",
            lambda r: r.update(input="Which one?"),
            r"task 'math_find': field 'input' has no 'The \.\.\. of'",
        ),
        (
            "math_calc",
            lambda r: r.update(answer=[["3", "8"]]),
            r"task 'math_calc': field 'answer' must be the list of integer",
        ),
        ("code_run", lambda r: r.update(answer=[1.5]), r"task 'code_run': field 'answer' must hold a number"),
    ],
)
def test_missing_or_mistyped_field_names_field_and_task(tmp_path, tok, task, edit, message) -> None:
    rows = records(task)
    edit(rows[1])
    path = tmp_path / f"{task}.jsonl"
    write(path, rows)
    with pytest.raises(DataFileError, match=rf"^{re.escape(str(path))}:2: InfiniteBench {message}"):
        bench(tasks=[task], data_dir=str(tmp_path)).load_samples(tok)


def test_options_are_optional_outside_the_choice_tasks(tmp_path, tok) -> None:
    rows = records("kv_retrieval")
    for row in rows:
        row.pop("options")  # kv_retrieval.jsonl once shipped without this column
    write(tmp_path / "kv_retrieval.jsonl", rows)
    assert len(bench(tasks=["kv_retrieval"], data_dir=str(tmp_path)).load_samples(tok)) == 2


def test_unknown_task_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown InfiniteBench task 'passkey_retrieval'") as info:
        bench(tasks=["passkey", "passkey_retrieval"])
    assert all(task in str(info.value) for task in TASKS)


def test_missing_files_and_the_hub(tmp_path, tok, monkeypatch) -> None:
    with pytest.raises(FileNotFoundError) as info:
        bench(tasks=["passkey", "math_calc"], data_dir=str(tmp_path)).load_samples(tok)
    message = str(info.value)
    assert str(tmp_path / "passkey.jsonl") in message and str(tmp_path / "math_calc.jsonl") in message
    assert "python scripts/download_data.py infinitebench" in message
    monkeypatch.setattr(hub, "hub_reachable", lambda: False)
    with pytest.raises(FileNotFoundError, match="hub is not reachable"):
        bench(tasks=["passkey"], data_dir=str(tmp_path), hub=True).load_samples(tok)
    monkeypatch.setattr(infinitebench.benchmark, "fetch_task_file", lambda task: (FIXTURES / f"{task}.jsonl", ""))
    fetched = bench(tasks=["passkey"], data_dir=str(tmp_path), hub=True).load_samples(tok)
    assert [s.references for s in fetched] == [["71432"], ["28815"]]


# ------------------------------------------------------------------------------ the runner


def run_config(tmp_path: Path, data_dir: Path, *extra: str):
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return compose(
            config_name="config",
            overrides=[
                f"out_dir={tmp_path / 'results'}",
                "model=tiny-random-llama",
                "bench=infinitebench",
                f"bench.data_dir={data_dir}",
                "bench.hub=false",
                "bench.samples=1",
                "bench.max_new_tokens_cap=8",
                "budget=64",
                "policy.window=8",
                *extra,
            ],
        )


def test_infinitebench_runs_through_the_runner(tmp_path: Path, capsys) -> None:
    data = tmp_path / "data"
    shutil.copytree(FIXTURES, data)
    settings = RunSettings("infinitebench", "tiny-random-llama", "snapkv", out_dir=tmp_path / "results")
    summary = run_benchmark(run_config(tmp_path, data, "policy=snapkv"), settings)
    out = capsys.readouterr().out
    table = out[out.index("infinitebench | tiny-random-llama | snapkv | budget 64") :]
    assert all(f"\n{task} " in table for task in TASKS) and "\naverage " in table
    folder = tmp_path / "results" / "infinitebench" / "tiny-random-llama" / "snapkv" / "budget64"
    metrics = json.loads((folder / "metrics.json").read_text())
    assert list(metrics["tasks"]) == list(TASKS) and metrics["samples"] == dict.fromkeys(TASKS, 1)
    assert metrics["average"] == pytest.approx(statistics.fmean(metrics["tasks"].values())) == summary["average"]
    before = (folder / PREDICTIONS).read_text()
    rows = records("code_debug")
    rows[1].pop("options")
    write(data / "code_debug.jsonl", rows)
    with pytest.raises(DataFileError, match=r"code_debug.jsonl:2: .*'options'"):
        run_benchmark(run_config(tmp_path, data, "policy=snapkv", "bench.samples=null"), settings)
    assert (folder / PREDICTIONS).read_text() == before
