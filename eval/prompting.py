"""From a `Sample` to token ids: chat template, the context/query split, middle truncation."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from eval.benchmarks.base import Sample


@dataclass
class PromptTokens:
    """The prompt as two token lists.

    ``context`` is what the ``query_agnostic`` protocol compresses alone; ``query`` (question,
    chat suffix, answer prefix) is appended after eviction. ``query_aware`` compresses both.
    ``truncated`` counts the context tokens cut from the middle.
    """

    context: list[int]
    query: list[int]
    truncated: int = 0

    @property
    def length(self) -> int:
        return len(self.context) + len(self.query)


def render(sample: Sample, tokenizer: PreTrainedTokenizerBase, chat: bool) -> tuple[str, str, bool]:
    """The prompt text split into (context part, query part), and whether it starts with BOS text."""
    if not (chat and sample.chat_template and tokenizer.chat_template):
        return sample.context, sample.question + sample.answer_prefix, False
    user = sample.context + sample.question
    messages = [{"role": "system", "content": sample.system_prompt}] if sample.system_prompt else []
    messages.append({"role": "user", "content": user})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    at = text.find(user)
    if at < 0:
        raise ValueError(f"the chat template of {tokenizer.name_or_path} altered the prompt of sample {sample.id}")
    split = at + len(sample.context)
    return text[:split], text[split:] + sample.answer_prefix, True


def truncate_middle(ids: list[int], keep: int) -> list[int]:
    """Keep the first ``keep // 2`` and last ``keep - keep // 2`` tokens, as LongBench does."""
    if len(ids) <= keep:
        return ids
    head = keep // 2
    return ids[:head] + ids[len(ids) - (keep - head) :]


def tokenize(sample: Sample, tokenizer: PreTrainedTokenizerBase, chat: bool, max_context: int) -> PromptTokens:
    """Token ids of ``sample``; the context is cut in the middle so prompt + answer fit ``max_context``."""
    context_text, query_text, templated = render(sample, tokenizer, chat)
    context = tokenizer(context_text, add_special_tokens=not templated)["input_ids"]
    query = tokenizer(query_text, add_special_tokens=False)["input_ids"] if query_text else []
    room = max_context - sample.max_new_tokens - len(query)
    if room < 1:
        raise ValueError(
            f"sample {sample.id}: the query ({len(query)} tokens) and answer ({sample.max_new_tokens}) leave no room "
            f"for context in max_context={max_context}"
        )
    kept = truncate_middle(context, room)
    return PromptTokens(context=kept, query=query, truncated=len(context) - len(kept))
