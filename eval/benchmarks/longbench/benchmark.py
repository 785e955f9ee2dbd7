"""LongBench v1 (Bai et al., 2023) and LongBench-E, from the official data files.

Tasks, prompts, generation lengths and metrics
    The per-task prompt templates and maximum new tokens are those of the official
    ``LongBench/config/dataset2prompt.json`` and ``dataset2maxlen.json`` (THUDM/LongBench), reproduced character for
    character, typos included ("asconcisely"). The ReST-KV authors' ``run_longbench.py`` carries identical copies of
    both tables. The metric per task is the one of the official ``eval.py`` (``dataset2metric``), computed by
    :mod:`restkv.eval.benchmarks.longbench.metrics`; the official first-line clean-up of trec/triviaqa/samsum/lsht
    predictions is applied before scoring. A task's score is the mean over its samples of the best score over its
    references (x100); the headline number is the unweighted mean of the 16 English task scores.

Context / question split
    The official prompt is ``template.format(**record)``. The template is cut at ``{context}``: ``Sample.context``
    is the template head plus the record's context (the part compressed alone by the ``query_agnostic`` protocol and
    cut from the middle when too long); ``Sample.question`` is the rest of the template with ``{input}`` filled in.
    ``context + question`` is exactly the official prompt; ``answer_prefix`` is empty (the templates end with their
    own cue, such as ``"Answer:"``).

Chat template (``chat_template`` knob)
    * ``authors`` (default): what the ReST-KV authors ran, hence what reproduces the paper's
      tables. Their ``run_longbench.py`` applies no chat template to any model; it only wraps
      the whole prompt as ``"[INST] {prompt} [/INST]"`` when the model path contains "llama2".
      Here the wrapper is applied when the tokenizer's name or path contains "llama2" or
      "llama-2" (the hub id ``meta-llama/Llama-2-7b-chat-hf`` contains only the latter; the
      authors' ``model2maxlen`` table lists both spellings). Llama-3, Mistral and Qwen get the
      raw prompt.
    * ``official``: official LongBench: the model's chat template for every task except the
      few-shot and code tasks (trec, triviaqa, samsum, lsht, lcc, repobench-p), which get the raw
      prompt ("chat models are better off without build prompts on these tasks", ``pred.py``).
      The official script uses hand-written per-model wrappers; here the tokenizer's own chat
      template is used.
    * ``none``: the raw prompt everywhere. ``chat``: the chat template everywhere.

    The chat template itself is applied by :mod:`restkv.eval.evaluation.prompting` when the model config has
    ``chat_template: true``; this module only sets ``Sample.chat_template`` per sample.

    Official ``pred.py`` also stops samsum generation at the first newline token; the authors do not, and neither
    does this harness (the first-line clean-up makes the score the same unless the answer starts with a newline).

Truncation (done by :mod:`restkv.eval.evaluation.prompting`)
    As official LongBench and the authors do, a prompt of more than ``model.max_context`` tokens keeps its first and
    last ``max_context // 2`` tokens, with no room reserved for the answer (official LongBench cuts before adding
    its chat wrapper, the authors after their ``[INST]`` wrapper; here the cut is made on the final prompt, chat
    template included). The cut is made on token ids (the authors decode the halves and tokenize again).

Data
    One JSON-lines file per task, named as in the official ``data.zip`` (``<task>.jsonl``; LongBench-E:
    ``<task>_e.jsonl``), read from ``data_dir`` (default ``data/LongBench``, fetched by ``python
    scripts/download_data.py longbench longbench_e``). When a file is missing and ``hub`` is true and the Hugging
    Face hub answers, the official ``data.zip`` of ``THUDM/LongBench`` is downloaded with ``huggingface_hub`` and
    the file read from it (``datasets`` >= 4 no longer runs the repository's loading script, so the archive is read
    directly). Each line must have the official fields; the ones used are checked: ``input`` (str), ``context``
    (str), ``answers`` (list of str), ``length`` (int), ``all_classes`` (list of str or null; a list for trec/lsht)
    and ``_id`` (str); ``dataset`` and ``language`` are kept in the sample metadata when present.

LongBench-E (``longbench_e: true``)
    The 13 tasks with a more uniform length distribution; scored like LongBench, and ``metrics.json`` also gets each
    task's score in the official length buckets of the ``length`` field (0-4k: < 4000, 4-8k: < 8000, 8k+), and the
    average over tasks per bucket.

Bad input raises before anything is generated, so a run folder's finished predictions are never
touched: a malformed line or a missing/mistyped field raises
:class:`~restkv.eval.benchmarks.shared.jsonl.DataFileError` with ``file:line`` and the task; an unknown task
raises ``ValueError`` listing the valid ones; missing files raise ``FileNotFoundError`` listing
every missing file and how to get them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from restkv.eval.benchmarks.contract.base import Sample
from restkv.eval.benchmarks.contract.metrics import score as score_metric
from restkv.eval.benchmarks.longbench.archive import DEFAULT_DATA_DIR, HUB_ARCHIVE, HUB_REPO, Archive, fetch_archive
from restkv.eval.benchmarks.longbench.metrics import bucket_scores, format_buckets, length_bucket, longbench_postprocess
from restkv.eval.benchmarks.longbench.prompts import (
    CATEGORIES,
    NO_CHAT_TASKS,
    TASK_SPECS,
    TASKS,
    TASKS_E,
    TASKS_EN,
    TASKS_ZH,
    TaskSpec,
    expand_tasks,
    split_prompt,
)
from restkv.eval.benchmarks.shared.jsonl import (
    DataFileError,
    Field,
    JsonlSource,
    all_items,
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

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_FIELDS: dict[str, Field] = {
    "input": Field((str,), "a string"),
    "context": Field((str,), "a string"),
    "answers": Field((list,), "a list of strings"),
    "length": Field((int,), "an integer (words, or characters for Chinese)"),
    "all_classes": Field((list, type(None)), "a list of class names or null"),
    "_id": Field((str,), "a non-empty string", nonempty=True),
    "dataset": Field((str,), "a string", required=False),
    "language": Field((str,), "a string", required=False),
}


def _references(record: dict[str, Any], task: str, at: str) -> list[str]:
    """The record's ``answers``, checked to be a non-empty list of strings (``at``: ``file:line``)."""
    answers = record["answers"]
    if not answers or not all_items(answers, (str,)):
        raise DataFileError(f"{at}: LongBench task {task!r}: field 'answers' must be a non-empty list of strings")
    return list(answers)


def _all_classes(record: dict[str, Any], task: str, at: str) -> list[str] | None:
    """The record's ``all_classes``, checked (a list of strings, required by the classification metric)."""
    classes = record["all_classes"]
    if classes is not None and not all_items(classes, (str,)):
        raise DataFileError(f"{at}: LongBench task {task!r}: field 'all_classes' must list strings")
    if TASK_SPECS[task].metric == "classification" and not classes:
        raise DataFileError(
            f"{at}: LongBench task {task!r}: field 'all_classes' must list the classes "
            "(the classification metric needs them)"
        )
    return classes


@dataclass
class LongBenchBenchmark:
    """LongBench (``longbench_e: false``) or LongBench-E tasks from the official jsonl files.

    ``tasks``: task names, or the aliases ``en`` (16 English tasks, the default), ``zh`` (5
    Chinese tasks), ``all``. ``samples``: at most this many samples per task (the first ones, as
    the authors' ``--max_num_examples``); ``None`` runs all. ``max_new_tokens_cap``: lowers every
    task's generation length to at most this (quick CPU checks only; ``None`` keeps the official
    lengths). See the module docstring for ``chat_template`` and the data sources.
    """

    tasks: list[str] = field(default_factory=lambda: ["en"])
    longbench_e: bool = False
    data_dir: str = DEFAULT_DATA_DIR
    hub: bool = True
    chat_template: str = "authors"
    samples: int | None = None
    max_new_tokens_cap: int | None = None
    name: str = "longbench"

    def __post_init__(self) -> None:
        self.tasks = expand_tasks(self.tasks, self.longbench_e)
        check_loader_knobs("LongBench", self.tasks, self.chat_template, self.samples, self.max_new_tokens_cap)

    @property
    def variant(self) -> str:
        return "longbench_e" if self.longbench_e else "longbench"

    def file_name(self, task: str) -> str:
        return f"{task}_e.jsonl" if self.longbench_e else f"{task}.jsonl"

    # ---------------------------------------------------------------- loading

    @property
    def _files(self) -> dict[str, Any]:
        """Where the task files are, as `check_task_files` and `load_task_files` take it."""
        name = "LongBench-E" if self.longbench_e else "LongBench"
        return {"benchmark": name, "dataset": self.variant}

    def check_data(self) -> None:
        """Missing task files the hub cannot supply, refused before any model loads."""
        check_task_files(self.tasks, resolve_path(self.data_dir), self.file_name, hub=self.hub, **self._files)

    def load_samples(self, tokenizer: PreTrainedTokenizerBase | Any) -> list[Sample]:
        wrap_inst = self.chat_template == "authors" and is_llama2(tokenizer)
        archive = Archive() if self.hub else None
        try:
            samples = lambda task, source: self._task_samples(task, source, wrap_inst)  # noqa: E731
            return load_task_files(
                self.tasks, resolve_path(self.data_dir), self.file_name, samples, fallback=archive, **self._files
            )
        finally:
            if archive is not None:
                archive.close()

    def _task_samples(self, task: str, source: JsonlSource, wrap_inst: bool) -> list[Sample]:
        """The first ``samples`` records of one task's file as samples."""
        records = task_records(source, _FIELDS, benchmark="LongBench", task=task, id_field="_id", limit=self.samples)
        return [self._sample(task, record, f"{source.where}:{line}", wrap_inst) for line, record in records]

    def _sample(self, task: str, record: dict[str, Any], at: str, wrap_inst: bool) -> Sample:
        """One record (found at ``at``, ``file:line``) as the sample of the official prompt."""
        spec = TASK_SPECS[task]
        references = _references(record, task, at)
        classes = _all_classes(record, task, at)
        context, question = split_prompt(task, record)
        if wrap_inst:
            context, question = wrap_llama2(context, question)
        mode = self.chat_template
        return Sample(
            id=f"{self.variant}/{task}/{record['_id']}",
            task=task,
            context=context,
            question=question,
            references=references,
            max_new_tokens=cap_new_tokens(spec.max_new_tokens, self.max_new_tokens_cap),
            metric=spec.metric,
            chat_template=mode == "chat" or (mode == "official" and task not in NO_CHAT_TASKS),
            meta=self._meta(record, classes, at),
        )

    def _meta(self, record: dict[str, Any], classes: list[str] | None, at: str) -> dict[str, Any]:
        """A sample's metadata: variant, ``length`` (and its LongBench-E bucket), classes, mode and source."""
        meta: dict[str, Any] = {
            "benchmark": self.variant,
            "length": record["length"],
            "all_classes": classes,
            "chat_template": self.chat_template,
            "source": at,
        }
        for key in ("dataset", "language"):
            if key in record:
                meta[key] = record[key]
        if self.longbench_e:
            meta["length_bucket"] = length_bucket(record["length"])
        return meta

    # ---------------------------------------------------------------- scoring

    def score(self, sample: Sample, prediction: str) -> float:
        cleaned = longbench_postprocess(sample.task, prediction)
        return score_metric(sample.metric, cleaned, sample.references, all_classes=sample.meta.get("all_classes"))

    def report(self, records: list[dict[str, Any]], folder: Path) -> dict[str, Any]:
        """Category averages, English/Chinese averages and, for LongBench-E, the length buckets."""
        by_task: dict[str, list[float]] = {}
        for record in records:
            by_task.setdefault(record["task"], []).append(float(record["score"]))
        task_scores = {task: 100 * statistics.fmean(scores) for task, scores in by_task.items()}
        extra: dict[str, Any] = {}
        categories = {
            name: statistics.fmean(task_scores[t] for t in members if t in task_scores)
            for name, members in CATEGORIES.items()
            if any(t in task_scores for t in members)
        }
        if categories:
            extra["categories"] = categories
        english = [task_scores[t] for t in TASKS_EN if t in task_scores]
        chinese = [task_scores[t] for t in TASKS_ZH if t in task_scores]
        if english and chinese:
            extra["average_en"] = statistics.fmean(english)
            extra["average_zh"] = statistics.fmean(chinese)
        if self.longbench_e:
            extra["length_buckets"] = bucket_scores(records)
            print(format_buckets(extra["length_buckets"]))
        return extra


__all__ = [
    "CATEGORIES",
    "DEFAULT_DATA_DIR",
    "HUB_ARCHIVE",
    "HUB_REPO",
    "NO_CHAT_TASKS",
    "TASKS",
    "TASKS_E",
    "TASKS_EN",
    "TASKS_ZH",
    "TASK_SPECS",
    "LongBenchBenchmark",
    "TaskSpec",
    "expand_tasks",
    "fetch_archive",
    "split_prompt",
]
