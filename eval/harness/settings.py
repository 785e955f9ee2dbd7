"""The run-level settings of ``eval/run.py``, each declared once: its type, default, allowed values, help, whether
it is part of a run's identity, and the value that reproduces run folders written before it existed.

Everything else derives from these declarations: the checks of a command line and of a composed config
(`restkv.eval.harness.validate`), the run's values with their defaults (`Settings.of`, built once by the runner's
plan), the keys that name no run folder (`restkv.eval.harness.naming`), the keys outside a run's identity
(`restkv.eval.harness.identity`) and the settings an older run folder may lack (`added_settings`). The config
groups (``model``, ``policy``, ``bench``, ``evaluation``, ``quantization``, ``logger``) are not run-level settings:
their classes declare their own fields.

To add a run-level knob, add one field below (under `Compression` for a ``compression.*`` key) with `setting(...)`,
and its line to ``configs/config.yaml`` (Hydra composes from that file; tests/test_settings.py checks the two agree).
Give it ``before=`` the value at which it reproduces what ran before it, so that older run folders keep resuming.
Kept free of torch: a command line is checked against these before any heavy import.
"""

from __future__ import annotations

import math
import os
import re
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from restkv.budget import Budget
from restkv.choices import DECODE_INTERVAL, DECODE_PATHS, DECODE_SCHEDULES, LAYOUTS, PHASES
from restkv.eval.harness.choices import ON_CHANGE, PROTOCOLS
from restkv.eval.harness.kinds import check_one_of, check_value, conforms, describe, suggest

ALWAYS = object()
"""``before`` of a setting that run folders have recorded since the first one."""


@dataclass(frozen=True)
class Rule:
    """What a setting allows and means besides its type and default (a field's metadata, see `setting`)."""

    help: str
    choices: tuple[str, ...] | None = None
    low: int | None = None
    """The smallest integer allowed."""
    null: str = ""
    """What null means (``limit``: every sample), said in the error."""
    check: typing.Callable[[Any], object] | None = None
    """A check with its own message, for a value the type, choices and ``low`` cannot describe."""
    identity: bool = True
    """Part of a run's identity: a different value is a different experiment (False: it changes no prediction)."""
    in_name: bool = False
    """Written into the run folder's name (``budget``), so left out of the hash of the other overrides."""
    before: Any = ALWAYS
    """The value that reproduces run folders written before the setting existed (`ALWAYS`: it always existed)."""


def setting(default: Any, help: str, **rule: Any) -> Any:
    """A settings field: ``default`` and its `Rule`."""
    return field(default=default, metadata={"rule": Rule(help, **rule)})


def check_budget(budget: Any) -> None:
    """A token count, or a fraction of the prompt in (0, 1)."""
    if isinstance(budget, bool) or not isinstance(budget, int | float):
        raise ValueError(
            f"budget={budget!r} is not allowed; it must be a token count (integer) or a fraction in (0, 1)"
        )
    if isinstance(budget, float) and not (math.isfinite(budget) and (0 < budget < 1 or budget.is_integer())):
        raise ValueError(f"budget={budget!r} is not allowed; a fraction of the prompt must lie in (0, 1)")
    Budget(budget)  # budget=1.0 is ambiguous: refused with the way out


def check_device_name(device: Any) -> None:
    """The form of ``device`` (whether this machine has it is checked when the run picks it)."""
    if not (isinstance(device, str) and re.fullmatch(r"[a-z]+(:\d+)?", device)):
        raise ValueError(f"device={device!r} is not a device; use auto, cpu, cuda or cuda:N")


def check_decode_batch(value: Any) -> None:
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"decode_batch={value!r} is not allowed; use auto or an integer >= 1 (1: one prompt a step)")


def check_out_dir(out_dir: Any) -> Path:
    """``out_dir`` as a path that can be created and written, checked without creating anything."""
    check_value("out_dir", out_dir, str)
    if not out_dir.strip():
        raise ValueError(
            f"out_dir={out_dir!r} is not allowed: name the folder results go to (out_dir=results is the default)"
        )
    path = Path(out_dir).expanduser()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"out_dir={out_dir!r} is not allowed: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"out_dir={out_dir!r} is not writable ({existing} does not allow writing); choose another")
    return path


@dataclass(frozen=True)
class Compression:
    """``compression.*``: when eviction happens, the decode-time budget, interval and schedule, and the prefill's
    chunk."""

    phase: str = setting(
        "prefill",
        "When eviction happens: prefill (once, at the end of the prompt: the paper) | decode (the prompt "
        "kept whole, every layer cut while answering) | both.",
        choices=PHASES,
        before="prefill",
    )
    decode_budget: int | None = setting(
        None, "Tokens each layer keeps during decoding, window included (phase=decode|both).", low=1, before=None
    )
    decode_interval: int = setting(
        DECODE_INTERVAL, "Decoded tokens between two decode-time cuts.", low=1, before=DECODE_INTERVAL
    )
    decode_schedule: str = setting(
        "interval",
        "When a cut is due: interval (decode_interval tokens since a layer's last cut) | length (R-KV's "
        "authors' timing: the step after the sequence reaches a multiple of decode_interval).",
        choices=DECODE_SCHEDULES,
        before="interval",
    )
    prefill_chunk: int | None = setting(
        None,
        "null: the prompt in one forward | N: prefilled N tokens at a time, every layer cut to its budget after "
        "each chunk by the policy's own scores (restkv.chunked_prefill).",
        low=1,
        null="for one forward per prompt",
        before=None,
    )


@dataclass(frozen=True)
class Settings:
    """The top-level keys of ``configs/config.yaml``, checked, with their defaults; the checks run in this order."""

    compression: Compression = field(default_factory=Compression, metadata={"rule": Rule("When eviction happens.")})
    budget: int | float = setting(
        128,
        "Tokens kept per layer, window included; a float in (0, 1): the fraction of each prompt kept.",
        check=check_budget,
        in_name=True,
    )
    protocol: str = setting(
        "query_aware",
        "query_aware: the question inside the compressed prompt (the paper); query_agnostic: the "
        "context alone compressed, the question appended after eviction.",
        choices=PROTOCOLS,
    )
    layout: str = setting(
        "auto",
        "How kept tokens are stored (restkv.storage.layouts); every layout gives the same outputs.",
        choices=LAYOUTS,
        before="auto",
    )
    decode: str = setting(
        "auto",
        "How greedy answers are decoded (every path gives the same tokens).",
        choices=DECODE_PATHS,
        identity=False,
    )
    decode_batch: int | str = setting(
        "auto",
        "Prompts decoded together per step: auto (from free GPU memory; 1 on a CPU) or an integer.",
        check=check_decode_batch,
        identity=False,
    )
    limit: int | None = setting(
        None, "Run at most this many samples; null runs everything.", low=1, null="for every sample", identity=False
    )
    allow_skips: bool = setting(
        False, "Run the tasks the benchmark can run and record the skip of the others.", identity=False
    )
    on_change: str = setting(
        "refuse",
        "When the run folder holds another experiment: refuse | new_folder | adopt.",
        choices=ON_CHANGE,
        identity=False,
    )
    device: str = setting("auto", "auto, cpu, cuda or cuda:N.", check=check_device_name, identity=False)
    out_dir: str = setting("results", "The folder results go to.", check=check_out_dir, identity=False)

    @classmethod
    def of(cls, values: dict[str, Any]) -> Settings:
        """The settings of a resolved config (absent keys at their defaults), each value checked in field order."""
        found: dict[str, Any] = {}
        for f in fields(cls):
            value = values.get(f.name, None if f.name in SECTIONS else f.default)
            CHECKS[f.name](value)
            found[f.name] = SECTIONS[f.name](**(value or {})) if f.name in SECTIONS else value
        return cls(**found)


SECTIONS: dict[str, type] = {"compression": Compression}
"""Settings that group others (``compression.phase``...), by their key, with their class."""


def rules(cls: type = Settings, prefix: str = "") -> dict[str, tuple[Rule, Any, Any]]:
    """Every declared setting by its dotted key: (rule, type, default), sections first as a whole."""
    hints = typing.get_type_hints(cls)
    found: dict[str, tuple[Rule, Any, Any]] = {}
    for f in fields(cls):
        key = prefix + f.name
        default = f.default_factory() if f.name in SECTIONS and prefix == "" else f.default  # type: ignore[misc]
        found[key] = (f.metadata["rule"], hints[f.name], default)
        if f.name in SECTIONS and prefix == "":
            found.update(rules(SECTIONS[f.name], f"{key}."))
    return found


def check_setting(key: str, value: Any) -> None:
    """Refuse a value of setting ``key`` that is not of its type, choices or range, or fails its own check."""
    rule, kind, _ = RULES[key]
    if key in SECTIONS:
        return check_section(key, value)
    if rule.check is not None:
        rule.check(value)
    elif rule.choices is not None:
        check_one_of(key, value, rule.choices)
    elif not conforms(value, kind):
        raise ValueError(f"{key}={value!r} is not allowed; it must be {describe(kind)}")
    elif rule.low is not None and value is not None and value < rule.low:
        null = f" (or null {rule.null})".replace(" )", ")") if type(None) in typing.get_args(kind) else ""
        raise ValueError(f"{key}={value!r} is not allowed; it must be an integer >= {rule.low}{null}")
    return None


def check_section(key: str, value: Any) -> None:
    """A section (``compression``) as a mapping of its own settings, each checked."""
    if value is None:
        return
    leaves = [name.partition(".")[2] for name in RULES if name.startswith(f"{key}.")]
    if not isinstance(value, dict):
        named = ", ".join(f"{key}.{leaf}" for leaf in leaves[:2])
        raise ValueError(f"{key}={value!r} is not allowed; set {named} ...")
    for leaf in value:
        if leaf not in leaves:
            raise ValueError(f"{key}.{leaf} is not a setting; allowed: {', '.join(leaves)}{suggest(leaf, leaves)}")
    for leaf in leaves:
        check_setting(f"{key}.{leaf}", value.get(leaf, RULES[f"{key}.{leaf}"][2]))


RULES = rules()
"""Every setting by its dotted key (``layout``, ``compression.decode_interval``): its rule, type and default."""
DEFAULTS = {key: default for key, (_, _, default) in RULES.items() if key not in SECTIONS}
"""Every setting's default by its dotted key."""
CHECKS: dict[str, typing.Callable[[Any], object]] = {
    key: (lambda value, key=key: check_setting(key, value)) for key in RULES
}
"""Each setting's check of one value, by its dotted key (a section's checks its mapping)."""
NOT_IDENTITY = tuple(key for key, (rule, _, _) in RULES.items() if not rule.identity)
"""Settings that change no prediction: out of a run's identity and out of its folder's name."""
IN_NAME = tuple(key for key, (rule, _, _) in RULES.items() if rule.in_name)
"""Settings written into a run folder's name."""


def default(key: str) -> Any:
    """A setting's declared default (``compression.decode_interval``: 32)."""
    return DEFAULTS[key]


def value_of(values: dict[str, Any], key: str) -> Any:
    """Setting ``key`` of a resolved config (dotted for a section's), its default where absent; not checked."""
    head, _, leaf = key.partition(".")
    node = values.get(head) if leaf else values
    return (node or {}).get(leaf or head, DEFAULTS[key])


def added_settings() -> dict[str, Any]:
    """The settings added after run folders existed, at the values that reproduce what ran before them: a section
    whole (folders from before it) with its leaves (folders from before a leaf was added)."""
    added: dict[str, Any] = {}
    for key, (rule, _, _) in RULES.items():
        head, _, leaf = key.partition(".")
        if rule.before is ALWAYS or key in SECTIONS:
            continue
        if leaf:
            added.setdefault(head, {})[leaf] = rule.before
        else:
            added[key] = rule.before
    return added
