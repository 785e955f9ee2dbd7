"""RULER generation: lengths, answers in place, determinism, QA inputs, errors.

``fit="exact"`` fills every prompt to its budget, so lengths are checked tightly with it; the default
(official) fit is checked in tests/test_ruler_official.py.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections import Counter
from pathlib import Path

import pytest
from _tokenizer import tokenizer_fixture  # noqa: F401

from restkv.eval.benchmarks import ruler
from restkv.eval.benchmarks.contract.base import Sample
from restkv.eval.benchmarks.ruler import TASKS, RulerData
from restkv.eval.benchmarks.ruler import generate as generate_default

generate = functools.partial(generate_default, fit="exact", words="bundled")

FIXTURES = Path(__file__).parent / "fixtures" / "ruler"
DATA = RulerData(squad=FIXTURES / "squad.json", hotpotqa=FIXTURES / "hotpotqa.json", hub=False)

# Independent restatement of RULER's defaults (scripts/data/synthetic/constants.py,
# scripts/eval/synthetic/constants.py).
EXPECTED = {
    "niah": (128, "string_match_all"),
    "vt": (30, "string_match_all"),
    "cwe": (120, "string_match_all"),
    "fwe": (50, "string_match_all"),
    "qa": (32, "string_match_part"),
}
ESSAY_TASKS = {"niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multivalue", "niah_multiquery"}
NEEDS_1K = {"vt", "cwe"}  # in-context example + list: no room at 512 tokens


def family(task: str) -> str:
    return task.split("_")[0] if task.startswith(("niah", "qa")) else task


def count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def prompt(sample: Sample) -> str:
    return sample.context + sample.question + sample.answer_prefix


CASES = [(task, length) for task in TASKS for length in (512, 1024, 2048) if not (length == 512 and task in NEEDS_1K)]


@pytest.mark.parametrize(("task", "length"), CASES)
def test_length_and_answers(tokenizer, task: str, length: int) -> None:
    samples = generate(task, tokenizer, length, 3, seed=1, data=DATA)
    assert len(samples) == 3
    max_new, metric = EXPECTED[family(task)]
    budget = length - max_new
    # Essay haystacks are fitted word by word; other haystacks by whole sentences, needles or documents.
    tolerance = 8 if task in ESSAY_TASKS else 100
    for sample in samples:
        assert sample.task == task
        assert sample.metric == metric
        assert sample.max_new_tokens == max_new
        tokens = count(tokenizer, prompt(sample))
        assert tokens == sample.meta["prompt_tokens"]
        assert budget - tolerance <= tokens <= budget
        assert sample.meta["context_length"] == length
        assert sample.meta["seed"] == 1
        assert sample.references and all(sample.references)
        assert sample.question.strip() and sample.context.strip()
        check_answers(task, sample)


@pytest.mark.parametrize("task", TASKS)
def test_default_generator_fits_and_places_answers(tokenizer, task: str) -> None:
    """The official fit and wonderwords keys: never over the budget, answers where the question says."""
    for sample in generate_default(task, tokenizer, 2048, 2, seed=1, data=DATA):
        assert count(tokenizer, prompt(sample)) == sample.meta["prompt_tokens"] <= 2048 - EXPECTED[family(task)][0]
        check_answers(task, sample)


def check_answers(task: str, sample: Sample) -> None:
    context = sample.context
    if task.startswith("niah"):
        singular = len(sample.references) == 1
        kind = "uuids" if task == "niah_single_3" or task == "niah_multikey_3" else "numbers"
        keys = sample.meta["keys"]
        for key in keys:
            assert key in sample.question and key in sample.answer_prefix
        found = []
        for key in keys:
            hits = re.findall(rf"One of the special magic {kind} for {re.escape(key)} is: ([\w-]+)\.", context)
            assert hits, f"no needle for {key}"
            found.extend(hits)
        assert sorted(found) == sorted(sample.references)
        unit = kind[:-1] if singular else kind
        assert sample.answer_prefix.startswith(f" The special magic {unit} for ")
        assert sample.answer_prefix.endswith(" is" if singular else " are")
        assert len(sample.meta["depths"]) == len(sample.references) * (4 if task == "niah_multikey_1" else 1)
        assert all(0 <= d <= 1 for d in sample.meta["depths"])
    elif task == "vt":
        names = sample.references
        assert len(names) == 5
        value = re.search(r"assigned the value (\d+) in the text above", sample.question).group(1)
        assert f"VAR {names[0]} = {value}" in context
        for a, b in itertools.pairwise(names):
            assert f"VAR {b} = VAR {a} " in context
        assert sample.answer_prefix.endswith(f"5 variables are assigned the value {value}, they are: ")
    elif task == "cwe":
        listing = context.rsplit("Memorize the ones that appear most often.\n", 1)[1]
        words = re.findall(r"\d+\. (\S+)", listing)
        counts = Counter(words)
        top = {w for w, _ in counts.most_common(10)}
        assert set(sample.references) == top
        assert min(counts[w] for w in top) > max(c for w, c in counts.items() if w not in top)
    elif task == "fwe":
        coded = context.split("Find the three most frequently appeared coded words. ", 1)[1].split()
        counts = Counter(coded)
        assert counts.most_common(1)[0][0] == "..."
        ranked = [w for w, _ in counts.most_common() if w != "..."]
        assert sample.references == ranked[:3]
    else:
        assert any(ref in context for ref in sample.references)
        assert "Document 1:\n" in context
        assert sample.answer_prefix == " Answer:"


def test_templates_match_ruler(tokenizer) -> None:
    (single,) = generate_default("niah_single_1", tokenizer, 1024, 1, seed=0)
    assert single.context.startswith(
        "A special magic number is hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the number afterwards.\n"
    )
    assert re.fullmatch(
        r"\nWhat is the special magic number for .+-.+ mentioned in the provided text\?", single.question
    )
    assert "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n" in (
        single.context
    )
    (multi,) = generate_default("niah_multivalue", tokenizer, 2048, 1, seed=0)
    assert multi.context.startswith("Some special magic numbers are hidden within the following text.")
    assert multi.question.startswith("\nWhat are all the special magic numbers for ")
    (qa,) = generate("qa_2", tokenizer, 1024, 1, seed=0, data=DATA)
    assert qa.context.startswith(
        "Answer the question based on the given documents. Only give me the answer and do not output any "
        "other words.\n\nThe following are given documents.\n\n"
    )
    assert qa.question.startswith("\n\nAnswer the question based on the given documents.")
    assert qa.question.endswith("\n\nQuestion: Which instrument is played by the founder of the Marrow Street Quartet?")
    (fwe,) = generate("fwe", tokenizer, 1024, 1, seed=0)
    assert fwe.answer_prefix == (
        " Answer: According to the coded text above, the three most frequently appeared words are:"
    )


def test_noise_needle_depth_matches_meta(tokenizer) -> None:
    for sample in generate("niah_single_1", tokenizer, 2048, 5, seed=3):
        lines = sample.context.split("\n")[1:]  # drop the preamble line
        index = next(i for i, line in enumerate(lines) if line.startswith("One of the special magic"))
        assert abs(index / len(lines) - sample.meta["depths"][0]) < 0.05


@pytest.mark.parametrize("fit", ["exact", "official"])
def test_deterministic_and_seed_sensitive(tokenizer, fit: str) -> None:
    generate = functools.partial(generate_default, fit=fit)
    for task in ("niah_single_1", "niah_single_2", "niah_multikey_2", "vt", "cwe", "fwe", "qa_1"):
        first = generate(task, tokenizer, 2048, 3, seed=7, data=DATA)
        again = generate(task, tokenizer, 2048, 3, seed=7, data=DATA)
        other = generate(task, tokenizer, 2048, 3, seed=8, data=DATA)
        assert [(s.context, s.question, s.references, s.meta) for s in first] == [
            (s.context, s.question, s.references, s.meta) for s in again
        ]
        assert [s.context for s in first] != [s.context for s in other], task
        assert len({s.context for s in first}) == 3, task  # samples differ within a run too


def test_unknown_task(tokenizer) -> None:
    with pytest.raises(ValueError, match="niah_single_1") as info:
        generate("niah_single_9", tokenizer, 1024, 1, seed=0)
    assert all(task in str(info.value) for task in TASKS)


def test_too_short_is_a_clear_error(tokenizer) -> None:
    with pytest.raises(ValueError, match="cannot fit in context_length=512"):
        generate("cwe", tokenizer, 512, 1, seed=0)


def test_qa_missing_files(tokenizer, tmp_path, monkeypatch) -> None:
    missing = RulerData(squad=tmp_path / "squad.json", hotpotqa=tmp_path / "hotpotqa.json", hub=False)
    for task, name in (("qa_1", "squad.json"), ("qa_2", "hotpotqa.json")):
        with pytest.raises(FileNotFoundError) as info:
            generate(task, tokenizer, 1024, 1, seed=0, data=missing)
        message = str(info.value)
        assert str(tmp_path / name) in message
        assert "python scripts/download_data.py ruler_qa" in message
    # the hub is tried only when allowed and online; a failure still ends in the same error
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    with pytest.raises(FileNotFoundError, match="ruler_qa"):
        generate("qa_1", tokenizer, 1024, 1, seed=0, data=RulerData(squad=tmp_path / "x.json"))
    # the other tasks do not need the QA files
    assert generate("niah_single_1", tokenizer, 1024, 1, seed=0, data=missing)


def test_qa_from_hub_rows(tokenizer, tmp_path, monkeypatch) -> None:
    """The hub layout (one row per question) is regrouped like the official JSON."""
    import datasets

    squad_rows = [
        {
            "title": "A",
            "context": "Alpha paragraph about the red kite.",
            "question": "Which kite?",
            "answers": {"text": ["red kite"], "answer_start": [25]},
        },
        {
            "title": "A",
            "context": "Alpha paragraph about the red kite.",
            "question": "Unanswerable?",
            "answers": {"text": [], "answer_start": []},
        },
        {
            "title": "A",
            "context": "Second alpha paragraph on a green door.",
            "question": "Which door?",
            "answers": {"text": ["green door"], "answer_start": [28]},
        },
    ]
    hotpot_rows = [
        {
            "question": "Who?",
            "answer": "Bo",
            "context": {"title": ["T1", "T2"], "sentences": [["Bo is here.", " Yes."], ["Other text."]]},
        },
    ]

    def fake(name, config=None, split=None):
        return squad_rows if "squad" in name else hotpot_rows

    monkeypatch.setattr(datasets, "load_dataset", fake)
    monkeypatch.setattr(ruler.qa_data, "hub_reachable", lambda: True)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    data = RulerData(squad=tmp_path / "s.json", hotpotqa=tmp_path / "h.json", hub=True)
    squad = ruler.load_qa("squad", data)
    assert [q.query for q in squad.questions] == ["Which kite?", "Which door?"]
    assert len(squad.docs) == 2 and squad.questions[0].related == [squad.questions[1].gold[0]]
    hotpot = ruler.load_qa("hotpotqa", data)
    assert hotpot.docs == ["T1\nBo is here. Yes.", "T2\nOther text."]
    assert hotpot.questions[0].answers == ["Bo"]


def test_qa_reads_official_layout() -> None:
    squad = ruler.load_qa("squad", DATA)
    # the impossible question is skipped; the others keep file order
    assert [q.query for q in squad.questions][:2] == [
        "Which river flows past Hollin Ford?",
        "What breed of sheep is kept in Larkspur Valley?",
    ]
    assert len(squad.questions) == 7
    first = squad.questions[0]
    assert first.answers == ["Tessel River", "the Tessel River"]
    assert len(first.related) == 1  # the other paragraph of the same article
    hotpot = ruler.load_qa("hotpotqa", DATA)
    assert len(hotpot.questions) == 3
    assert len(hotpot.docs) == 11  # one paragraph is shared by two questions
    assert all(len(q.gold) == 4 for q in hotpot.questions)


def test_essay_haystack_from_folder(tokenizer, tmp_path) -> None:
    folder = tmp_path / "essays"
    folder.mkdir()
    (folder / "b.txt").write_text("Second essay. " * 200)
    (folder / "a.txt").write_text("First essay starts here. It has sentences. " * 100)
    (sample,) = generate("niah_single_2", tokenizer, 1024, 1, seed=0, data=RulerData(haystack=folder))
    assert sample.meta["haystack"] == str(folder)
    assert "First essay starts here." in sample.context
    (default,) = generate("niah_single_2", tokenizer, 1024, 1, seed=0)
    assert default.meta["haystack"] == "austen_emma"
    assert "Emma Woodhouse" in default.context


def test_short_haystack_is_repeated(tokenizer, tmp_path) -> None:
    """A haystack shorter than the requested length is repeated, as RULER does."""
    essay = tmp_path / "tiny.txt"
    essay.write_text("A short essay. It ends soon.\n")
    (sample,) = generate("niah_single_2", tokenizer, 1024, 1, seed=0, data=RulerData(haystack=essay))
    assert sample.context.count("A short essay. It ends soon.") > 10
    assert 1024 - 128 - 8 <= sample.meta["prompt_tokens"] <= 1024 - 128


def test_sentence_starts() -> None:
    words, starts = ruler.essay_words_and_starts(ruler.parse_essay('Mr. Knightley came. He said "No." Then left.'), 16)
    assert words[:3] == ["Mr.", "Knightley", "came."]
    assert starts == [0, 3, 6, 8, 11, 14]  # "Mr." is no sentence end; the text repeats after 8 words


def test_tasks_list() -> None:
    assert TASKS == (
        "niah_single_1",
        "niah_single_2",
        "niah_single_3",
        "niah_multikey_1",
        "niah_multikey_2",
        "niah_multikey_3",
        "niah_multivalue",
        "niah_multiquery",
        "vt",
        "cwe",
        "fwe",
        "qa_1",
        "qa_2",
    )
