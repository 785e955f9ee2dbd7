"""``eval/run.py``'s check of one composed job, before any model or data is loaded: every setting, the
combinations that cannot act, the optional packages and data the settings need, the policy's and benchmark's own
range checks, the model's availability and the benchmark's task files. With ``--check``, a job that passes is also
planned as the run plans it (tokenizer, samples, run folder; nothing is written) to say what it would do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def describe_run_job(job: Job) -> str:
    """What the job would do: plan it as the run does (no folder written, no model loaded) and say so."""
    from restkv.eval.harness.runner import RunSettings, plan_run
    from restkv.eval.run import other_overrides

    choices = job.choices
    settings = RunSettings(
        bench=choices["bench"],
        model=choices["model"],
        policy=choices["policy"],
        overrides=other_overrides(job.task_overrides),
        out_dir=Path(str(job.config.out_dir)),
    )
    plan = plan_run(job.config, settings)
    saved = saved_samples(plan.folder, {sample.id for sample in plan.samples})
    return f"ready: {len(plan.samples)} samples ({saved} already saved) in {plan.folder}"


def saved_samples(folder: Path, ids: set[Any]) -> int:
    """How many of ``ids`` the folder's ``predictions.jsonl`` holds (0 when there is none yet)."""
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
    return len(found & ids)
