"""RULER's 13 tasks: each name bound to its family's settings (RULER's ``synthetic.yaml``)."""

from __future__ import annotations

from restkv.eval.benchmarks.ruler.common_words import CommonWords
from restkv.eval.benchmarks.ruler.freq_words import FreqWords
from restkv.eval.benchmarks.ruler.niah import Niah
from restkv.eval.benchmarks.ruler.qa import QA
from restkv.eval.benchmarks.ruler.templates import FAMILIES
from restkv.eval.benchmarks.ruler.variable_tracking import VariableTracking

TaskConfig = Niah | VariableTracking | CommonWords | FreqWords | QA

TASK_CONFIGS: dict[str, TaskConfig] = {
    "niah_single_1": Niah("noise", "words", "numbers"),
    "niah_single_2": Niah("essay", "words", "numbers"),
    "niah_single_3": Niah("essay", "words", "uuids"),
    "niah_multikey_1": Niah("essay", "words", "numbers", num_needle_k=4),
    "niah_multikey_2": Niah("needle", "words", "numbers"),
    "niah_multikey_3": Niah("needle", "uuids", "uuids"),
    "niah_multivalue": Niah("essay", "words", "numbers", num_needle_v=4),
    "niah_multiquery": Niah("essay", "words", "numbers", num_needle_q=4),
    "vt": VariableTracking(num_chains=1, num_hops=4),
    "cwe": CommonWords(freq_cw=30, freq_ucw=3, num_cw=10),
    "fwe": FreqWords(alpha=2.0),
    "qa_1": QA("squad"),
    "qa_2": QA("hotpotqa"),
}

TASKS: tuple[str, ...] = tuple(TASK_CONFIGS)
OFFLINE_TASKS: tuple[str, ...] = tuple(t for t in TASKS if t not in ("qa_1", "qa_2"))
"""The 11 tasks that need no download: the default, and the set the ReST-KV authors ran."""


def task_config(task: str) -> TaskConfig:
    """The settings of ``task``; an unknown name raises with the list of valid tasks."""
    if task not in TASK_CONFIGS:
        raise ValueError(f"unknown RULER task {task!r}; valid tasks: {', '.join(TASKS)}")
    return TASK_CONFIGS[task]


def max_new_tokens(task: str) -> int:
    """RULER's generation length for ``task``."""
    return FAMILIES[task_config(task).family].max_new_tokens
