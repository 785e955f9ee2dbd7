"""Needle-in-a-Haystack generation and heatmap; haystack loading."""

from __future__ import annotations

from pathlib import Path

import pytest
from _tokenizer import tokenizer_fixture  # noqa: F401

from restkv.eval.benchmarks import niah
from restkv.eval.benchmarks.shared import haystack

LENGTHS = [1000, 2000, 4000]


def count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.fixture(scope="module")
def samples(tokenizer):
    return niah.generate(tokenizer, LENGTHS, niah.depth_percent_grid())


def test_grid_and_fields(samples) -> None:
    assert len(samples) == len(LENGTHS) * 10
    assert [(s.meta["context_length"], s.meta["depth_percent"]) for s in samples[:3]] == [
        (1000, 0.0),
        (1000, 11.0),
        (1000, 22.0),
    ]
    for sample in samples:
        assert sample.task == "niah"
        assert sample.metric == "niah_rouge"
        assert sample.max_new_tokens == 30
        assert sample.references == [
            "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."
        ]
        assert sample.context.count(niah.NEEDLE.strip()) == 1
        assert sample.meta["haystack"] == "austen_emma"
        assert sample.chat_template is True
        assert sample.question == (
            "\n\nThe best thing to do in San Francisco is:  Don't give information outside the document or "
            "repeat your findings. The document definitely contains the answer, and I'm 100% sure. So try your "
            "best to find it."
        )
        assert sample.system_prompt.startswith("You are a helpful AI bot")


def test_lengths(tokenizer, samples) -> None:
    for sample in samples:
        length = sample.meta["context_length"]
        assert sample.meta["context_tokens"] == length - niah.FINAL_CONTEXT_LENGTH_BUFFER
        document = count(tokenizer, sample.context)
        assert abs(document - (length - niah.FINAL_CONTEXT_LENGTH_BUFFER)) <= 5
        total = count(tokenizer, sample.context + sample.question + sample.answer_prefix)
        assert total == sample.meta["prompt_tokens"]
        assert total + sample.max_new_tokens <= length


def test_depth_placement(tokenizer, samples) -> None:
    for sample in samples:
        depth = sample.meta["depth_percent"] / 100
        start = sample.context.index(niah.NEEDLE.strip())
        before = count(tokenizer, sample.context[:start])
        total = count(tokenizer, sample.context)
        position = before / total
        # at or just before the requested depth: moved back to the previous sentence end
        assert position <= depth + 0.01
        assert depth * total - before <= 160  # longest sentence in the text, in test tokens
        if sample.meta["context_length"] >= 4000:
            assert abs(position - depth) < 0.05
        if depth == 1.0:
            assert sample.context.endswith(niah.NEEDLE.rstrip("\n") + "\n") or sample.context.rstrip().endswith(
                niah.NEEDLE.strip()
            )
        elif before > 2:
            assert sample.context[:start].rstrip().rstrip("\"'”’)]").endswith(".")


def test_book_format(tokenizer) -> None:
    (sample,) = niah.generate(tokenizer, [1200], [50], prompt_format="book")
    assert sample.context.startswith("<|im_start|> This is a very long story book: <book> ")
    assert sample.context.endswith(" </book>.")
    assert (
        sample.question == "\n Based on the content of the book, Question: The best thing to do in San Francisco is: "
    )
    assert sample.answer_prefix == "\nAnswer:"
    assert sample.chat_template is False
    assert sample.meta["prompt_tokens"] + 30 <= 1200


def test_grids() -> None:
    assert niah.depth_percent_grid() == [0, 11, 22, 33, 44, 56, 67, 78, 89, 100]
    lengths = niah.context_length_grid()
    assert lengths[0] == 1000 and lengths[-1] == 32000 and len(lengths) == 156


def test_errors(tokenizer, tmp_path) -> None:
    with pytest.raises(ValueError, match="too short"):
        niah.generate(tokenizer, [150], [50])
    with pytest.raises(ValueError, match="depth"):
        niah.generate(tokenizer, [1000], [120])
    with pytest.raises(FileNotFoundError, match="paul_graham"):
        niah.generate(tokenizer, [1000], [50], haystack=tmp_path / "PaulGrahamEssays")


def test_essay_folder_and_repetition(tokenizer, tmp_path) -> None:
    folder = tmp_path / "essays"
    folder.mkdir()
    (folder / "02.txt").write_text("Second file text. It is short.")
    (folder / "01.txt").write_text("First file text. Also short.")
    (sample,) = niah.generate(tokenizer, [600], [50], haystack=folder)
    assert sample.meta["haystack"] == str(folder)
    assert sample.context.startswith("First file text. Also short.\nSecond file text.")
    assert sample.context.count("Second file text.") > 5  # repeated up to the length


def test_heatmap(tmp_path) -> None:
    results = [
        {"context_length": length, "depth_percent": depth, "score": (length // 1000 + depth / 50) % 2 / 2}
        for length in LENGTHS
        for depth in niah.depth_percent_grid()
    ]
    results.append({"context_length": 1000, "depth_percent": 0.0, "score": 1.0})  # a repeated cell
    path = tmp_path / "plots" / "niah.png"
    niah.heatmap(results, path, title="test")
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 5000
    with pytest.raises(ValueError):
        niah.heatmap([], tmp_path / "empty.png")


# --- haystack loading -------------------------------------------------------------------------


def test_bundled_haystacks() -> None:
    evaluation = haystack.load_haystack(None)
    assert evaluation == haystack.load_haystack("austen_emma") == haystack.load_haystack("eval")
    training = haystack.load_haystack("train")
    assert evaluation.startswith("EMMA") and training.startswith("PRIDE AND PREJUDICE")
    assert 300_000 < len(evaluation.encode()) < 1_500_000
    assert 300_000 < len(training.encode()) < 1_500_000
    assert "Gutenberg" not in evaluation and "Gutenberg" not in training
    assert (haystack.HAYSTACK_DIR / "SOURCES.md").is_file()


def test_load_from_paths(tmp_path) -> None:
    folder = tmp_path / "essays"
    folder.mkdir()
    (folder / "b.txt").write_text("beta")
    (folder / "a.txt").write_text("alpha")
    (folder / "ignored.md").write_text("not text")
    assert haystack.load_haystack(folder) == "alpha\nbeta"
    assert haystack.load_haystack(str(folder / "b.txt")) == "beta"
    with pytest.raises(FileNotFoundError) as info:
        haystack.load_haystack(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(info.value)
    assert "python scripts/download_data.py paul_graham" in str(info.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"no \.txt files"):
        haystack.load_haystack(empty)


def test_haystack_names() -> None:
    assert haystack.haystack_name(None) == "austen_emma"
    assert haystack.haystack_name("train") == "austen_pride_and_prejudice"
    assert haystack.haystack_name(Path("/x/essays")) == "/x/essays"
