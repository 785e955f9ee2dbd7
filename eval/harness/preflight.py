"""The words of a command line checked before any heavy import: a mistyped key, an unknown config, a bad top-level
value or an option where an override belongs is refused in about a second, with the closest valid name.

Only what can be checked without torch is checked here (Hydra's override grammar, the config tree's files, the
top-level keys' values); every job's composed config is checked next (`restkv.eval.harness.entry`), still before
any model or data is loaded. `hydra_order` lets Hydra's options stand anywhere on the line (``-m`` after
overrides included), as a user types them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from restkv.eval.harness.validate import RUN_KEY_CHECKS, suggest

FLAGS_WITH_VALUE = {
    "-c",
    "--cfg",
    "--info",
    "-p",
    "--package",
    "-cn",
    "--config-name",
    "-cp",
    "--config-path",
    "-cd",
    "--config-dir",
    "-sc",
    "--shell-completion",
    "--experimental-rerun",
}
"""Hydra's options that take the next word as their value."""
HYDRA_FLAGS = {"-m", "--multirun", "-h", "--help", "--hydra-help", "--version", "--resolve", *FLAGS_WITH_VALUE}
"""Hydra's own options (``-m`` for a sweep, ``--cfg job`` to print the config, ...): left to Hydra."""
CHECK_FLAG = "--check"
"""Ours: check the command (every job of a sweep) and say what it would run, without running it."""


class UsageError(ValueError):
    """A command line that cannot be what the user meant; the message says what to type instead."""


def split_argv(argv: list[str], command: str = "eval/run.py") -> tuple[list[str], list[str]]:
    """(Hydra's options with their values, the ``key=value`` words) of ``argv``, each in its order; an option that
    is neither Hydra's nor `CHECK_FLAG` is refused with the override to use."""
    flags: list[str] = []
    words: list[str] = []
    expects_value = False
    for word in argv:
        if expects_value:
            flags.append(word)
            expects_value = False
            continue
        name = word.split("=", 1)[0]
        if name in HYDRA_FLAGS or word == CHECK_FLAG:
            flags.append(word)
            expects_value = name in FLAGS_WITH_VALUE and "=" not in word
            continue
        if word.startswith("-") and not word.startswith("~"):
            key = word.lstrip("-")
            hint = f"{key}" if "=" in key else f"{key}=<value>"
            raise UsageError(
                f"{word!r} is not an option of {command}: settings are key=value overrides (write {hint}); "
                f"options: -m (a sweep), {CHECK_FLAG} (check it, run nothing), --cfg job (print the config), --help"
            )
        words.append(word)
    return flags, words


def overrides_of(argv: list[str], command: str = "eval/run.py") -> list[str]:
    """The ``key=value`` words of ``argv`` (see `split_argv`)."""
    return split_argv(argv, command)[1]


def hydra_order(argv: list[str]) -> list[str]:
    """``argv`` with the options first, then the overrides, each in its order: Hydra's parser takes its options
    before the overrides only (``bench=micro -m policy=a,b`` would be an error); `CHECK_FLAG` is left out."""
    flags, words = split_argv(argv)
    return [*(f for f in flags if f != CHECK_FLAG), *words]


def is_multirun(argv: list[str]) -> bool:
    return bool({"-m", "--multirun"} & set(argv))


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
