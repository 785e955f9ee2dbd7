"""``python -m restkv.eval.latency``'s check before the work: the shared one (`restkv.eval.harness.entry`), with
the latency preset's own settings as the job's check: an unknown key is refused in one line with the closest
names, a preset asking for a device or an attention backend this machine lacks too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from restkv.eval.harness.entry import EntryPoint, check_before_work
from restkv.eval.models.paths import bundled

COMMAND = "python -m restkv.eval.latency"


def settings_of(job: Any) -> Any:
    """The job's `Settings` (its own checks: names, values, policies)."""
    from restkv.eval.latency.settings import Settings

    return Settings.from_config(job.config.latency, job.choices["latency"])


def check_latency_job(job: Any) -> None:
    """The preset's settings, its device and its attention backend."""
    from restkv.eval.models.spec import check_backend_runs

    settings = settings_of(job)
    device = settings.resolved_device()
    check_backend_runs(settings.attn_implementation, device.type, "latency.attn_implementation", "latency.device=cuda")


def describe_latency_job(job: Any) -> str:
    settings = settings_of(job)
    return f"ready: latency={job.choices['latency']} ({settings.mode} mode) would write {settings.json_path()}"


def entry_point() -> EntryPoint:
    import restkv.eval.latency.cli  # noqa: F401  (stores the latency_main config the command composes)

    return EntryPoint(
        command=COMMAND,
        configs=Path(bundled("configs")),
        config_name="latency_main",
        check_job=check_latency_job,
        describe_job=describe_latency_job,
    )


def check_before_hydra(argv: list[str]) -> list[str]:
    """Refuse a bad command line in one line (exit 2) before any measurement; ``argv`` in Hydra's order."""
    return check_before_work(entry_point(), argv)[0]
