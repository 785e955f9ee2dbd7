"""Every job a command line asks for, composed as Hydra will compose it: one for a run, one per combination of a
sweep (``-m`` or a preset's ``hydra.mode: MULTIRUN``, its ``hydra.sweeper.params`` included), so that the check
before the work covers each job, not the first one only.

Composition goes through `restkv.eval.harness.config_tree` (imported here), which registers the typed nodes and
resolvers the config files use: the check composes exactly what the run composes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from restkv.eval.harness.validate import suggest


class CompositionError(ValueError):
    """The command line composes no config: an unknown key or config, a value Hydra cannot merge."""


@dataclass
class Job:
    """One job of a command line: its overrides, its composed config (no ``hydra`` node) and Hydra's view of it."""

    overrides: list[str]
    config: Any
    choices: dict[str, str] = field(default_factory=dict)
    """Hydra's config group choices (``policy``, ``hydra/launcher``, ...)."""
    task_overrides: list[str] = field(default_factory=list)
    """The overrides Hydra would hand the job (``hydra.overrides.task``)."""
    multirun: bool = False
    swept: list[str] = field(default_factory=list)
    """The overrides that make this job of a sweep differ from the others (``policy=snapkv``)."""

    def label(self, index: int, total: int) -> str:
        """``job 2 of 4 (policy=snapkv budget=64)``: how a refusal names the job of a sweep."""
        return f"job {index + 1} of {total}" + (f" ({' '.join(self.swept)})" if self.swept else "")


def _is_hydra_key(key: str) -> bool:
    return key.split(".")[0].split("/")[0] == "hydra" and key not in ("hydra.searchpath", "hydra/launcher")


def compose_job(configs: Path, config_name: str, overrides: list[str]) -> Job:
    """Compose one job (``overrides`` without Hydra's runtime settings) as its run will."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    import restkv.eval.harness.config_tree  # noqa: F401  (the typed nodes and resolvers the configs use)

    try:
        with initialize_config_dir(config_dir=str(configs), version_base=None):
            cfg = compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as error:
        raise CompositionError(composition_message(error, overrides, configs, config_name)) from None
    hydra = cfg.hydra
    choices = {str(k): str(v) for k, v in hydra.runtime.choices.items() if v is not None}
    multirun = str(OmegaConf.select(hydra, "mode", default="")).endswith("MULTIRUN")
    task = [str(o) for o in hydra.overrides.task]
    with open_dict(cfg):
        del cfg["hydra"]
    return Job(overrides, cfg, choices, task, multirun)


def sweep_params(configs: Path, config_name: str, words: list[str]) -> tuple[list[str], bool]:
    """A preset's ``hydra.sweeper.params`` as overrides, and whether its config asks for a sweep (``hydra.mode``)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    import restkv.eval.harness.config_tree  # noqa: F401  (the typed nodes and resolvers the configs use)

    first = first_combination(words)
    try:
        with initialize_config_dir(config_dir=str(configs), version_base=None):
            hydra = compose(config_name=config_name, overrides=first, return_hydra_config=True).hydra
    except (HydraException, OmegaConfBaseException) as error:
        raise CompositionError(composition_message(error, first, configs, config_name)) from None
    params = OmegaConf.select(hydra, "sweeper.params", default=None) or {}
    multirun = str(OmegaConf.select(hydra, "mode", default="")).endswith("MULTIRUN")
    return [f"{key}={value}" for key, value in params.items()], multirun


def first_combination(words: list[str]) -> list[str]:
    """The overrides of a sweep's first job (``budget=64,128`` -> ``budget=64``), Hydra's runtime settings left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    single = []
    for word, override in zip(words, OverridesParser.create().parse_overrides(words), strict=True):
        if _is_hydra_key(override.key_or_group):
            continue
        if override.is_sweep_override():
            prefix = word[: len(word) - len(word.lstrip("+~"))]
            word = f"{prefix}{override.key_or_group}={next(iter(override.sweep_string_iterator()))}"
        single.append(word)
    return single


def expand(configs: Path, config_name: str, words: list[str], multirun: bool) -> list[Job]:
    """Every job of the command line (``words``: its overrides; ``multirun``: ``-m`` given), composed."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    kept = [w for w, o in zip(words, parser.parse_overrides(words), strict=True) if not _is_hydra_key(o.key_or_group)]
    params, preset_sweeps = sweep_params(configs, config_name, kept)
    if not (multirun or preset_sweeps):
        sweeps = [w for w, o in zip(kept, parser.parse_overrides(kept), strict=True) if o.is_sweep_override()]
        if sweeps:
            raise CompositionError(f"{sweeps[0]} gives several values: add -m to run each (a sweep)")
        return [compose_job(configs, config_name, kept)]
    try:
        (combinations,) = BasicSweeper.split_arguments(parser.parse_overrides([*params, *kept]), None)
    except HydraException as error:
        raise CompositionError(str(error).splitlines()[0]) from None
    swept = {o.get_key_element() for o in parser.parse_overrides([*params, *kept]) if o.is_sweep_override()}
    jobs = []
    for index, overrides in enumerate(combinations):
        varied = [o for o in overrides if o.split("=", 1)[0] in swept]
        try:
            job = compose_job(configs, config_name, overrides)
        except CompositionError as error:
            if len(combinations) == 1:
                raise
            label = Job(overrides, None, swept=varied).label(index, len(combinations))
            raise CompositionError(f"{label}: {error}") from None
        job.multirun, job.swept = True, varied
        jobs.append(job)
    return jobs


def suggest_nested(name: str, root: Any) -> str:
    """``"; did you mean latency.budgets?"``: a top-level key that is close to a setting one level down."""
    from omegaconf import OmegaConf

    nested = {
        str(sub): f"{key}.{sub}"
        for key in root
        if OmegaConf.is_dict(root[key])
        for sub in root[key]
        if not str(sub).startswith("_")
    }
    close = suggest(name, nested)
    return f"; did you mean {nested[close.removeprefix('; did you mean ').rstrip('?')]}?" if close else ""


def composition_message(error: Exception, overrides: list[str], configs: Path, config_name: str = "config") -> str:
    """Hydra's composition error as one line; an unknown key or config gets the closest valid names."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    parts, cause = [], error
    while cause is not None:
        parts.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    text = "\n".join(parts)
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("To append")]
    if text.startswith("Error merging override "):
        override = lines[0].removeprefix("Error merging override ")
        reasons = [line for line in lines[1:] if "$VALUE" not in line]
        return f"{override} is not allowed: {reasons[0] if reasons else 'Hydra cannot merge it'}"
    if text.startswith("Could not override '") and " not in " in text:
        key = text.split("'", 2)[1]
        parent, _, name = key.rpartition(".")
        base = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != key]
        with initialize_config_dir(config_dir=str(configs), version_base=None):
            root = compose(config_name=config_name, overrides=base)
        node = OmegaConf.select(root, parent) if parent else root
        if node is not None and OmegaConf.is_dict(node):
            settings = sorted(str(k) for k in node if not str(k).startswith("_"))
            where = f"a setting of {parent}" if parent else "a setting"
            close = suggest(name, settings) or (suggest_nested(name, node) if not parent else "")
            return f"{key} is not {where}{close} (its settings: {', '.join(settings)})"
    if (text.startswith("In '") and "Could not find '" in text) or text.startswith("Could not find '"):
        missing = text.split("Could not find '", 1)[1].split("'", 1)[0]
        group, _, name = missing.rpartition("/")
        options = [
            line.removeprefix("\t").strip() for line in text.split("Available options in", 1)[-1].splitlines()[1:]
        ]
        options = [o for o in options if o and " " not in o]
        if group and options:
            return f"{group}={name} is not a {group} config{suggest(name, options)} ({group} has: {', '.join(options)})"
    kept = [line for line in lines if not line.startswith(("full_key:", "object_type=", "See "))]
    return "; ".join(dict.fromkeys(kept))
