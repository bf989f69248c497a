"""The messages for a malformed saved row, shared by every reader of saved
files (replay's formats, the run dir schema that compare reads with), so a
bad field reads the same wherever it is met: file:line, the field by its path
in the row, what it must be, what it holds, and the fix."""

from __future__ import annotations

from typing import Any

from pytest_evalreplay.model import EvalReplayError, show, type_name


def bad_field(where: str, name: str, expected: str, value: Any) -> EvalReplayError:
    """A field of the wrong type, by its path in the row."""
    return EvalReplayError(
        f"{where}: {name!r} must be {expected}, got {described(value)}; fix or delete that line"
    )


def not_an_object(where: str, what: str, value: Any) -> EvalReplayError:
    return EvalReplayError(
        f"{where}: {what} must be a JSON object, got {described(value)}; fix or delete that line"
    )


def described(value: Any) -> str:
    """A saved value for a message: its JSON type, and its start."""
    return "null" if value is None else f"{type_name(value)} ({show(value, 40)})"
