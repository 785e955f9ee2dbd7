"""Prompt assembly: raw and chat-templated prompts, the context/query split, middle truncation."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from restkv.eval.benchmarks.contract.base import Sample
from restkv.eval.evaluation.prompting import tokenize, truncate_middle
from restkv.eval.models.loading import resolve

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve("models/tiny-random-llama"))


def sample(**changes) -> Sample:
    fields = {
        "id": "s",
        "task": "t",
        "context": "Once upon a time there was a long story. " * 20,
        "question": "\nWho was there?",
        "answer_prefix": " Answer:",
        "references": ["x"],
        "max_new_tokens": 8,
        "metric": "string_match_all",
    }
    return Sample(**(fields | changes))


def test_truncate_middle_keeps_head_and_tail() -> None:
    assert truncate_middle(list(range(10)), 4) == [0, 1, 8, 9]
    assert truncate_middle(list(range(10)), 5) == [0, 1, 7, 8, 9]
    assert truncate_middle(list(range(3)), 5) == [0, 1, 2]


def test_raw_prompt_split(tokenizer) -> None:
    s = sample()
    prompt = tokenize(s, tokenizer, chat=True, max_context=10_000)  # no chat template on this tokenizer
    # the tokenizer adds its beginning-of-text token, as the micro model's does
    assert tokenizer.decode(prompt.context, skip_special_tokens=True) == s.context
    assert tokenizer.decode(prompt.query, skip_special_tokens=True) == s.question + s.answer_prefix
    assert prompt.truncated == 0


def test_chat_template_wraps_the_whole_prompt_and_splits_after_the_context(tokenizer) -> None:
    tokenizer = AutoTokenizer.from_pretrained(resolve("models/tiny-random-llama"))
    tokenizer.chat_template = CHAT_TEMPLATE
    s = sample(system_prompt="Be brief.")
    prompt = tokenize(s, tokenizer, chat=True, max_context=10_000)
    context, query = (tokenizer.decode(part, skip_special_tokens=True) for part in (prompt.context, prompt.query))
    assert context.startswith("<|system|>Be brief.<|end|><|user|>Once upon a time")
    assert query == "\nWho was there?<|end|><|assistant|> Answer:"
    raw = tokenize(sample(chat_template=False), tokenizer, chat=True, max_context=10_000)
    assert tokenizer.decode(raw.context, skip_special_tokens=True).startswith("Once upon")


def test_long_prompt_is_cut_in_the_middle_as_longbench_does(tokenizer) -> None:
    s = sample()
    full = tokenize(s, tokenizer, chat=False, max_context=10_000)
    whole = full.context + full.query
    cut = tokenize(s, tokenizer, chat=False, max_context=100)
    assert cut.length == 100 and cut.truncated == len(whole) - 100
    assert cut.context + cut.query == whole[:50] + whole[-50:]
    assert cut.query == full.query  # the question survives whole in the kept tail


def test_query_longer_than_the_tail_is_cut_too(tokenizer) -> None:
    s = sample(question="\nWho " + "really " * 60 + "was there?")
    full = tokenize(s, tokenizer, chat=False, max_context=10_000)
    cut = tokenize(s, tokenizer, chat=False, max_context=40)
    assert len(cut.context) == 20 and cut.query == (full.context + full.query)[-20:]


def test_max_context_must_leave_room(tokenizer) -> None:
    with pytest.raises(ValueError, match="max_context=1 must be >= 2"):
        tokenize(sample(), tokenizer, chat=False, max_context=1)
