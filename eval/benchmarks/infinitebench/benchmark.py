"""InfiniteBench (Zhang et al., 2024, "∞Bench"), the 12 tasks the ReST-KV authors ran, from the official files.

Tasks, prompts, generation lengths and metrics
    The prompt templates are the official ones for open models (``yarn_mistral_templates`` in
    ``src/prompt.py`` of OpenBMB/InfiniteBench, used there for YaRN-Mistral, Yi-200K and
    ChatGLM3), reproduced exactly; the ReST-KV authors' ``run_infinite_bench.py`` carries an
    identical copy. They are filled as the official ``create_prompt`` does: ``code_run`` takes the
    function call ``func_<n>(<x>)`` found in ``input``, ``math_find`` asks "What is <the ... number>
    in the following list?" from the ``The ... of`` phrase of ``input``, the multiple-choice tasks
    fill ``OPTION_A``..``OPTION_D`` from ``options``.

    Generation lengths (``generation_lengths`` knob): ``authors`` (default, reproduces the paper)
    uses the authors' ``dataset2maxlen``, which differs from the official
    ``DATA_NAME_TO_MAX_NEW_TOKENS`` (``official``) for three tasks: passkey 15 (official 6),
    number_string 20 (12), kv_retrieval 80 (50); the other nine are equal (longbook_sum_eng 1200,
    math_calc 30000, ...).

    Scorers: ``infbench_<task>`` of :mod:`restkv.eval.benchmarks.infinitebench.metrics` (the official
    ``compute_scores.py``). The references are built as the official ``get_answer`` does:
    ``[answer_text, letter]`` for longbook_choice_eng and code_debug; the answer list otherwise,
    each value passed through ``str`` (math_find: the JSON number; math_calc: one string per
    expected value, the list unwrapped when nested as in the official file; code_run: the integer).

Context / question split
    The template is cut at ``{context}``: ``Sample.context`` is the template head plus the
    record's context (compressed alone under ``query_agnostic``, cut from the middle when too
    long), ``Sample.question`` the rest with the question, options or cue filled in.
    ``context + question`` is the official prompt.

Chat template (``chat_template`` knob)
    ``authors`` (default): the authors' raw prompt, wrapped as ``"[INST] {prompt} [/INST]"`` for
    Llama-2 models only (see :mod:`restkv.eval.benchmarks.longbench.benchmark`); ``official``: the official harness
    feeds open models the raw prompt, so no chat template; ``none``: raw; ``chat``: the model's
    chat template on every task.

Truncation
    As the authors do, the whole prompt is cut to its first and last ``max_context // 2``
    tokens (``model.max_context``: 127000 for Llama-3.1, their ``model2maxlen``); official
    InfiniteBench cuts to 128k tokens. See :mod:`restkv.eval.evaluation.prompting`.

Data
    ``<task>.jsonl`` files as in the hub repository ``xinrongzhang2022/InfiniteBench`` (one per
    task), read from ``data_dir`` (default ``data/InfiniteBench``, fetched by
    ``python scripts/download_data.py infinitebench``); when a file is missing, ``hub`` is true
    and the hub answers, that file is downloaded with ``huggingface_hub``. Fields: ``id`` (int),
    ``context`` (str), ``input`` (str), ``answer`` (list, or a bare value: str for text tasks,
    int/float for math_find and code_run, a list of ints for math_calc) and ``options`` (list of
    str; required, four of them, for the two multiple-choice tasks).

Bad input raises before anything is generated (finished predictions are untouched):
:class:`~restkv.eval.benchmarks.shared.jsonl.DataFileError` with ``file:line``, task and field; ``ValueError``
listing the valid tasks for an unknown one; ``FileNotFoundError`` listing every missing file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from restkv.checks import check_choice
from restkv.eval.benchmarks.contract.base import Sample
from restkv.eval.benchmarks.contract.metrics import score as score_metric
from restkv.eval.benchmarks.shared.jsonl import (
    DataFileError,
    Field,
    JsonlSource,
    all_items,
    open_jsonl,
    resolve_path,
    task_records,
)
from restkv.eval.benchmarks.shared.official import (
    cap_new_tokens,
    check_loader_knobs,
    check_task_files,
    is_llama2,
    load_task_files,
    wrap_llama2,
)
from restkv.eval.models.hub import download_dataset_file

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

HUB_REPO = "xinrongzhang2022/InfiniteBench"
DEFAULT_DATA_DIR = "data/InfiniteBench"

TASKS: tuple[str, ...] = (
    "passkey",
    "number_string",
    "kv_retrieval",
    "longbook_sum_eng",
    "longbook_choice_eng",
    "longbook_qa_eng",
    "longbook_qa_chn",
    "longdialogue_qa_eng",
    "math_find",
    "math_calc",
    "code_run",
    "code_debug",
)
"""The 12 tasks of the authors' ``run_infinite_bench.py`` / ``eval_infinite.py``."""

CHOICE_TASKS: frozenset[str] = frozenset({"longbook_choice_eng", "code_debug"})
GENERATION_LENGTHS: tuple[str, ...] = ("authors", "official")

# src/prompt.py `yarn_mistral_templates` (official, open models) == the authors' `data2prompt`.
PROMPTS: dict[str, str] = {
    "passkey": (
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz "
        "you about the important information.\n\n{context}\n\n{input}\n\nThe pass key is"
    ),
    "number_string": (
        "There is an important info hidden inside a lot of irrelevant text. Find it. I will quiz you about the "
        "important information there.\n\n{context}\n\n{input}\n\nThe sequence of digits is"
    ),
    "kv_retrieval": (
        "Extract the value corresponding to the specified key in the JSON object below.\n\n{context}\n\n{input}"
    ),
    "longbook_sum_eng": "Summarize the book below.\n\n{context}\n\nSummary:",
    "longbook_choice_eng": (
        "Read the book and answer the question.\n\n{context}\n\nQuestion: {question}\nA. {OPTION_A}\nB. {OPTION_B}\n"
        "C. {OPTION_C}\nD. {OPTION_D}\n\nThe letter of the correct answer is"
    ),
    "longbook_qa_eng": (
        "Read the book and answer the question. Be very concise in your answer.\n\n{context}\n\n"
        "Question: {question}\nAnswer:"
    ),
    "longbook_qa_chn": "阅读以下书籍然后回答问题。\n\n{context}\n\n问题：{question}\n答案：",
    "math_find": "{prefix}\n\n{context}\n\n{input}",
    "math_calc": (
        "Let us calculate the intermediate values of an expression.\n\nExpression: 1 + 3 + 4\nValues: [1, 4, 8]\n\n"
        "Expression: 8 - 3 + 2 - 4\nValues: [8, 5, 7, 3]\n\nExpression: {context}\nValues:"
    ),
    "code_run": (
        "There is a function called {func} in the following Python code.\n\n{context}\n\n"
        "Please compute the exact value of {func_call}. The value of {func_call} is"
    ),
    "code_debug": (
        "Following is a Python code where exactly one of the functions/methods has a deliberate error that makes it "
        "crash.\n\n{context}\n\nOptions:\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\n"
        "The correct option is:"
    ),
    "longdialogue_qa_eng": (
        'Below is a dialogue script where one random occurrence of a character name is replaced with "$$MASK$$", '
        "and you should try to guess who that character is.\n\n{context}\n\n"
        "The name that has been replaced with $$MASK$$ is likely"
    ),
}

# The authors' run_infinite_bench.py `dataset2maxlen`.
AUTHORS_MAX_NEW_TOKENS: dict[str, int] = {
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

# Official src/eval_utils.py `DATA_NAME_TO_MAX_NEW_TOKENS`.
OFFICIAL_MAX_NEW_TOKENS: dict[str, int] = {
    **AUTHORS_MAX_NEW_TOKENS,
    "passkey": 6,
    "number_string": 12,
    "kv_retrieval": 50,
}

_CODE_RUN_CALL = re.compile(r"func_[0-9]+\(\-?[0-9]+\)")
_MATH_FIND_TARGET = re.compile(r"The .+ of")

_FIELDS: dict[str, Field] = {
    "id": Field((int, str), "an integer id", nonempty=True),
    "context": Field((str,), "a string"),
    "input": Field((str,), "a string"),
    "answer": Field((list, str, int, float), "a list of answers (or one answer)"),
    "options": Field((list,), "a list of strings", required=False),
}


def max_new_tokens(task: str, generation_lengths: str = "authors") -> int:
    """The generation length of ``task`` under the ``authors`` or ``official`` table."""
    table = AUTHORS_MAX_NEW_TOKENS if generation_lengths == "authors" else OFFICIAL_MAX_NEW_TOKENS
    return table[task]


def check_tasks(tasks: list[str] | tuple[str, ...]) -> list[str]:
    """``tasks`` (``all`` expands to the 12); raises ``ValueError`` listing the valid names otherwise."""
    out: list[str] = []
    for task in tasks:
        if task == "all":
            out.extend(TASKS)
        elif task in PROMPTS:
            out.append(task)
        else:
            raise ValueError(f"unknown InfiniteBench task {task!r}; valid tasks: {', '.join(TASKS)} (alias: all)")
    return list(dict.fromkeys(out))


def _fail(where: str, line: int, task: str, message: str) -> DataFileError:
    return DataFileError(f"{where}:{line}: InfiniteBench task {task!r}: {message}")


def _options(record: dict[str, Any], task: str, where: str, line: int) -> list[str]:
    options = record.get("options")
    if options is None:
        raise _fail(where, line, task, "missing field 'options' (the four answer options)")
    if len(options) < 4 or not all_items(options, (str,)):
        raise _fail(where, line, task, f"field 'options' must list four strings, got {options!r:.80}")
    return options


def format_fields(task: str, record: dict[str, Any], where: str = "<data>", line: int = 0) -> dict[str, str]:
    """The values the official ``create_prompt`` puts into the template of ``task`` (context excluded)."""
    text = record["input"]
    if task == "code_run":
        found = _CODE_RUN_CALL.findall(text)
        if not found:
            raise _fail(where, line, task, f"field 'input' has no function call like func_1(-2): {text[:80]!r}")
        return {"func": found[0].split("(")[0], "func_call": found[0]}
    if task == "math_find":
        found = _MATH_FIND_TARGET.findall(text)
        if not found:
            raise _fail(where, line, task, f"field 'input' has no 'The ... of' phrase: {text[:80]!r}")
        target = found[0].lower()[:-3]
        return {"prefix": f"What is {target} in the following list?", "input": text}
    if task in CHOICE_TASKS:
        options = _options(record, task, where, line)
        letters = {f"OPTION_{letter}": options[i] for i, letter in enumerate("ABCD")}
        return {"question": text, **letters} if task == "longbook_choice_eng" else letters
    if task in ("longbook_qa_eng", "longbook_qa_chn"):
        return {"question": text}
    return {"input": text}


def split_prompt(task: str, record: dict[str, Any], where: str = "<data>", line: int = 0) -> tuple[str, str]:
    """The official prompt of ``record`` cut after its context: ``(head + context, rest)``."""
    values = format_fields(task, record, where, line)
    head, tail = PROMPTS[task].split("{context}")
    return head.format(**values) + record["context"], tail.format(**values)


def references(task: str, record: dict[str, Any], where: str = "<data>", line: int = 0) -> list[str]:
    """The reference list the ``infbench_<task>`` scorer expects (official ``get_answer``, as strings)."""
    answer = record["answer"]
    if task in CHOICE_TASKS:
        options = _options(record, task, where, line)
        if isinstance(answer, list) and len(answer) == 2 and answer[1] in ("A", "B", "C", "D"):
            return [str(answer[0]), answer[1]]
        text = answer[0] if isinstance(answer, list) and len(answer) == 1 else answer
        if not isinstance(text, str) or text not in options:
            raise _fail(where, line, task, f"field 'answer' must be one of the options, got {answer!r:.80}")
        return [text, "ABCD"[options.index(text)]]
    if task == "math_calc":
        values = answer[0] if isinstance(answer, list) and answer and isinstance(answer[0], list) else answer
        if not isinstance(values, list) or not values or not all_items(values, (int,)):
            raise _fail(where, line, task, f"field 'answer' must be the list of integer values, got {answer!r:.80}")
        return [str(v) for v in values]
    values = answer if isinstance(answer, list) else [answer]
    if not values:
        raise _fail(where, line, task, "field 'answer' is empty")
    if task in ("math_find", "code_run"):
        kinds: tuple[type, ...] = (int, float, str) if task == "math_find" else (int, str)
        if not all_items(values, kinds):
            raise _fail(where, line, task, f"field 'answer' must hold a number, got {answer!r:.80}")
    elif not all_items(values, (str, int)):
        raise _fail(where, line, task, f"field 'answer' must hold strings, got {answer!r:.80}")
    return [str(v) for v in values]


@dataclass
class InfiniteBenchBenchmark:
    """InfiniteBench tasks from the official jsonl files (see the module docstring).

    ``tasks``: task names or ``all`` (the 12 the authors ran, the default). ``samples``: at most
    this many samples per task (the first ones); ``None`` runs all. ``max_new_tokens_cap``: lowers
    every generation length to at most this (quick CPU checks only).
    """

    tasks: list[str] = field(default_factory=lambda: ["all"])
    data_dir: str = DEFAULT_DATA_DIR
    hub: bool = True
    chat_template: str = "authors"
    generation_lengths: str = "authors"
    samples: int | None = None
    max_new_tokens_cap: int | None = None
    name: str = "infinitebench"

    def __post_init__(self) -> None:
        self.tasks = check_tasks(self.tasks)
        check_loader_knobs("InfiniteBench", self.tasks, self.chat_template, self.samples, self.max_new_tokens_cap)
        check_choice("bench", "generation_lengths", self.generation_lengths, GENERATION_LENGTHS)

    def check_data(self) -> None:
        """Missing task files the hub cannot supply, refused before any model loads."""
        check_task_files(
            self.tasks,
            resolve_path(self.data_dir),
            lambda task: f"{task}.jsonl",
            hub=self.hub,
            benchmark="InfiniteBench",
            dataset="infinitebench",
        )

    def load_samples(self, tokenizer: PreTrainedTokenizerBase | Any) -> list[Sample]:
        wrap_inst = self.chat_template == "authors" and is_llama2(tokenizer)
        return load_task_files(
            self.tasks,
            resolve_path(self.data_dir),
            lambda task: f"{task}.jsonl",
            lambda task, source: self._task_samples(task, source, wrap_inst),
            fallback=_HubFiles() if self.hub else None,
            benchmark="InfiniteBench",
            dataset="infinitebench",
        )

    def _task_samples(self, task: str, source: JsonlSource, wrap_inst: bool) -> list[Sample]:
        """The first ``samples`` records of one task's file as samples of the official prompt."""
        max_new = cap_new_tokens(max_new_tokens(task, self.generation_lengths), self.max_new_tokens_cap)
        out: list[Sample] = []
        for line, record in task_records(
            source, _FIELDS, benchmark="InfiniteBench", task=task, id_field="id", limit=self.samples
        ):
            refs = references(task, record, source.where, line)
            context, question = split_prompt(task, record, source.where, line)
            if wrap_inst:
                context, question = wrap_llama2(context, question)
            out.append(
                Sample(
                    id=f"infinitebench/{task}/{record['id']}",
                    task=task,
                    context=context,
                    question=question,
                    references=refs,
                    max_new_tokens=max_new,
                    metric=f"infbench_{task}",
                    chat_template=self.chat_template == "chat",
                    meta={
                        "benchmark": "infinitebench",
                        "chat_template": self.chat_template,
                        "source": f"{source.where}:{line}",
                    },
                )
            )
        return out

    def score(self, sample: Sample, prediction: str) -> float:
        return score_metric(sample.metric, prediction, sample.references)


class _HubFiles:
    """The :class:`~restkv.eval.benchmarks.shared.official.FileFallback` of a load: each missing task file from the
    hub."""

    def __init__(self) -> None:
        self.failure = ""

    def open(self, file_name: str) -> JsonlSource | None:
        path, reason = fetch_task_file(file_name.removesuffix(".jsonl"))
        if path is None:
            self.failure = self.failure or reason
            return None
        return open_jsonl(path)


def fetch_task_file(task: str) -> tuple[Path | None, str]:
    """Download (or find in the hub cache) ``<task>.jsonl``; ``(path, "")`` or ``(None, reason)``."""
    return download_dataset_file(HUB_REPO, f"{task}.jsonl")
