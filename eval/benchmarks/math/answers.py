"""Final answers of math solutions: where they are in a generated text, and when two of them are equal.

The rules are those of the public math evaluators (Qwen2.5-Math's ``extract_answer`` / ``strip_string`` /
``math_equal`` and lm-evaluation-harness's ``last_boxed_only_string``), restated here without the symbolic
algebra: an answer is found by, in order, the last ``\\boxed{...}`` (braces matched), the text after the last
"the answer is", the last number; it is normalised (spacing, ``\\left``/``\\right``, ``\\dfrac``, units in
``\\text{}``, degrees, dollars, percent signs, trailing dots, thousands separators) and compared as numbers
when both read as numbers (fractions included, relative tolerance 1e-4), else as normalised strings.
"""

from __future__ import annotations

import math
import re

NUMBER = re.compile(r"-?\d*\.?\d+")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with its braces matched, or None."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start:]
    if rest.startswith("\\boxed ") and "{" not in rest.split(" ", 1)[1][:1]:
        return rest[len("\\boxed ") :].split("$")[0].strip()
    open_at = rest.find("{")
    if open_at < 0:
        return None
    depth = 0
    for index in range(open_at, len(rest)):
        depth += {"{": 1, "}": -1}.get(rest[index], 0)
        if depth == 0:
            return rest[open_at + 1 : index]
    return None


def extract_answer(text: str) -> str:
    """A generated solution's final answer ('' when it has none)."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    for cue in ("he answer is", "final answer is"):
        if cue in text:
            return text.split(cue)[-1].strip().split("\n")[0].strip().rstrip(".").strip()
    numbers = NUMBER.findall(text.replace(",", ""))
    return numbers[-1] if numbers else ""


def gsm8k_reference(answer: str) -> str:
    """GSM8K's reference: the text after ``####`` of its worked solution, thousands separators removed."""
    if "####" not in answer:
        raise ValueError(f"a GSM8K answer has its final number after '####'; got {answer[-60:]!r}")
    return answer.split("####")[-1].strip().replace(",", "")


def normalise(answer: str) -> str:
    """An answer with the notation differences that do not change its value removed."""
    text = answer.strip().replace("\n", "").replace("\\!", "")
    text = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", text)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac")):
        text = text.replace(old, new)
    for unit in ("^\\circ", "^{\\circ}", "\\circ", "\\$", "$", "\\%", "%", "degrees", "dollars", "cm", "units"):
        text = text.replace(unit, "")
    text = text.replace(" ", "").rstrip(".").rstrip("/")
    if re.fullmatch(r"-?[\d,]+(\.\d+)?", text):
        text = text.replace(",", "")
    if re.fullmatch(r"[a-zA-Z]\w*=.+", text) and text.count("=") == 1:  # "x=5" -> "5"
        text = text.split("=", 1)[1]
    return re.sub(r"\.0+$", "", text)


def as_number(answer: str) -> float | None:
    """The value of a plain number, ``a/b`` or ``\\frac{a}{b}`` (signs allowed), else None."""
    text = normalise(answer)
    fraction = re.fullmatch(r"(-?)\\frac\{?(-?\d+)\}?\{?(-?\d+)\}?", text) or re.fullmatch(r"(-?)(-?\d+)/(-?\d+)", text)
    if fraction:
        sign, top, bottom = fraction.groups()
        return None if int(bottom) == 0 else (-1 if sign else 1) * int(top) / int(bottom)
    try:
        return float(text)
    except ValueError:
        return None


def same_answer(prediction: str, reference: str) -> bool:
    """Whether a predicted final answer equals the reference (numbers within 1e-4 relative, else notation)."""
    if not prediction:
        return False
    left, right = as_number(prediction), as_number(reference)
    if left is not None and right is not None:
        return math.isclose(left, right, rel_tol=1e-4, abs_tol=1e-9)
    return normalise(prediction).lower() == normalise(reference).lower()
