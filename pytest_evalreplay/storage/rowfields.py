"""The checks of a saved row's fields and the messages for a malformed one,
shared by every reader of saved files (replay's formats, the run dir schema
that compare reads with), so a bad field reads the same wherever it is met:
file:line, the field by its path in the row, what it must be, what it holds,
and the fix."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pytest_evalreplay.model import EvalReplayError


def type_name(value: Any) -> str:
    """A value's kind for an error message, in the words of a JSON file
    ("a number", "an object") rather than of Python, since that is what the
    user wrote; anything JSON cannot hold is named by its Python type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def show(value: Any, limit: int = 60) -> str:
    """A value for a message: its repr, cut short (a saved field can be huge)."""
    text = repr(value[: limit + 1] if isinstance(value, (str, bytes)) else value)
    if len(text) > limit:
        return text[: limit - 3] + "..."
    return text


def bad_field(where: str, name: str, expected: str, value: Any) -> EvalReplayError:
    """A field of the wrong type, by its path in the row."""
    return EvalReplayError(
        f"{where}: {name!r} must be {expected}, got {described(value)}; fix or delete that line"
    )


# How a reader reports a field of the wrong type: `bad_field`, or a reader's
# own with the same arguments (inspect_ai's, whose rows are zip members).
BadField = Callable[[str, str, str, Any], EvalReplayError]


def optional_string(
    row: Mapping[str, Any], key: str, where: str, parent: str = "", bad: BadField = bad_field
) -> str | None:
    """`row[key]`, which may be a string, null or absent; anything else is
    `bad`'s error naming the field by its path (`parent.key`, or `key` at the
    top of the row)."""
    value = row.get(key)
    if value is None or type(value) is str:
        return value
    raise bad(where, f"{parent}.{key}" if parent else key, "a string or null", value)


def token_count(value: Any, where: str, name: str, bad: BadField = bad_field) -> int | None:
    """A token count field (`name`, its path in the row): a non-negative
    integer, or null where the harness did not count."""
    if value is None or (type(value) is int and value >= 0):
        return value
    raise bad(where, name, "a non-negative integer or null", value)


def not_an_object(where: str, what: str, value: Any) -> EvalReplayError:
    return EvalReplayError(
        f"{where}: {what} must be a JSON object, got {described(value)}; fix or delete that line"
    )


def described(value: Any) -> str:
    """A saved value for a message: its JSON type, and its start."""
    return "null" if value is None else f"{type_name(value)} ({show(value, 40)})"
