"""From a `Sample` to token ids: chat template, the context/query split, middle truncation."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from restkv.eval.benchmarks.contract.sample import Sample


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
    """Token ids of ``sample``, cut in the middle to at most ``max_context`` tokens.

    As LongBench and the ReST-KV authors do, a prompt longer than ``max_context`` keeps its
    first ``max_context // 2`` and its last ``max_context - max_context // 2`` tokens; the
    answer's tokens are not reserved (the model configs' ``max_context`` leave room, like the
    authors' limits). The query (question, chat suffix, answer prefix) stays whole as long as it
    fits in the kept tail. Unlike the authors, who decode the two halves and tokenize again, the
    cut is made on token ids, and context and query are tokenized separately.
    """
    if max_context < 2:
        raise ValueError(f"max_context={max_context} must be >= 2")
    context_text, query_text, templated = render(sample, tokenizer, chat)
    context = tokenizer(context_text, add_special_tokens=not templated)["input_ids"]
    query = tokenizer(query_text, add_special_tokens=False)["input_ids"] if query_text else []
    whole = context + query
    if len(whole) <= max_context:
        return PromptTokens(context=context, query=query)
    kept = truncate_middle(whole, max_context)
    tail = max_context - max_context // 2
    split = len(kept) - len(query) if len(query) <= tail else max_context // 2
    return PromptTokens(context=kept[:split], query=kept[split:], truncated=len(whole) - len(kept))
