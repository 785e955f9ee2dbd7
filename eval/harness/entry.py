"""The one check before the work, shared by every command-line entry point that takes Hydra overrides
(``eval/run.py``, ``python -m restkv.eval.latency``).

It composes every job of the command line exactly as the run will (`restkv.eval.harness.jobs`: the same config
tree, typed nodes and resolvers, a sweep's every combination), then hands each composed job to the entry point's
own check (its settings, the optional packages and data they need, `restkv.eval.harness.needs`). A refusal is one
line and exit code 2; a job of a sweep is named. ``--check`` stops there and says what each job would do, so a
command can be tried without running anything. What it returns is the command line in Hydra's order (its options
first), so ``-m`` may stand anywhere.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from restkv.eval.harness import errors
from restkv.eval.harness.preflight import CHECK_FLAG, UsageError, hydra_order, is_multirun, split_argv

HELP_FLAGS = {"-h", "--help", "--hydra-help", "--version", "--info"}


@dataclass(frozen=True)
class EntryPoint:
    """What the shared check needs to know of one command."""

    command: str
    """As users type it, for messages (``eval/run.py``)."""
    configs: Path
    config_name: str
    check_job: Callable[..., None]
    """One composed job (`restkv.eval.harness.jobs.Job`): its settings and their needs; raises a user's error."""
    describe_job: Callable[..., str]
    """What ``--check`` prints for a job that passed (where it would write, how much it would run)."""
    check_words: Callable[[list[str], Path], object] | None = None
    """Torch-free checks of the words, before anything heavy is imported (``eval/run.py``'s)."""


def check_before_work(entry: EntryPoint, argv: list[str]) -> tuple[list[str], list[Any]]:
    """Check ``argv`` for ``entry`` (every job), exit 2 with one line on a refusal, exit 0 after ``--check``;
    return ``argv`` in Hydra's order and its jobs (`restkv.eval.harness.jobs.Job`; none for ``--help``)."""
    with errors.one_line_errors():
        flags, words = split_argv(argv, entry.command)
        if HELP_FLAGS & {flag.split("=", 1)[0] for flag in flags}:
            return hydra_order(argv), []
        if entry.check_words is not None:
            entry.check_words(argv, entry.configs)
        else:
            parse_words(words)
        if CHECK_FLAG in flags:
            sys.exit(report_jobs(entry, words, is_multirun(argv)))
        jobs = check_jobs(entry, words, is_multirun(argv))
    return hydra_order(argv), jobs


def parse_words(words: list[str]) -> None:
    """Hydra's override grammar, as one line."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        OverridesParser.create().parse_overrides(words)
    except OverrideParseException as error:
        raise UsageError(str(error).splitlines()[0] + " (settings are written key=value)") from None


def report_jobs(entry: EntryPoint, words: list[str], multirun: bool) -> int:
    """``--check``: one line per job, ready or refused (every job of a sweep, not only up to the first refusal);
    the exit code: 0 when every job is ready, 2 otherwise. A command line that composes no job is refused as
    without ``--check``."""
    from restkv.eval.harness.jobs import expand

    jobs = expand(entry.configs, entry.config_name, words, multirun)
    if len(jobs) == 1:  # refused as without --check: one line, exit 2
        entry.check_job(jobs[0])
        print(entry.describe_job(jobs[0]))
        return 0
    refused = 0
    for index, job in enumerate(jobs):
        prefix = f"{job.label(index, len(jobs))}: "
        try:
            entry.check_job(job)
            print(f"{prefix}{entry.describe_job(job)}", flush=True)
        except Exception as error:
            message = errors.user_message(error)
            if message is None:
                raise
            refused += 1
            print(f"{prefix}refused: {message}", flush=True)
    print(
        f"checked {len(jobs)} jobs of {entry.command}: {len(jobs) - refused} ready, {refused} refused; nothing was "
        f"run (drop {CHECK_FLAG} to run)"
    )
    return 2 if refused else 0


def check_jobs(entry: EntryPoint, words: list[str], multirun: bool) -> list[Any]:
    """Compose and check every job; a refused job of a sweep is named with the values that make it that job."""
    from restkv.eval.harness.jobs import expand

    jobs = expand(entry.configs, entry.config_name, words, multirun)
    for index, job in enumerate(jobs):
        try:
            entry.check_job(job)
        except Exception as error:
            message = errors.user_message(error)
            if message is None or len(jobs) == 1:
                raise
            raise UsageError(f"{job.label(index, len(jobs))}: {message}") from None
    return jobs
