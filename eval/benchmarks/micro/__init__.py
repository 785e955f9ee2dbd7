"""The micro model's own benchmarks: `benchmark` is the cued RULER-style suite (``bench=micro``), `niah` the
needle grid with the suite's needle (``bench=niah_micro``). Their answers are scored by RULER's metrics."""

from restkv.eval.benchmarks.micro.benchmark import (
    PASSKEY_ANSWER_PREFIX,
    PASSKEY_NEEDLE,
    PASSKEY_PREAMBLE,
    PASSKEY_QUESTION,
    TASK_CONFIGS,
    TASKS,
    VT_HOPS,
    MicroBenchmark,
    generate,
    max_new_tokens,
    passkey_sample,
    sample,
    target_text,
    trained_answer,
)

__all__ = [
    "PASSKEY_ANSWER_PREFIX",
    "PASSKEY_NEEDLE",
    "PASSKEY_PREAMBLE",
    "PASSKEY_QUESTION",
    "TASKS",
    "TASK_CONFIGS",
    "VT_HOPS",
    "MicroBenchmark",
    "generate",
    "max_new_tokens",
    "passkey_sample",
    "sample",
    "target_text",
    "trained_answer",
]
