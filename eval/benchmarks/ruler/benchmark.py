"""The RULER benchmark the runner instantiates (``configs/bench/ruler.yaml``)."""

from __future__ import annotations

import importlib.metadata
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from restkv.eval.benchmarks.contract.metrics import score as score_metric
from restkv.eval.benchmarks.contract.sample import Sample
from restkv.eval.benchmarks.ruler.files import Found, find_files, read_samples, templated
from restkv.eval.benchmarks.ruler.generator import check_settings, generate
from restkv.eval.benchmarks.ruler.plan import RulerData
from restkv.eval.benchmarks.ruler.tasks import OFFLINE_TASKS, task_config
from restkv.eval.benchmarks.ruler.words import vocabulary
from restkv.eval.benchmarks.shared.haystack import check_haystack

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class RulerBenchmark:
    """RULER tasks x context lengths: generated here, or read from official files (``data_dir``).

    Generated (``data_dir`` unset): ``samples`` prompts per task and length, sized by ``fit``
    (``official``: the official generator's rule; ``exact``: every prompt filled to the budget), keys
    and words from ``words`` (``wonderwords``, the official source, or ``bundled``), essay sentences
    split by ``sentences``. Read (``data_dir`` set): the official generator's files for ``tasks`` at
    ``lengths`` (``null``: every length found), the first ``samples`` records of each (``null``: all).

    ``max_new_tokens`` replaces RULER's per-task generation lengths (the ReST-KV authors: 64);
    ``answer_prefix: false`` leaves RULER's answer prefix out of the prompt (the authors feed the
    file's ``input`` alone); ``chat_template`` (``null``: the model's template for generated samples,
    none for files, whose ``input`` is fed as given). A requested task whose data cannot be had is
    skipped and the reason recorded in ``skipped``. ``metrics.json`` gets the average per length
    (``lengths``, RULER's headline numbers) and where the samples came from (``source``).
    """

    tasks: list[str] = field(default_factory=lambda: list(OFFLINE_TASKS))
    lengths: list[int] | None = field(default_factory=lambda: [4096])
    samples: int | None = 100
    seed: int = 0
    data_dir: str | None = None
    fit: str = "official"
    words: str = "wonderwords"
    sentences: str = "auto"
    english_words: str | None = None
    max_new_tokens: int | None = None
    answer_prefix: bool = True
    chat_template: bool | None = None
    haystack: str | None = None
    squad: str | None = None
    hotpotqa: str | None = None
    hub: bool = True
    name: str = "ruler"
    skipped: dict[str, str] = field(default_factory=dict, init=False)
    source: dict[str, Any] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        for task in self.tasks:
            task_config(task)  # raises with the list of valid tasks
        for knob, values in (("tasks", self.tasks), ("lengths", self.lengths or [])):
            repeated = sorted({str(v) for v in values if list(values).count(v) > 1})
            if repeated:
                raise ValueError(f"bench.{knob}={values} names {', '.join(repeated)} twice; list each once")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(
                f"bench.max_new_tokens={self.max_new_tokens} must be >= 1 or null (RULER's per-task lengths)"
            )
        if self.data_dir is not None:  # reading files: nothing below about generation applies
            check_grid([1] if self.lengths is None else self.lengths, 1 if self.samples is None else self.samples)
            return
        if self.lengths is None or self.samples is None:
            raise ValueError(
                f"bench.lengths={self.lengths} / bench.samples={self.samples}: null (every length, every record) "
                "only applies to files read from bench.data_dir; give the lengths and sample count to generate"
            )
        check_grid(self.lengths, self.samples)
        check_settings(self.fit, self.words, self.sentences)  # also refuses punkt asked for but missing
        check_haystack(self.haystack)

    def load_samples(self, tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
        self.skipped = {}
        samples = self._read() if self.data_dir is not None else self._generate(tokenizer)
        return samples

    def _generate(self, tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
        assert self.lengths is not None and self.samples is not None
        data = RulerData(self.haystack, self.squad, self.hotpotqa, self.hub, self.english_words)
        sentences = check_settings(self.fit, self.words, self.sentences)
        self.source = {"generated": {"fit": self.fit, "words": self.words, "sentences": sentences}}
        if self.words == "wonderwords":  # its lists change between releases (3.0 dropped four nouns)
            self.source["generated"]["wonderwords"] = importlib.metadata.version("wonderwords")
        chat = True if self.chat_template is None else self.chat_template
        samples: list[Sample] = []
        for task in self.tasks:
            for length in self.lengths:
                try:
                    made = generate(
                        task,
                        tokenizer,
                        int(length),
                        self.samples,
                        self.seed,
                        data,
                        fit=self.fit,
                        words=self.words,
                        sentences=sentences,
                    )
                except FileNotFoundError as missing:
                    self.skipped[task] = str(missing)
                    print(f"skipping RULER {task}: {missing}", file=sys.stderr)
                    break
                samples += [self._adjust(s, chat) for s in made]
        self._note_large_pool(samples)
        return samples

    def _note_large_pool(self, samples: list[Sample]) -> None:
        """Say so when a cwe prompt needed more words than the vocabulary holds (the large pool stands in)."""
        pool = len(vocabulary(self.words).common)
        if any(s.task == "cwe" and s.meta["haystack_units"] > pool for s in samples):
            large = self.english_words or "the bundled english_words.txt (RULER's english_words.json not given)"
            self.source["generated"]["cwe_large_pool"] = large
            if self.english_words is None:
                print(
                    f"note: cwe prompts need more than the {pool} {self.words} words; drawing from {large}; "
                    "bench.english_words=<RULER's english_words.json> for the official pool",
                    file=sys.stderr,
                )

    def _adjust(self, sample: Sample, chat: bool) -> Sample:
        sample.chat_template = chat
        if self.max_new_tokens is not None:
            sample.max_new_tokens = self.max_new_tokens
        if not self.answer_prefix:
            sample.answer_prefix = ""
        return sample

    def _read(self) -> list[Sample]:
        assert self.data_dir is not None
        found = find_files(self.data_dir)
        available = found.lengths()
        lengths = sorted(available) if self.lengths is None else [int(n) for n in self.lengths]
        absent = [n for n in lengths if n not in available]
        if absent:
            raise ValueError(
                f"bench.lengths={self.lengths}: {', '.join(map(str, absent))} not in bench.data_dir={self.data_dir!r}, "
                f"which holds {', '.join(map(str, available))} (bench.lengths=null reads every length)"
            )
        print(f"RULER files in {self.data_dir}: {found.summary()}", file=sys.stderr)
        self.source = {"files": self._files_source(found, available, lengths)}
        chat = False if self.chat_template is None else self.chat_template
        by_key = {(f.task, f.length): f for f in found.files}
        samples: list[Sample] = []
        for task in self.tasks:
            for length in lengths:
                task_file = by_key.get((task, length))
                if task_file is None:
                    self.skipped[f"{task}@{length}"] = f"no {task} file for length {length} in {self.data_dir}"
                    continue
                read = read_samples(task_file, self.samples, self.max_new_tokens, self.answer_prefix, chat)
                self.source["files"]["records"][f"{task}@{length}"] = len(read)
                if templated(read[0]):
                    self._check_templated(task_file.path)
                    self.source["files"]["templated"].append(f"{task}@{length}")
                samples += read
        return samples

    def _files_source(self, found: Found, available: dict[int, list[str]], lengths: list[int]) -> dict[str, Any]:
        return {
            "data_dir": str(self.data_dir),
            "found": {str(n): tasks for n, tasks in available.items()},
            "read": {str(n): [t for t in self.tasks if t in available.get(n, [])] for n in lengths},
            "ignored": found.ignored,
            "records": {},  # task@length -> records read (bench.samples caps it)
            "templated": [],  # task@length whose prompts carry a model template already
        }

    def _check_templated(self, path: Path) -> None:
        if self.chat_template:
            raise ValueError(
                f"bench.chat_template=true would wrap {path} in a second chat template: its prompts carry one "
                "already (prepare.py --model_template_type); use bench.chat_template=null or false"
            )

    def score(self, sample: Sample, prediction: str) -> float:
        return score_metric(sample.metric, prediction, sample.references)

    def report(self, records: list[dict[str, Any]], folder: Path) -> dict[str, Any]:
        """Average over tasks at each length (RULER's headline numbers), and the samples' source."""
        return {"lengths": average_per_length(records), "source": self.source}


def check_grid(lengths: list[int], samples: int) -> None:
    """Raise a clear error for an empty or non-positive length list or a sample count below 1."""
    if not lengths or any(int(n) < 1 for n in lengths):
        raise ValueError(f"bench.lengths={lengths} must be a non-empty list of positive token counts")
    if samples < 1:
        raise ValueError(f"bench.samples={samples} must be >= 1")


def average_per_length(records: list[dict[str, Any]]) -> dict[str, float]:
    """Context length -> mean over tasks of the task's mean score, in percent (how RULER reports)."""
    by_length: dict[int, dict[str, list[float]]] = {}
    for record in records:
        length = int(record["meta"]["context_length"])
        by_length.setdefault(length, {}).setdefault(record["task"], []).append(record["score"])
    return {
        str(length): 100 * sum(sum(s) / len(s) for s in tasks.values()) / len(tasks)
        for length, tasks in sorted(by_length.items())
    }
