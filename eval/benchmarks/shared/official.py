"""What the benchmarks read from their official data files (LongBench, InfiniteBench) have in common.

Both load one JSON-lines file per task from a data folder, falling back to the Hugging Face hub,
and fail with every missing file listed; both take the same knobs for a quick run (``samples``,
``max_new_tokens_cap``) and the same ``chat_template`` modes, including the ReST-KV authors'
``"[INST] {prompt} [/INST]"`` wrapper for Llama-2 models (described in
:mod:`restkv.eval.benchmarks.longbench.benchmark`). Each of these lives here once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from restkv.checks import check_choice
from restkv.eval.benchmarks.shared.jsonl import JsonlSource, open_jsonl, resolve_path

__all__ = [
    "CHAT_TEMPLATE_MODES",
    "FileFallback",
    "LocalTaskFiles",
    "cap_new_tokens",
    "check_loader_knobs",
    "is_llama2",
    "load_task_files",
    "wrap_llama2",
]

CHAT_TEMPLATE_MODES: tuple[str, ...] = ("authors", "official", "none", "chat")
"""The ``chat_template`` knob's values (see :mod:`restkv.eval.benchmarks.longbench.benchmark` for what each means)."""

HOW_TO_GET = "run `python scripts/download_data.py {dataset}` (or put the official jsonl files in bench.data_dir)"
"""What a missing-data message tells the user to do, for the download script's dataset name."""

T = TypeVar("T")


def is_llama2(tokenizer: Any) -> bool:
    """Whether the tokenizer's name or path names a Llama-2 model ("llama2" or "llama-2")."""
    name = str(getattr(tokenizer, "name_or_path", "") or "").lower()
    return "llama2" in name or "llama-2" in name


def wrap_llama2(context: str, question: str) -> tuple[str, str]:
    """The authors' Llama-2 wrapper around the whole prompt: ``"[INST] " + context``, ``question + " [/INST]"``."""
    return "[INST] " + context, question + " [/INST]"


def check_loader_knobs(
    benchmark: str, tasks: Sequence[str], chat_template: str, samples: int | None, max_new_tokens_cap: int | None
) -> None:
    """Raise ``ValueError`` naming the knob for an empty task list, an unknown chat-template mode or a cap below 1."""
    if not tasks:
        raise ValueError(f"bench.tasks is empty; name at least one {benchmark} task")
    check_choice("bench", "chat_template", chat_template, CHAT_TEMPLATE_MODES)
    if samples is not None and samples < 1:
        raise ValueError(f"bench.samples={samples} must be >= 1 (or null for all)")
    if max_new_tokens_cap is not None and max_new_tokens_cap < 1:
        raise ValueError(f"bench.max_new_tokens_cap={max_new_tokens_cap} must be >= 1 (or null)")


def cap_new_tokens(max_new_tokens: int, cap: int | None) -> int:
    """``max_new_tokens`` lowered to ``cap`` (``None``: the official length unchanged)."""
    return max_new_tokens if cap is None else min(max_new_tokens, cap)


class FileFallback(Protocol):
    """Where a task file is fetched from when the data folder lacks it (the hub), and why that failed."""

    failure: str
    """Why a file could not be fetched ('' while nothing failed), for the missing-data message."""

    def open(self, file_name: str) -> JsonlSource | None:
        """The records of ``file_name``, or ``None`` when it cannot be had."""
        ...


def check_task_files(
    tasks: Sequence[str], folder: Path, file_name: Callable[[str], str], *, hub: bool, benchmark: str, dataset: str
) -> None:
    """Refuse, before any model or tokenizer loads, task files that are missing where the hub cannot supply them
    (``bench.hub=false``, ``HF_HUB_OFFLINE``, no network): the same message `load_task_files` would give later."""
    from restkv.eval.models.hub import hub_reachable

    missing = [str(folder / file_name(task)) for task in tasks if not (folder / file_name(task)).is_file()]
    if not missing or (hub and hub_reachable()):
        return
    why = "it is off (bench.hub=false)" if not hub else "the Hugging Face hub is not reachable (or HF_HUB_OFFLINE set)"
    raise FileNotFoundError(
        f"{benchmark} data missing: {', '.join(missing)}. The hub was not used: {why}. To get the data, "
        f"{HOW_TO_GET.format(dataset=dataset)}."
    )


def load_task_files(
    tasks: Sequence[str],
    folder: Path,
    file_name: Callable[[str], str],
    build: Callable[[str, JsonlSource], list[T]],
    *,
    fallback: FileFallback | None,
    benchmark: str,
    dataset: str,
) -> list[T]:
    """Every task's samples, built by ``build`` from its file in ``folder`` (else from ``fallback``), in task order.

    Every task is tried before failing, so the ``FileNotFoundError`` lists all the missing files
    at once, says why the fallback did not help and how to get the data: the
    ``scripts/download_data.py`` command for ``dataset``.
    """
    samples: list[T] = []
    missing: list[str] = []
    for task in tasks:
        local = folder / file_name(task)
        if local.is_file():
            source: JsonlSource | None = open_jsonl(local)
        else:
            source = fallback.open(file_name(task)) if fallback is not None else None
        if source is None:
            missing.append(str(local))
            continue
        samples += build(task, source)
    if missing:
        failure = fallback.failure if fallback is not None else ""
        hub_note = f" The hub was not used: {failure}." if failure else ""
        how_to_get = HOW_TO_GET.format(dataset=dataset)
        raise FileNotFoundError(
            f"{benchmark} data missing: {', '.join(missing)}.{hub_note} To get the data, {how_to_get}."
        )
    return samples


class LocalTaskFiles:
    """What a benchmark whose tasks are ``<file_prefix><task>.jsonl`` files in ``data_dir`` (fetched beforehand by
    ``scripts/download_data.py <dataset>``, no hub fallback) shares: its checks, its missing-data refusal and its
    loading; a subclass names its tasks and builds one task's samples (``task_samples``)."""

    task_names: ClassVar[Sequence[str]]
    benchmark: ClassVar[str]
    dataset: ClassVar[str]
    file_prefix: ClassVar[str] = ""
    tasks: list[str]
    data_dir: str

    def check_knobs(self, *knobs: str) -> None:
        """Refuse unknown or no tasks, and ``knobs`` that are neither null nor an integer >= 1, by name."""
        unknown = [task for task in self.tasks if task not in self.task_names]
        if unknown or not self.tasks:
            raise ValueError(f"bench.tasks={self.tasks}: allowed tasks are {', '.join(self.task_names)}")
        for knob in knobs:
            value = getattr(self, knob)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"bench.{knob}={value!r} must be an integer >= 1 (or null)")

    def file_name(self, task: str) -> str:
        return f"{self.file_prefix}{task}.jsonl"

    def check_data(self) -> None:
        """Missing task files, refused before any model loads (with the download command)."""
        folder = resolve_path(self.data_dir)
        check_task_files(self.tasks, folder, self.file_name, hub=False, benchmark=self.benchmark, dataset=self.dataset)

    def load_samples(self, tokenizer: Any) -> list[Any]:
        folder = resolve_path(self.data_dir)
        return load_task_files(
            self.tasks,
            folder,
            self.file_name,
            self.task_samples,
            fallback=None,
            benchmark=self.benchmark,
            dataset=self.dataset,
        )

    def task_samples(self, task: str, source: JsonlSource) -> list[Any]:
        raise NotImplementedError(f"{type(self).__name__} does not build samples (task_samples)")
