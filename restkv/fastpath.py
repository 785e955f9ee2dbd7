"""Fast paths checked once per signature against the eager path, with a fallback that says so.

The GPU's default paths (the recorded decode step of `restkv.decoding.static_decoder`, the fused varlen kernels of
`restkv.storage.varlen`, ReST-KV's direct distances of `restkv.scoring`) are tested on CPUs against their
contracts; a stack no test has seen (another torch, driver or kernel build) may refuse a shape or
answer differently. So where the user left the choice to the library (``decode=auto``, the ``auto``
kernels), the first use of a fast path on a new *signature* (the decoder's shapes; a kernel's
shape) also runs the eager path on the same input and compares: tokens for decoding, outputs or
scores for kernels. A mismatch or an exception settles that signature on the eager path for the
rest of the process: one line says why on stderr, and every sample it affects records the reason
(``fallbacks`` in ``predictions.jsonl``, counted in ``metrics.json``). A setting that names the
fast path explicitly is never checked: its errors propagate.

The check costs one extra eager computation per signature (bounded: signatures round their shapes).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Verdict:
    """The outcome of one signature's check: ``reason`` is None when the fast path agreed."""

    kind: str
    """What was checked: ``decode``, ``varlen`` or ``scoring``."""
    fast: str
    """The fast path's name (``graph``, ``torch``, ``flash``, ``direct``)."""
    eager: str
    """The path used instead on a mismatch (``eager``, ``reference``, ``expanded``)."""
    reason: str | None

    @property
    def ok(self) -> bool:
        return self.reason is None

    def message(self) -> str:
        """One line: what fell back to what, and why."""
        return f"{self.kind} {self.fast} -> {self.eager}: {self.reason}"


@dataclass
class FastPathChecks:
    """Verdicts per signature for this process, and the fallbacks applied since the last `drain`."""

    verdicts: dict[tuple, Verdict] = field(default_factory=dict)
    applied: list[str] = field(default_factory=list)

    def verdict(self, key: tuple) -> Verdict | None:
        return self.verdicts.get(key)

    def settle(self, key: tuple, verdict: Verdict) -> Verdict:
        """Keep ``verdict`` for ``key``; a fallback is announced once, on stderr, and applied."""
        self.verdicts[key] = verdict
        if not verdict.ok:
            print(f"restkv: fast path checked and refused, using the eager path: {verdict.message()}", file=sys.stderr)
            self.apply(verdict)
        return verdict

    def apply(self, verdict: Verdict) -> None:
        """Note that the sample in flight used ``verdict``'s fallback."""
        message = verdict.message()
        if message not in self.applied:
            self.applied.append(message)

    def drain(self) -> list[str]:
        """The fallbacks applied since the last call (one message each), forgotten here."""
        applied, self.applied = self.applied, []
        return applied

    def clear(self) -> None:
        self.verdicts.clear()
        self.applied.clear()

    def run(
        self,
        key: tuple,
        names: tuple[str, str, str],
        fast: Callable[[], T],
        eager: Callable[[], T],
        disagreement: Callable[[T, T], str | None],
    ) -> T:
        """``fast()``'s result where ``key``'s check passed (running it the first time), else ``eager()``'s.

        ``names`` is (kind, fast name, eager name); ``disagreement(fast result, eager result)`` says how they
        differ, None where they agree. An exception of ``fast()`` during the check is a failed check."""
        kind, fast_name, eager_name = names
        known = self.verdict(key)
        if known is not None:
            if known.ok:
                return fast()
            self.apply(known)
            return eager()
        try:
            result: Any = fast()
        except Exception as error:  # any failure of the fast path is the finding
            self.settle(key, Verdict(kind, fast_name, eager_name, describe(error)))
            return eager()
        reference = eager()
        reason = disagreement(result, reference)
        self.settle(key, Verdict(kind, fast_name, eager_name, reason))
        return result if reason is None else reference


def describe(error: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300]}" if text else type(error).__name__


def far_apart(fast: Any, reference: Any, tolerance: float) -> str | None:
    """How two tensors differ beyond ``tolerance`` times the reference's largest magnitude (None: they agree).

    Shapes must match; a non-finite value where the reference has none is a disagreement."""
    import torch

    if fast.shape != reference.shape:
        return f"shape {tuple(fast.shape)} instead of {tuple(reference.shape)}"
    fast, reference = fast.float(), reference.float()
    if bool((~torch.isfinite(fast) & torch.isfinite(reference)).any()):
        return "non-finite values where the eager path has finite ones"
    finite = torch.isfinite(reference)
    scale = float(reference[finite].abs().max()) if bool(finite.any()) else 0.0
    worst = float((fast - reference)[finite].abs().max()) if bool(finite.any()) else 0.0
    if worst > tolerance * max(scale, 1e-6):
        return f"outputs differ by up to {worst:.3g} (largest magnitude {scale:.3g}, tolerance {tolerance:g} of it)"
    return None


def with_fallbacks(fields: dict[str, Any], messages: list[str]) -> dict[str, Any]:
    """``fields`` with ``messages`` added to its ``fallbacks`` list (the key left out while there are none)."""
    merged = list(dict.fromkeys([*fields.get("fallbacks", []), *messages]))
    return {**fields, "fallbacks": merged} if merged else fields


CHECKS = FastPathChecks()
"""The process's verdicts (a model's decoders and kernels are checked once per process)."""
