"""LongBench / LongBench-E: task tables, loading the official jsonl layout, prompts, chat-template rule,
truncation, bad input, length buckets, and one run through the runner on the tiny random model."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from transformers import AutoTokenizer

from restkv.eval.benchmarks import longbench
from restkv.eval.benchmarks.contract.metrics import metric_names
from restkv.eval.benchmarks.longbench.benchmark import (
    NO_CHAT_TASKS,
    TASK_SPECS,
    TASKS,
    TASKS_E,
    TASKS_EN,
    TASKS_ZH,
    LongBenchBenchmark,
    split_prompt,
)
from restkv.eval.benchmarks.longbench.metrics import LONGBENCH_TASKS, bucket_scores, length_bucket
from restkv.eval.benchmarks.shared import official
from restkv.eval.benchmarks.shared.jsonl import DataFileError
from restkv.eval.evaluation.prompting import render, tokenize
from restkv.eval.harness.run_folder import PREDICTIONS
from restkv.eval.harness.runner import RunSettings, run_benchmark
from restkv.eval.models import hub
from restkv.eval.run import CONFIGS

FIXTURES = Path(__file__).parent / "fixtures" / "longbench"
TINY = Path(__file__).resolve().parents[1] / "models" / "tiny-random-llama"

# Independent restatement of the official LongBench/config/dataset2maxlen.json and eval.py's dataset2metric.
EXPECTED = {
    "narrativeqa": (128, "qa_f1"),
    "qasper": (128, "qa_f1"),
    "multifieldqa_en": (64, "qa_f1"),
    "multifieldqa_zh": (64, "qa_f1_zh"),
    "hotpotqa": (32, "qa_f1"),
    "2wikimqa": (32, "qa_f1"),
    "musique": (32, "qa_f1"),
    "dureader": (128, "rouge_zh"),
    "gov_report": (512, "rouge"),
    "qmsum": (512, "rouge"),
    "multi_news": (512, "rouge"),
    "vcsum": (512, "rouge_zh"),
    "trec": (64, "classification"),
    "triviaqa": (32, "qa_f1"),
    "samsum": (128, "rouge"),
    "lsht": (64, "classification"),
    "passage_count": (32, "count"),
    "passage_retrieval_en": (32, "retrieval"),
    "passage_retrieval_zh": (32, "retrieval_zh"),
    "lcc": (64, "code_sim"),
    "repobench-p": (64, "code_sim"),
}


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(TINY)


def bench(**kwargs) -> LongBenchBenchmark:
    kwargs.setdefault("data_dir", str(FIXTURES))
    kwargs.setdefault("hub", False)
    return LongBenchBenchmark(**kwargs)


def records(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]


def by_task(samples):
    out: dict[str, list] = {}
    for sample in samples:
        out.setdefault(sample.task, []).append(sample)
    return out


# ------------------------------------------------------------------------------ tables


def test_task_tables() -> None:
    assert len(TASKS_EN) == 16 and len(TASKS_ZH) == 5 and len(TASKS_E) == 13
    assert set(TASKS) == set(EXPECTED) == LONGBENCH_TASKS
    assert set(TASKS_E) <= set(TASKS_EN)
    for task, (max_new, metric) in EXPECTED.items():
        assert (TASK_SPECS[task].max_new_tokens, TASK_SPECS[task].metric) == (max_new, metric), task
        assert metric in metric_names()
        assert TASK_SPECS[task].prompt.count("{context}") == 1
    assert {"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"} == NO_CHAT_TASKS


def test_fixtures_have_the_official_fields_and_types() -> None:
    for path in sorted(FIXTURES.glob("*.jsonl")):
        for record in map(json.loads, path.read_text(encoding="utf-8").splitlines()):
            assert set(record) == {"input", "context", "answers", "length", "dataset", "language", "all_classes", "_id"}
            assert isinstance(record["input"], str) and isinstance(record["context"], str)
            assert record["answers"] and all(isinstance(a, str) for a in record["answers"])
            assert isinstance(record["length"], int) and isinstance(record["_id"], str) and len(record["_id"]) == 48
            assert record["all_classes"] is None or all(isinstance(c, str) for c in record["all_classes"])
    assert {p.stem for p in FIXTURES.glob("*.jsonl")} == set(TASKS) | {f"{t}_e" for t in TASKS_E}


# ------------------------------------------------------------------------------ prompts


def test_exact_prompts(tok) -> None:
    samples = by_task(bench(tasks=["multifieldqa_en", "trec", "passage_count", "lcc"]).load_samples(tok))
    first = records("multifieldqa_en")[0]
    sample = samples["multifieldqa_en"][0]
    assert sample.context == "Read the following text and answer briefly.\n\n" + first["context"]
    assert sample.question == (
        "\n\nNow, answer the following question based on the above text, only give me the answer and do not "
        "output any other words.\n\nQuestion: When was the Tessaro bridge completed?\nAnswer:"
    )
    trec = samples["trec"][0]
    assert trec.context + trec.question == (
        "Please determine the type of the question below. Here are some examples of questions.\n\n"
        + records("trec")[0]["context"]
        + "\nQuestion: What is the capital city of Australia ?\nType:"
    )
    count = samples["passage_count"][0]
    assert count.question == (
        "\n\nPlease enter the final count of unique paragraphs after removing duplicates. The output format "
        "should only contain the number, such as 1, 2, 3, and so on.\n\nThe final answer is: "
    )
    lcc = samples["lcc"][0]
    assert lcc.context == "Please complete the code given below. \n" + records("lcc")[0]["context"]
    assert lcc.question == "Next line of code:\n"
    assert all(s.answer_prefix == "" for group in samples.values() for s in group)


def test_split_reassembles_the_official_prompt() -> None:
    for task in TASKS:
        for record in records(task):
            context, question = split_prompt(task, record)
            assert context + question == TASK_SPECS[task].prompt.format(**record)
            assert context.endswith(record["context"])
            assert record["input"] in question


def test_loaded_samples(tok) -> None:
    samples = bench(tasks=["all"]).load_samples(tok)
    assert [s.task for s in samples] == [t for t in TASKS for _ in range(2)]
    for sample in samples:
        record = next(r for r in records(sample.task) if sample.id == f"longbench/{sample.task}/{r['_id']}")
        assert sample.references == record["answers"]
        assert (sample.max_new_tokens, sample.metric) == EXPECTED[sample.task]
        assert sample.meta["length"] == record["length"] and sample.meta["language"] == record["language"]
        assert sample.meta["all_classes"] == record["all_classes"]
        assert sample.meta["source"].endswith(f"{sample.task}.jsonl:{records(sample.task).index(record) + 1}")
    assert len(samples[0].meta) and "length_bucket" not in samples[0].meta


def test_task_aliases_samples_and_cap(tok) -> None:
    assert bench().tasks == list(TASKS_EN)
    assert bench(tasks=["zh", "qasper", "zh"]).tasks == [*TASKS_ZH, "qasper"]
    assert bench(tasks=["en", "zh"]).tasks == bench(tasks=["all"]).tasks == list(TASKS)
    limited = bench(tasks=["gov_report", "trec"], samples=1, max_new_tokens_cap=100).load_samples(tok)
    assert [(s.task, s.max_new_tokens) for s in limited] == [("gov_report", 100), ("trec", 64)]


def test_unknown_task_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown LongBench task 'narrative_qa'") as info:
        bench(tasks=["narrative_qa"])
    assert all(task in str(info.value) for task in TASKS)
    with pytest.raises(ValueError, match="unknown LongBench-E task 'narrativeqa'") as info:
        bench(tasks=["narrativeqa"], longbench_e=True)
    assert all(task in str(info.value) for task in TASKS_E)
    with pytest.raises(ValueError, match="chat_template='hf'"):
        bench(chat_template="hf")


# ------------------------------------------------------------------------------ chat template


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("authors", lambda task: False),
        ("none", lambda task: False),
        ("chat", lambda task: True),
        ("official", lambda task: task not in NO_CHAT_TASKS),
    ],
)
def test_chat_template_rule(tok, mode, expected) -> None:
    samples = bench(tasks=["all"], chat_template=mode).load_samples(tok)
    assert {s.task: s.chat_template for s in samples} == {t: expected(t) for t in TASKS}
    assert not any("[INST]" in s.context for s in samples)


def test_authors_mode_wraps_llama2_prompts_only() -> None:
    llama2 = SimpleNamespace(name_or_path="meta-llama/Llama-2-7b-chat-hf")
    llama3 = SimpleNamespace(name_or_path="meta-llama/Llama-3.1-8B-Instruct")
    wrapped = bench(tasks=["qasper"]).load_samples(llama2)[0]
    plain = bench(tasks=["qasper"]).load_samples(llama3)[0]
    assert wrapped.context == "[INST] " + plain.context and wrapped.question == plain.question + " [/INST]"
    assert not wrapped.chat_template
    assert bench(tasks=["qasper"], chat_template="none").load_samples(llama2)[0].context == plain.context
    assert official.is_llama2(SimpleNamespace(name_or_path="/models/llama2-7b-chat"))


def test_official_mode_renders_with_the_chat_template(tok) -> None:
    chat_tok = AutoTokenizer.from_pretrained(TINY)
    chat_tok.chat_template = "{% for m in messages %}<user>{{ m['content'] }}</user>{% endfor %}<bot>"
    samples = by_task(bench(tasks=["qasper", "trec"], chat_template="official").load_samples(tok))
    qasper, trec = samples["qasper"][0], samples["trec"][0]
    context, query, templated = render(qasper, chat_tok, chat=True)
    assert templated and context == "<user>" + qasper.context and query == qasper.question + "</user><bot>"
    context, query, templated = render(trec, chat_tok, chat=True)
    assert not templated and context + query == trec.context + trec.question


# ------------------------------------------------------------------------------ truncation


def test_truncation_cuts_the_middle_of_the_prompt_and_keeps_the_question(tok) -> None:
    for name, head_text in (("models/llama-2-7b-chat", "[INST] You are given a story"), (str(TINY), "You are given")):
        tok.name_or_path = name
        sample = bench(tasks=["narrativeqa"]).load_samples(tok)[0]
        full = tokenize(sample, tok, chat=False, max_context=100_000)
        max_context = 300
        cut = tokenize(sample, tok, chat=False, max_context=max_context)
        assert full.truncated == 0 and cut.truncated > 0
        assert cut.length == max_context  # the whole prompt is cut, as LongBench does
        assert cut.query == full.query  # the question (and the closing [/INST]) intact
        assert tok.decode(cut.query) == sample.question
        whole = full.context + full.query
        assert cut.context + cut.query == whole[: max_context // 2] + whole[-(max_context - max_context // 2) :]
        keep = max_context // 2
        assert tok.decode(cut.context[: keep // 2], skip_special_tokens=True).startswith(head_text)
    assert sample.question.endswith("Answer:")
    tok.name_or_path = str(TINY)


# ------------------------------------------------------------------------------ scoring


def test_score_applies_first_line_cleanup_and_all_classes(tok) -> None:
    b = bench(tasks=["trec", "samsum", "passage_retrieval_en", "passage_count", "triviaqa"])
    samples = by_task(b.load_samples(tok))
    trec = samples["trec"][0]
    assert b.score(trec, "City\nQuestion: What is the capital of Peru ?\nType: City") == 1.0
    assert b.score(trec, "Country") == 0.0
    assert b.score(samples["triviaqa"][0], "\n1890\nPassage: ...") == 1.0
    assert b.score(samples["passage_retrieval_en"][0], "Paragraph 2") == 1.0
    assert b.score(samples["passage_count"][0], "There are 3 unique paragraphs.") == 1.0
    samsum = samples["samsum"][0]
    assert b.score(samsum, samsum.references[0] + "\nDialogue: more") == pytest.approx(1.0, abs=1e-6)
    zh = by_task(bench(tasks=["zh"]).load_samples(tok))
    assert bench().score(zh["multifieldqa_zh"][0], "一七八二年。") == 1.0  # jieba words, punctuation dropped
    assert bench().score(zh["lsht"][0], "教育\n新闻：") == 1.0
    assert bench().score(zh["passage_retrieval_zh"][1], "段落3") == 1.0
    assert 0.0 < bench().score(zh["dureader"][0], "镇政府修复了古码头。") < 1.0


# ------------------------------------------------------------------------------ bad input


def copy_fixtures(tmp_path: Path, *names: str) -> Path:
    for name in names:
        shutil.copy(FIXTURES / f"{name}.jsonl", tmp_path / f"{name}.jsonl")
    return tmp_path


def test_malformed_line_names_file_and_line(tmp_path, tok) -> None:
    folder = copy_fixtures(tmp_path, "qasper")
    path = folder / "qasper.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join([lines[0], "", lines[1][:50]]) + "\n", encoding="utf-8")
    with pytest.raises(DataFileError, match=rf"^{re.escape(str(path))}:3: malformed JSON line"):
        bench(tasks=["qasper"], data_dir=str(folder)).load_samples(tok)
    path.write_text(lines[0] + "\n[1, 2]\n", encoding="utf-8")
    with pytest.raises(DataFileError, match=rf"^{re.escape(str(path))}:2: expected a JSON object, got list"):
        bench(tasks=["qasper"], data_dir=str(folder)).load_samples(tok)


@pytest.mark.parametrize(
    ("task", "edit", "message"),
    [
        ("qasper", lambda r: r.pop("answers"), r"task 'qasper': missing field 'answers'"),
        ("hotpotqa", lambda r: r.pop("_id"), r"task 'hotpotqa': missing field '_id'"),
        ("qmsum", lambda r: r.update(length="88"), r"task 'qmsum': field 'length' must be an integer"),
        ("samsum", lambda r: r.update(answers="a summary"), r"task 'samsum': field 'answers' must be a list"),
        ("trec", lambda r: r.update(all_classes=None), r"task 'trec': field 'all_classes' must list the classes"),
        ("lcc", lambda r: r.update(answers=[]), r"task 'lcc': field 'answers' must be a non-empty list"),
    ],
)
def test_missing_or_mistyped_field_names_field_and_task(tmp_path, tok, task, edit, message) -> None:
    rows = records(task)
    edit(rows[1])
    path = tmp_path / f"{task}.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(DataFileError, match=rf"^{re.escape(str(path))}:2: LongBench {message}"):
        bench(tasks=[task], data_dir=str(tmp_path)).load_samples(tok)


def test_duplicate_ids_are_rejected(tmp_path, tok) -> None:
    rows = records("musique")
    path = tmp_path / "musique.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (rows[0], rows[1], rows[0])), encoding="utf-8")
    with pytest.raises(DataFileError, match=rf"{re.escape(str(path))}:3: .*repeats line 1"):
        bench(tasks=["musique"], data_dir=str(tmp_path)).load_samples(tok)


def test_missing_files_are_all_listed(tmp_path, tok, monkeypatch) -> None:
    copy_fixtures(tmp_path, "qasper")
    with pytest.raises(FileNotFoundError) as info:
        bench(tasks=["qasper", "trec", "lcc"], data_dir=str(tmp_path)).load_samples(tok)
    message = str(info.value)
    assert str(tmp_path / "trec.jsonl") in message and str(tmp_path / "lcc.jsonl") in message
    assert "qasper.jsonl" not in message
    assert "python scripts/download_data.py longbench" in message
    # with the hub allowed but unreachable the failure is immediate and says why
    monkeypatch.setattr(hub, "hub_reachable", lambda: False)
    with pytest.raises(FileNotFoundError, match="hub is not reachable"):
        bench(tasks=["trec"], data_dir=str(tmp_path), hub=True).load_samples(tok)


def test_hub_archive_is_read_in_place(tmp_path, tok, monkeypatch) -> None:
    archive = tmp_path / "data.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(FIXTURES / "trec.jsonl", "data/trec.jsonl")
        z.writestr("data/qasper_e.jsonl", (FIXTURES / "qasper_e.jsonl").read_text(encoding="utf-8") + "{oops\n")
    calls: list[int] = []
    monkeypatch.setattr(longbench.archive, "fetch_archive", lambda: (calls.append(1), (archive, ""))[1])
    empty = tmp_path / "empty"
    empty.mkdir()
    samples = bench(tasks=["trec"], data_dir=str(empty), hub=True).load_samples(tok)
    assert [s.references for s in samples] == [r["answers"] for r in records("trec")]
    assert samples[0].meta["source"] == f"{archive}:data/trec.jsonl:1"
    with pytest.raises(DataFileError, match=rf"^{re.escape(str(archive))}:data/qasper_e.jsonl:3: malformed JSON"):
        bench(tasks=["qasper"], longbench_e=True, data_dir=str(empty), hub=True).load_samples(tok)
    with pytest.raises(FileNotFoundError, match=r"lcc\.jsonl"):
        bench(tasks=["trec", "lcc"], data_dir=str(empty), hub=True).load_samples(tok)
    assert len(calls) == 3  # downloaded once per load, not once per task


# ------------------------------------------------------------------------------ LongBench-E


def test_longbench_e_loads_the_e_files(tok) -> None:
    samples = bench(tasks=["en"], longbench_e=True).load_samples(tok)
    assert list(dict.fromkeys(s.task for s in samples)) == list(TASKS_E)
    for sample in samples:
        assert sample.id.startswith(f"longbench_e/{sample.task}/")
        assert sample.meta["benchmark"] == "longbench_e"
        assert sample.meta["length_bucket"] == length_bucket(sample.meta["length"])
    with pytest.raises(ValueError, match="LongBench-E"):
        bench(tasks=["zh"], longbench_e=True)


def test_length_buckets() -> None:
    assert [length_bucket(n) for n in (0, 3999, 4000, 7999, 8000, 120_000)] == [
        "0-4k",
        "0-4k",
        "4-8k",
        "4-8k",
        "8k+",
        "8k+",
    ]
    records_ = [
        {"task": "qasper", "score": 1.0, "meta": {"length": 1200}},
        {"task": "qasper", "score": 0.0, "meta": {"length": 3999}},
        {"task": "qasper", "score": 0.25, "meta": {"length": 4000}},
        {"task": "trec", "score": 1.0, "meta": {"length": 9000}},
        {"task": "trec", "score": 0.0, "meta": {"length": 100}},
    ]
    buckets = bucket_scores(records_)
    assert buckets["tasks"] == {"qasper": {"0-4k": 50.0, "4-8k": 25.0}, "trec": {"0-4k": 0.0, "8k+": 100.0}}
    assert buckets["average"] == {"0-4k": 25.0, "4-8k": 25.0, "8k+": 100.0}
    report = bench(tasks=["qasper", "trec"], longbench_e=True).report(records_, Path("."))
    assert report["length_buckets"] == buckets


def test_report_category_and_language_averages() -> None:
    rows = [
        {"task": "qasper", "score": 0.5, "meta": {"length": 1}},
        {"task": "narrativeqa", "score": 1.0, "meta": {"length": 1}},
        {"task": "lcc", "score": 0.2, "meta": {"length": 1}},
        {"task": "lsht", "score": 1.0, "meta": {"length": 1}},
    ]
    report = bench(tasks=["all"]).report(rows, Path("."))
    assert report["categories"] == {"single_doc_qa": 75.0, "few_shot": 100.0, "code": pytest.approx(20.0)}
    assert report["average_en"] == pytest.approx(statistics.fmean([50.0, 100.0, 20.0]))
    assert report["average_zh"] == 100.0
    assert "length_buckets" not in report


# ------------------------------------------------------------------------------ the runner


def run_config(tmp_path: Path, data_dir: Path, *extra: str):
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return compose(
            config_name="config",
            overrides=[
                f"out_dir={tmp_path / 'results'}",
                "model=tiny-random-llama",
                "bench=longbench",
                f"bench.data_dir={data_dir}",
                "bench.hub=false",
                "bench.samples=1",
                "bench.max_new_tokens_cap=8",
                "budget=64",
                "policy.window=8",
                *extra,
            ],
        )


def test_longbench_runs_through_the_runner(tmp_path: Path, capsys) -> None:
    data = tmp_path / "data"
    shutil.copytree(FIXTURES, data)
    settings = RunSettings("longbench", "tiny-random-llama", "restkv", out_dir=tmp_path / "results")
    summary = run_benchmark(run_config(tmp_path, data), settings)
    out = capsys.readouterr().out
    table = out[out.index("longbench | tiny-random-llama | restkv | budget 64") :]
    for task in TASKS_EN:
        assert f"\n{task} " in table
    assert "\naverage " in table
    folder = tmp_path / "results" / "longbench" / "tiny-random-llama" / "restkv" / "budget64"
    metrics = json.loads((folder / "metrics.json").read_text())
    assert list(metrics["tasks"]) == list(TASKS_EN)
    assert metrics["samples"] == dict.fromkeys(TASKS_EN, 1)
    assert metrics["average"] == pytest.approx(statistics.fmean(metrics["tasks"].values()))
    assert metrics["average"] == summary["average"]
    assert set(metrics["categories"]) == {
        "single_doc_qa",
        "multi_doc_qa",
        "summarization",
        "few_shot",
        "synthetic",
        "code",
    }
    # bad data on a rerun is reported and the finished predictions stay as they were
    before = (folder / PREDICTIONS).read_text()
    with open(data / "hotpotqa.jsonl", "a", encoding="utf-8") as f:
        f.write('{"input": "truncated\n')
    with pytest.raises(DataFileError, match=r"hotpotqa.jsonl:3: malformed JSON"):
        run_benchmark(run_config(tmp_path, data, "bench.samples=null"), settings)
    assert (folder / PREDICTIONS).read_text() == before
