"""The command line of ``eval/run.py`` checked before any heavy import: a mistyped key, an unknown config, a bad
top-level value or an option where an override belongs is refused in about a second, with the closest valid name.

Only what can be checked without torch is checked here (Hydra's override grammar, the config tree's files, the
top-level keys' values); the settings of the chosen policy, benchmark and model are checked once the config is
composed (`check_composition`), still before any model or data is loaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from restkv.eval.harness.validate import RUN_KEY_CHECKS, suggest

HYDRA_FLAGS = {
    "-m", "--multirun", "-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "--info", "--resolve", "-p",
    "--package", "-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir", "-sc",
    "--shell-completion", "--experimental-rerun",
}  # fmt: skip
"""Hydra's own options (``-m`` for a sweep, ``--cfg job`` to print the config, ...): left to Hydra."""
FLAGS_WITH_VALUE = {"-c", "--cfg", "--info", "-p", "--package", "-cn", "--config-name", "-cp", "--config-path",
                    "-cd", "--config-dir", "-sc", "--shell-completion", "--experimental-rerun"}  # fmt: skip


class UsageError(ValueError):
    """A command line that cannot be what the user meant; the message says what to type instead."""


def overrides_of(argv: list[str]) -> list[str]:
    """The ``key=value`` words of ``argv``; an option that is not Hydra's is refused with the override to use."""
    words, skip = [], False
    for word in argv:
        if skip:
            skip = False
            continue
        name = word.split("=", 1)[0]
        if name in HYDRA_FLAGS:
            skip = name in FLAGS_WITH_VALUE and "=" not in word
            continue
        if word.startswith("-") and not word.startswith("~"):
            key = word.lstrip("-")
            hint = f"{key}" if "=" in key else f"{key}=<value>"
            raise UsageError(
                f"{word!r} is not an option of eval/run.py: settings are key=value overrides (write {hint}); "
                "Hydra's options: -m (a sweep), --cfg job (print the config), --help"
            )
        words.append(word)
    return words


def group_options(roots: list[Path], group: str) -> list[str]:
    """The configs a group can choose (``<root>/<group>/**.yaml`` of every config root, as ``name`` or ``sub/name``)."""
    found = {str(p.relative_to(root / group).with_suffix("")) for root in roots for p in (root / group).rglob("*.yaml")}
    return sorted(found)


def config_roots(configs: Path, argv: list[str], overrides: list[Any]) -> list[Path] | None:
    """The folders Hydra reads configs from: ours, ``--config-dir`` and ``hydra.searchpath``'s ``file://`` entries;
    None when a search path is not a folder here (a ``pkg://`` one): then group choices are left to Hydra."""
    roots = [configs]
    for flag in ("-cd", "--config-dir"):
        for index, word in enumerate(argv):
            if word == flag and index + 1 < len(argv):
                roots.append(Path(argv[index + 1]))
            elif word.startswith(f"{flag}="):
                roots.append(Path(word.split("=", 1)[1]))
    for override in overrides:
        if override.key_or_group == "hydra.searchpath":
            for entry in override.value() or []:
                if not str(entry).startswith("file://"):
                    return None
                roots.append(Path(str(entry).removeprefix("file://")))
    return roots


def top_level(configs: Path) -> tuple[set[str], set[str]]:
    """(config groups chosen in ``configs/config.yaml``'s defaults, its plain keys)."""
    root = yaml.safe_load((configs / "config.yaml").read_text(encoding="utf-8"))
    groups = set()
    for entry in root.get("defaults", []):
        if isinstance(entry, dict):
            name = next(iter(entry)).split("@")[0].removeprefix("override ")
            if "/" not in name:
                groups.add(name)
    return groups, {key for key in root if key not in ("defaults", "hydra")}


def _values(override: Any) -> Iterator[Any]:
    """Every value an override gives (each element of a sweep)."""
    if override.is_sweep_override():
        yield from override.sweep_iterator()
    else:
        yield override.value()


def check_command_line(argv: list[str], configs: Path) -> list[str]:
    """Refuse what the command line gets wrong that needs no model, no data and no torch; return its overrides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    words = overrides_of(argv)
    try:
        overrides = OverridesParser.create().parse_overrides(words)
    except OverrideParseException as error:
        raise UsageError(str(error).splitlines()[0] + " (settings are written key=value)") from None
    groups, keys = top_level(configs)
    known = groups | keys | {"hydra"}
    roots = config_roots(configs, argv, overrides)
    for override in overrides:
        key = override.key_or_group
        head = key.split(".")[0].split("/")[0]
        if key == "hydra.launcher.n_jobs":
            for value in _values(override):
                check_n_jobs(value)
        if head == "hydra" or override.is_delete():
            continue
        if head not in known:
            raise UsageError(
                f"{key} is not a setting of eval/run.py{suggest(head, known)} (settings: {', '.join(sorted(known))})"
            )
        if key in groups and roots is not None:
            options = group_options(roots, key)
            for value in _values(override):
                if value is not None and str(value) not in options:
                    raise UsageError(
                        f"{key}={value} is not a {key} config{suggest(value, options)} (configs/{key} has: "
                        f"{', '.join(options)})"
                    )
        elif key in RUN_KEY_CHECKS:
            for value in _values(override):
                if not (isinstance(value, str) and "${" in value):  # an interpolation: checked once composed
                    RUN_KEY_CHECKS[key](value)
    return words


def check_n_jobs(value: Any) -> None:
    """The joblib launcher's ``n_jobs`` (0 or a word would fail inside joblib with a traceback)."""
    from restkv.eval.harness.gpu_slots import GpuSlotError, parallel_workers

    try:
        parallel_workers(value)
    except GpuSlotError as error:
        raise UsageError(str(error)) from None


def first_combination(words: list[str]) -> list[str]:
    """The overrides of a sweep's first job (``budget=64,128`` -> ``budget=64``), Hydra's own left out: what is
    composed to check the settings of a sweep before it launches (each job checks its own again)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    single = []
    for word, override in zip(words, OverridesParser.create().parse_overrides(words), strict=True):
        key = override.key_or_group
        if key.split(".")[0].split("/")[0] == "hydra" and key != "hydra.searchpath":
            continue
        if override.is_sweep_override():
            prefix = word[: len(word) - len(word.lstrip("+~"))]
            word = f"{prefix}{key}={next(iter(override.sweep_string_iterator()))}"
        single.append(word)
    return single


def check_composition(words: list[str], configs: Path) -> None:
    """Compose the config the command line asks for (a sweep's first job) and check every setting of it: an
    unknown or mistyped policy, benchmark or model key, a value of the wrong type or out of range. Imports torch
    (the policies' typed knobs), not the model stack."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    import restkv.eval.harness.config_tree  # noqa: F401  (registers the typed nodes the configs extend)
    from restkv.eval.harness.validate import check_node, check_run_keys
    from restkv.eval.models.spec import check_model, model_spec

    single = first_combination(words)
    try:
        with initialize_config_dir(config_dir=str(configs), version_base=None):
            cfg = compose(config_name="config", overrides=single)
    except (HydraException, OmegaConfBaseException) as error:
        raise UsageError(composition_message(error, single, configs)) from None
    values = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(values, dict)
    check_run_keys(values)
    for group in ("policy", "bench"):  # the evaluation node's class imports the model stack: checked by the run
        check_node(values[group], group)
    try:
        instantiate(cfg.policy, _convert_="all")  # the policy's own range checks (its __post_init__)
        benchmark = instantiate(cfg.bench, _convert_="all")
    except HydraException as error:  # InstantiationException: the class's own message is its cause's
        cause = error.__cause__
        if isinstance(cause, ValueError | TypeError | NotImplementedError):
            raise UsageError(str(cause)) from None
        raise
    check_model(model_spec(cfg.model))  # a hub model neither cached nor downloadable: refused now, not after retries
    if hasattr(benchmark, "check_data"):
        benchmark.check_data()  # task files missing where the hub cannot supply them


def composition_message(error: Exception, overrides: list[str], configs: Path) -> str:
    """Hydra's composition error as one line; an unknown nested key gets the closest valid name and the list."""
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
            node = OmegaConf.select(compose(config_name="config", overrides=base), parent) if parent else None
        if node is not None and OmegaConf.is_dict(node):
            settings = sorted(k for k in node if not str(k).startswith("_"))
            return f"{key} is not a setting of {parent}{suggest(name, settings)} (its settings: {', '.join(settings)})"
    kept = [line for line in lines if not line.startswith(("full_key:", "object_type=", "See "))]
    return "; ".join(dict.fromkeys(kept))
