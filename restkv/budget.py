"""The token budget of a policy: a count of tokens per layer, or a fraction of each prompt.

Kept free of torch so that a command line's budget is checked before any heavy import.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    """How many tokens each layer keeps, window included (the paper's "KV size").

    An ``int`` is a token count; a ``float`` in ``(0, 1)`` is the fraction of the prompt kept
    (``0.25`` keeps a quarter of the prompt's tokens in every layer, rounded to the nearest
    integer as the reference code does).
    """

    value: int | float

    def __post_init__(self) -> None:
        value = self.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"budget must be an int (tokens) or a float in (0, 1) (fraction kept); got {value!r}")
        if isinstance(value, float) and value == 1.0:
            raise ValueError(
                "budget=1.0 is ambiguous: a float budget is the fraction of each prompt kept, in (0, 1), and an "
                "integer a token count; to keep whole prompts use policy=full, for one token per layer budget=1"
            )
        if isinstance(value, float) and value.is_integer() and value > 1:
            object.__setattr__(self, "value", int(value))
        elif isinstance(value, float) and not (0 < value < 1):
            raise ValueError(
                f"budget {value!r} is not allowed: a float budget is the fraction of the prompt kept and must "
                "lie in (0, 1); use an int for a token count"
            )
        if isinstance(self.value, int) and self.value < 1:
            raise ValueError(f"budget {value!r} is not allowed: a token budget must be >= 1")

    @property
    def is_ratio(self) -> bool:
        return isinstance(self.value, float)

    def tokens(self, prompt_length: int) -> int:
        """Tokens kept per layer for a prompt of ``prompt_length`` tokens."""
        if self.is_ratio:
            return max(1, round(self.value * prompt_length))
        return int(self.value)

    def __str__(self) -> str:
        return f"{self.value:g}" if self.is_ratio else str(self.value)
