"""`Sample`: one prompt as plain data, the contract between benchmarks, prompting and the runner.

It lives below the benchmarks so that prompting and evaluation depend on the data, not on the
benchmark modules that produce it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Sample:
    """One prompt to answer.

    The prompt is ``context + question + answer_prefix``. The split matters for the two
    evaluation protocols: ``query_aware`` compresses the whole prompt (the observation window
    sees the question); ``query_agnostic`` compresses ``context`` alone and appends
    ``question + answer_prefix`` after eviction. ``context`` is also the part that is
    truncated from the middle when a prompt exceeds the model's context. ``system_prompt`` is
    given to the chat template as a system message (ignored without a chat template);
    ``chat_template=False`` asks for the raw prompt even with a chat model.
    """

    id: str
    task: str
    context: str
    question: str
    references: list[str]
    max_new_tokens: int
    metric: str
    answer_prefix: str = ""
    system_prompt: str = ""
    chat_template: bool = True
    meta: dict[str, Any] = field(default_factory=dict)
