"""The one checker of data records, for every benchmark that reads data files.

A loader says what each field of its records must hold (:class:`Field`: types, whether it may be empty, what its
list items must be, the fields of the objects a list holds) and calls :func:`check_fields`; a record that is
missing a required field, holds an empty one, a value of the wrong type (JSON ``null`` or an object where text
is expected) or no id is refused with a :class:`DataFileError` whose message starts with ``<file>:<line>:`` and
names the benchmark, the task and the field (``multi_turns[2].answer`` for a field inside a list). Nothing is
turned into text silently: a null answer would otherwise become the reference ``'None'``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class DataFileError(ValueError):
    """A data file that does not have the official layout; the message names the file and line."""


@dataclass(frozen=True)
class Field:
    """What a field must hold: the accepted Python types (after ``json.loads``) and how to say it.

    ``nonempty``: a string must hold more than blanks, a list at least one item. ``items``: the types every item of
    a list value must have. ``fields``: a list value's items are objects, each checked against these fields."""

    types: tuple[type, ...]
    description: str
    required: bool = True
    nonempty: bool = False
    items: tuple[type, ...] | None = None
    fields: Mapping[str, Field] = field(default_factory=dict)

    def accepts(self, value: Any) -> bool:
        return _is(value, self.types)


ID = Field((str, int), "the record's id (a string or an integer)", nonempty=True)
"""What a record's id field must hold, unless its loader says otherwise."""


def _is(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False  # JSON true/false must not pass for an integer
    return isinstance(value, types)


def all_items(value: list[Any], types: tuple[type, ...]) -> bool:
    """True when every item of ``value`` is one of ``types`` (booleans never count as numbers)."""
    return all(_is(item, types) for item in value)


def field_problem(value: Any, spec: Field, name: str) -> str | None:
    """What is wrong with ``value`` as the field ``name`` (``field 'x' must be ...``), or None."""
    if not spec.accepts(value):
        return f"field {name!r} must be {spec.description}, got {_kind(value)} {_preview(value)}"
    empty = (isinstance(value, str) and not value.strip()) or (isinstance(value, list) and not value)
    if spec.nonempty and empty:
        return f"field {name!r} is empty ({_preview(value)}); it must be {spec.description}"
    if isinstance(value, list) and spec.items is not None:
        for index, item in enumerate(value):
            if not _is(item, spec.items):
                allowed = _names(spec.items)
                return f"field '{name}[{index}]' must be one of {allowed}, got {_kind(item)} {_preview(item)}"
    if isinstance(value, list) and spec.fields:
        for index, item in enumerate(value):
            if not isinstance(item, dict):
                return f"field '{name}[{index}]' must be an object, got {_kind(item)} {_preview(item)}"
            problem = record_problem(item, spec.fields, prefix=f"{name}[{index}].")
            if problem:
                return problem
    return None


def record_problem(record: Mapping[str, Any], fields: Mapping[str, Field], prefix: str = "") -> str | None:
    """The first missing, empty or mistyped field of ``record`` as a phrase naming it, or None."""
    for name, spec in fields.items():
        if name not in record:
            if not spec.required:
                continue
            present = ", ".join(sorted(record)) or "none"
            return f"missing field '{prefix}{name}' ({spec.description}); fields present: {present}"
        problem = field_problem(record[name], spec, prefix + name)
        if problem:
            return problem
    return None


def check_fields(
    record: Mapping[str, Any], fields: Mapping[str, Field], *, benchmark: str, task: str, where: str, line: int
) -> None:
    """Raise :class:`DataFileError` at ``where:line`` naming the first missing, empty or mistyped field."""
    problem = record_problem(record, fields)
    if problem:
        raise DataFileError(f"{where}:{line}: {benchmark} task {task!r}: {problem}")


def _kind(value: Any) -> str:
    names = {type(None): "null", dict: "an object", list: "a list", bool: "a boolean"}
    return names.get(type(value), type(value).__name__)


def _names(types: tuple[type, ...]) -> str:
    return ", ".join(t.__name__ for t in types)


def _preview(value: Any, limit: int = 40) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_document(document: Any, fields: Mapping[str, Field], *, benchmark: str, where: str) -> None:
    """Raise :class:`DataFileError` at ``where`` naming the first bad field of a whole-file JSON ``document`` (an
    object; a field inside lists is named by its path, e.g. ``data[3].paragraphs[0].qas[2].question``)."""
    if not isinstance(document, dict):
        raise DataFileError(f"{where}: {benchmark}: expected a JSON object, got {_kind(document)}")
    problem = record_problem(document, fields)
    if problem:
        raise DataFileError(f"{where}: {benchmark}: {problem}")
