"""The hooked presses that need more than a compression ratio, built for kvpress's hooks (`restkv.interop.press_hooks`).

- ``ComposedPress`` (``policy.presses=[SnapKVPress,KnormPress]``) applies its presses in turn, each on what the
  previous one kept. The budget is shared out so that exactly the budget remains: each press that evicts tokens
  (every listed press but ThinKPress) keeps the same share ``(budget / L) ** (1 / k)`` of what reaches it, and the
  last one keeps exactly the budget of what reaches it (`composed_ratios`). A setting given (``policy.window_size``)
  goes to every listed press that takes it.
- ``FinchPress``'s window is the question, which must be inside the prefill. kvpress's pipeline marks where it
  starts with a delimiter token added to the tokenizer (and a new embedding row), which its embedding hook then
  drops; the press only reads the question's length from it. Here the evaluation's prefill says that length
  (`question_in_prefill`, under ``protocol=query_aware``), the press's window is set to it and its delimiter is one
  no prompt holds: the model and tokenizer stay as they are and the press sees what kvpress's pipeline gives it.
- ``PerLayerCompressionPress``, ``DMSPress``, ``ThinKPress`` and ``SimLayerKVPress`` take no budget: their own
  settings (`restkv.interop.press_catalogue.NOT_BUDGETED`) decide, and the records say so (`driven_by`).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import Iterator
from typing import Any

from torch import nn

from restkv.interop import EXTRA, compression_ratio, kvpress_kept
from restkv.interop.press_catalogue import COMPOSED_EXTRA, HOOKED, NOT_BUDGETED

DRIVERS = {
    "ThinKPress": "key_channel_compression_ratio",
    "SimLayerKVPress": "lazy_threshold",
    "PerLayerCompressionPress": "compression_ratios",
    "DMSPress": "threshold",
}
"""For each press of `NOT_BUDGETED`, the setting that decides what it keeps (its default where not given)."""

BUILT_HERE = ("ComposedPress", "FinchPress", "PerLayerCompressionPress", "DMSPress", "ThinKPress", "SimLayerKVPress")
"""The presses `build` makes (the other hooked presses take a compression ratio or a target size)."""

NO_DELIMITER = -1
"""FinchPress's delimiter token id here: no prompt holds it, so its embedding hook leaves every prompt whole."""

_QUESTION: contextvars.ContextVar[int | None] = contextvars.ContextVar("question_tokens", default=None)


@contextlib.contextmanager
def question_in_prefill(tokens: int) -> Iterator[None]:
    """Inside, a prefill ends with ``tokens`` question tokens (``protocol=query_aware``): FinchPress's window."""
    mark = _QUESTION.set(tokens)
    try:
        yield
    finally:
        _QUESTION.reset(mark)


def question_tokens() -> int:
    """The question's length in the prefill running now, or a clear error where none was said."""
    tokens = _QUESTION.get()
    if tokens is None:
        raise ValueError(
            "FinchPress needs the question inside the prefill, as its window: run it with protocol=query_aware "
            "(protocol=query_agnostic prefills the context alone, and evaluation=multi_turn asks questions after it)"
        )
    if tokens < 1:
        raise ValueError("FinchPress needs a question after the context (its window); this prompt has none")
    return tokens


def driven_by(policy: Any) -> str:
    """What decides what the press keeps, for the records: ``budget``, or its own setting and value."""
    if policy.press == "ComposedPress" and "ThinKPress" in policy.presses:
        value = policy.settings().get("key_channel_compression_ratio", "its default")
        return f"budget (the tokens kept); ThinKPress's key channels: key_channel_compression_ratio={value}"
    if policy.press not in NOT_BUDGETED:
        return "budget"
    name = DRIVERS[policy.press]
    value = policy.settings().get(name, "its default")
    return f"{name}={value} (not the budget): {NOT_BUDGETED[policy.press]}"


def member_settings(name: str, scorers: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The settings ComposedPress's member ``name`` takes (besides its compression ratio); ``scorers``: the scorer
    presses' settings (`restkv.interop.kvpress_policy.SUPPORTED`)."""
    return scorers[name] if name in scorers else HOOKED[name]


def check_settings(policy: Any, scorers: dict[str, tuple[str, ...]], eager_only: tuple[str, ...]) -> tuple[str, ...]:
    """Refuse what these presses cannot run with; the settings ``policy.press`` takes, its members' included.

    ``scorers`` are the scorer presses and their settings, ``eager_only`` those that read attention weights (which a
    press composed after another one would get for the whole prompt)."""
    press, given = policy.press, policy.settings()
    if press == "KVComposePress" and policy.structured is False:
        raise ValueError(
            "KVComposePress with structured=false is not supported: kvpress 0.5.5's unstructured variant masks the "
            "prompt's evicted pairs but leaves the second copy of the prompt, which its scoring pass appended, in the "
            "cache, unmasked, so decoding would attend to the whole prompt; use structured=true (its default)"
        )
    if press == "DMSPress" and policy.threshold is None:
        raise ValueError("DMSPress evicts the tokens its inner press scores below policy.threshold: set it")
    if press == "PerLayerCompressionPress":
        ratios = policy.compression_ratios
        if not ratios or not all(isinstance(r, int | float) and 0 <= r < 1 for r in ratios):
            raise ValueError(
                f"KVPressPolicy.compression_ratios={ratios!r} is not allowed: PerLayerCompressionPress needs one "
                "ratio in [0, 1) per layer, e.g. policy.compression_ratios=[0.2,0.5,0.5,0.8]"
            )
    if press != "ComposedPress":
        return HOOKED.get(press, ())
    allowed = [n for n in (*scorers, *COMPOSED_EXTRA) if n not in eager_only]
    members = policy.presses or []
    wrong = [n for n in members if n not in allowed]
    if wrong or not [n for n in members if n in scorers]:
        raise ValueError(
            f"KVPressPolicy.presses={members!r} is not allowed: ComposedPress needs a list of presses, at least one of "
            f"them a scorer press, from {', '.join(allowed)} (e.g. policy.presses=[SnapKVPress,ThinKPress])"
        )
    takes = {s for n in members for s in member_settings(n, scorers)}
    unused = sorted(set(given) - takes - {"presses"})
    if unused:
        raise ValueError(
            f"ComposedPress over {', '.join(members)}: none of them takes {', '.join(unused)}; their settings: "
            f"{', '.join(sorted(takes)) or 'none'}"
        )
    return ("presses", *sorted(takes))


def composed_ratios(evicting: int, keep: int, length: int) -> list[float]:
    """Compression ratios for ``evicting`` presses in turn that leave exactly ``keep`` of ``length`` tokens.

    Each keeps the share ``(keep / length) ** (1 / evicting)`` of what reaches it (kvpress's rounding followed
    step by step); the last one's ratio is set so that exactly ``keep`` remain.
    """
    share = (keep / length) ** (1 / evicting)
    ratios, reaching = [], length
    for _ in range(evicting - 1):
        ratios.append(1 - share)
        reaching = kvpress_kept(reaching, ratios[-1])
    ratios.append(compression_ratio(min(keep, reaching), reaching))
    return ratios


def build(policy: Any, model: nn.Module, keep: int, length: int, scorers: dict[str, tuple[str, ...]]) -> Any:
    """The kvpress press of `BUILT_HERE` that ``policy`` names, for a prompt of ``length`` tokens and ``keep`` kept
    (``scorers``: as for `check_settings`)."""
    from restkv.interop import require_kvpress

    kvpress, name, given = require_kvpress(), policy.press, policy.settings()
    own = {k: v for k, v in given.items() if k in HOOKED[name]}
    rest = {k: v for k, v in given.items() if k not in own}
    if name == "ComposedPress":
        return _composed(kvpress, policy.presses, rest, keep, length, scorers)
    if name == "FinchPress":
        return _finch(built_press(kvpress, name, own, compression_ratio=compression_ratio(keep, length)), keep)
    if name in ("ThinKPress", "SimLayerKVPress"):
        return built_press(kvpress, name, own)
    if name == "PerLayerCompressionPress" and len(policy.compression_ratios) != model.config.num_hidden_layers:
        raise ValueError(
            f"KVPressPolicy.compression_ratios has {len(policy.compression_ratios)} ratios; the model has "
            f"{model.config.num_hidden_layers} layers: give one per layer"
        )
    inner = built_press(kvpress, policy.inner, rest, compression_ratio=0.0)  # the wrapper sets it or only scores
    return built_press(kvpress, name, own, press=inner)


def _composed(kvpress: Any, members: list[str], given: dict[str, Any], keep: int, length: int, scorers: dict) -> Any:
    ratios = iter(composed_ratios(sum(1 for n in members if n not in COMPOSED_EXTRA), keep, length))
    presses = []
    for name in members:
        settings = {k: v for k, v in given.items() if k in member_settings(name, scorers)}
        extra = {} if name in COMPOSED_EXTRA else {"compression_ratio": next(ratios)}
        presses.append(built_press(kvpress, name, settings, **extra))
    return kvpress.ComposedPress(presses=presses)


def _finch(press: Any, keep: int) -> Any:
    window = question_tokens()
    if keep <= window:
        raise ValueError(
            f"FinchPress keeps the question ({window} tokens) as its window, and the budget keeps {keep}: give a "
            "budget above the question's length"
        )
    press.delimiter_token_id = NO_DELIMITER
    press.window_size = window
    return press


def built_press(kvpress: Any, name: str, settings: dict[str, Any], **fixed: Any) -> Any:
    """kvpress's press ``name`` built with ``settings`` (refused by name where this kvpress lacks one)."""
    cls = getattr(kvpress, name)
    known = set(inspect.signature(cls).parameters)
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(f"the installed kvpress's {name} takes no {', '.join(unknown)} (table: {EXTRA})")
    try:
        return cls(**fixed, **settings)
    except (AssertionError, TypeError, ValueError) as error:
        raise ValueError(f"kvpress refused {name}({settings}): {error}") from error
