"""``eval/run.py``'s check of one composed job, before any model or data is loaded: every setting, the
combinations that cannot act, the optional packages and data the settings need, the policy's and benchmark's own
range checks, the model's availability and the benchmark's task files. With ``--check``, a job that passes is
described by its run folder and the samples already saved there.
"""

from __future__ import annotations

from pathlib import Path

from restkv.eval.harness.jobs import Job


def check_run_job(job: Job) -> None:
    """Refuse a job of ``eval/run.py`` that could not run (a user's error, one line)."""
    from hydra.errors import HydraException
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from restkv.eval.harness.needs import check_needs
    from restkv.eval.harness.preflight import UsageError
    from restkv.eval.harness.validate import check_combinations, check_node, check_run_keys
    from restkv.eval.models.spec import check_model, model_spec

    cfg = job.config
    values = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(values, dict)
    check_run_keys(values)
    for group in ("policy", "bench"):  # the evaluation node's class imports the model stack: checked by the run
        check_node(values[group], group)
    check_combinations(values)
    check_needs(values, job.choices.get("hydra/launcher"))
    try:
        instantiate(cfg.policy, _convert_="all")  # the policy's own range checks (its __post_init__)
        benchmark = instantiate(cfg.bench, _convert_="all")
    except HydraException as error:  # InstantiationException: the class's own message is its cause's
        cause = error.__cause__
        if isinstance(cause, ValueError | TypeError | NotImplementedError | RuntimeError | ImportError | OSError):
            raise UsageError(str(cause)) from None
        raise
    check_model(model_spec(cfg.model))  # a hub model neither cached nor downloadable: refused now, not after retries
    if hasattr(benchmark, "check_data"):
        benchmark.check_data()  # task files missing where the hub cannot supply them


def folder_of_job(job: Job) -> Path:
    """The run folder the job writes (as the runner names it)."""
    from restkv.budget import Budget
    from restkv.eval.harness.naming import other_overrides
    from restkv.eval.harness.run_folder import run_folder

    choices, cfg = job.choices, job.config
    return run_folder(
        Path(str(cfg.out_dir)),
        choices["bench"],
        choices["model"],
        choices["policy"],
        str(Budget(cfg.budget)),
        other_overrides(job.task_overrides),
    )


def describe_run_job(job: Job) -> str:
    """What the job would do (``--check``): its run folder and how many samples it already holds."""
    folder = folder_of_job(job)
    return f"ready: would write {folder} ({saved_samples(folder)} samples already saved there)"


def stopped_sweep(jobs: list[Job]) -> str:
    """The line a sweep stopped by Ctrl-C ends with: how many samples its run folders hold, and how to go on."""
    folders = list(dict.fromkeys(folder_of_job(job) for job in jobs))
    saved = sum(saved_samples(folder) for folder in folders)
    roots = sorted({str(job.config.out_dir) for job in jobs})
    return (
        f"stopped (Ctrl-C): the sweep's {len(folders)} run folders (under {', '.join(roots)}) hold {saved} saved "
        "samples; run the same command again to resume"
    )


def saved_samples(folder: Path) -> int:
    """How many samples the folder's ``predictions.jsonl`` holds (0 when there is none yet)."""
    import json

    path = folder / "predictions.jsonl"
    if not path.is_file():
        return 0
    found = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            found.add(json.loads(line)["id"])
        except (ValueError, KeyError, TypeError):
            continue
    return len(found)
