"""Run one benchmark with one model, policy and budget, as composed by Hydra.

    python eval/run.py policy=restkv bench=ruler budget=128
    python eval/run.py -m policy=snapkv,restkv budget=64,128,256      # a sweep
    python eval/run.py -m hydra/launcher=joblib hydra.launcher.n_jobs=4 policy=snapkv,restkv budget=64,128
    python eval/run.py --check -m policy=snapkv,restkv budget=64,128   # check every job, run nothing

Writes ``predictions.jsonl`` (one line per sample, as it finishes), ``metrics.json`` and the
resolved ``config.yaml`` into the run folder, prints a score table and the folder's path.
Rerunning the same command resumes: finished samples are skipped. Before any work, a tracker
(``logger=wandb``) is checked and, under the joblib launcher, the worker claims its GPU
(``restkv.eval.harness.gpu_slots``); once the run has finished, the tracker logs it (``restkv.eval.harness.tracking``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, "") and sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]  # executed as a script: its folder's packages are restkv.eval's, never top-level names

from restkv.eval.harness.interrupts import quiet_interrupts

if __name__ == "__main__":
    quiet_interrupts()  # first: Ctrl-C while the imports below run is one line too

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from restkv.eval.harness import errors, preflight
from restkv.eval.harness.entry import EntryPoint, check_before_work
from restkv.eval.harness.naming import NAMING_KEYS, NOT_NAMING_PREFIXES, other_overrides

__all__ = ["CONFIG_DIR", "NAMING_KEYS", "NOT_NAMING_PREFIXES", "main", "other_overrides", "run_settings"]
from restkv.eval.models.paths import bundled

if TYPE_CHECKING:  # the run's machinery is imported once the command line has been checked
    from restkv.eval.harness.runner import RunSettings

CONFIG_DIR = str(bundled("configs"))
"""The Hydra config tree (``configs/``)."""


def __getattr__(name: str) -> str:
    """``CONFIGS``: the config tree, for composing configs in code (``initialize_config_dir(config_dir=CONFIGS)``);
    reading it registers the typed nodes the configs extend (which imports torch), as a run does."""
    if name == "CONFIGS":
        import restkv.eval.harness.config_tree  # noqa: F401

        return CONFIG_DIR
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run_settings(cfg: DictConfig, hydra_cfg: DictConfig) -> RunSettings:
    """What names this job's run folder, from its config and its Hydra config (``HydraConfig.get()``)."""
    from restkv.eval.harness.runner import RunSettings

    choices = hydra_cfg.runtime.choices
    return RunSettings(
        bench=choices["bench"],
        model=choices["model"],
        policy=choices["policy"],
        overrides=other_overrides(list(hydra_cfg.overrides.task)),
        out_dir=Path(cfg.out_dir),
    )


def register_user_errors() -> None:
    """What a bad setting, missing data or a busy or foreign run folder raise: shown as one message, no traceback
    (``HYDRA_FULL_ERROR=1`` shows it); file-system errors too (`restkv.eval.harness.errors`)."""
    from restkv.eval.harness import gpu_slots, tracking
    from restkv.eval.harness.identity import IdentityMismatch
    from restkv.eval.harness.run_folder import RunFolderError
    from restkv.eval.harness.runner import EmptyRun, SkippedWork

    errors.register(
        IdentityMismatch,
        RunFolderError,
        SkippedWork,
        EmptyRun,
        gpu_slots.GpuSlotError,
        tracking.TrackingUnavailable,
        tracking.TrackingFailed,
    )


@hydra.main(version_base=None, config_path=CONFIG_DIR, config_name="config")
def main(cfg: DictConfig) -> float:
    hydra_cfg = HydraConfig.get()
    worker = "joblib" in str(hydra_cfg.launcher.get("_target_", ""))  # its launching process says what is saved
    with errors.one_line_errors(announce_interrupts=not worker):  # the imports too: a Ctrl-C while they run
        from restkv.eval.harness import gpu_slots, tracking
        from restkv.eval.harness.runner import run_benchmark

        register_user_errors()
        tracker = tracking.tracker_for(cfg)  # first: a missing wandb stops the run before any work
        gpu_slots.claim_for_job(hydra_cfg, str(cfg.device))
        summary = run_benchmark(cfg, run_settings(cfg, hydra_cfg), on_finished=tracker)
        if str(hydra_cfg.mode) == "RunMode.MULTIRUN":  # a line of the sweep's closing table
            from restkv.eval.harness.sweep_summary import write_job_summary

            write_job_summary(Path(hydra_cfg.runtime.output_dir), summary)
    average = summary["average"]
    return float("nan") if average is None else float(average)


def entry_point() -> EntryPoint:
    """``eval/run.py`` for the shared check before the work (`restkv.eval.harness.entry`)."""
    from restkv.eval.harness.run_check import check_run_job, describe_run_job

    return EntryPoint(
        command="eval/run.py",
        configs=Path(CONFIG_DIR),
        config_name="config",
        check_job=check_run_job,
        describe_job=describe_run_job,
        check_words=preflight.check_command_line,
    )


def check_before_hydra(argv: list[str]) -> tuple[list[str], list[Any]]:
    """Refuse a bad command line before Hydra or any heavy import runs: its words first (no torch), then every job
    it composes (the policies' typed knobs import torch; no model, no data). Returns it in Hydra's order, and its
    jobs."""
    return check_before_work(entry_point(), argv)


def run_command(argv: list[str]) -> None:
    """The command: check, then run every job; a sweep stopped by Ctrl-C in its launching process (a joblib
    sweep's) ends with one line saying how many samples its run folders hold."""
    argv, jobs = check_before_hydra(argv)
    sys.argv[1:] = argv
    import restkv.eval.harness.config_tree  # noqa: F401  (the typed nodes and resolvers Hydra composes with)

    # the process that tracks a joblib sweep's semaphores warns about them when the sweep is stopped: not the user's
    os.environ["PYTHONWARNINGS"] = ",".join(
        filter(None, [os.environ.get("PYTHONWARNINGS"), "ignore::UserWarning:multiprocessing.resource_tracker"])
    )
    try:
        main()
    except KeyboardInterrupt:
        if len(jobs) < 2:
            raise
        from restkv.eval.harness.run_check import stopped_sweep

        raise KeyboardInterrupt(stopped_sweep(jobs)) from None


if __name__ == "__main__":
    run_command(sys.argv[1:])
