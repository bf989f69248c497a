"""A multiple-choice task's choices: read from each instance, checked, and
turned into a loglikelihood request's continuations; the gold choice's index.

Every bad value is an `EvalReplayError` naming the task, the instance and the
field, raised when the task is collected (`EvalTask.request_digests`), never
a score of 0 later.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_evalreplay.model import EvalReplayError, Instance
from pytest_evalreplay.storage.rowfields import show

ChoicesSource = str | Callable[[Instance], Any]


@dataclass(frozen=True)
class Choices:
    """Where a task's choices come from (`source`: an instance field or a
    callable) and the delimiter between the prompt and each choice (as
    lm-evaluation-harness's `target_delimiter`)."""

    source: ChoicesSource
    delimiter: str = " "

    @classmethod
    def build(cls, source: Any, delimiter: Any, task: str) -> Choices:
        if not isinstance(source, str) and not callable(source):
            raise EvalReplayError(
                f"task {task!r}: choices must name the instance field that holds the answer choices "
                f"(a list of strings), or be a callable(instance) -> list[str]; got {type(source).__name__}"
            )
        if not isinstance(delimiter, str):
            raise EvalReplayError(
                f"task {task!r}: choice_delimiter must be a string (e.g. ' '), got {show(delimiter)}"
            )
        return cls(source, delimiter)

    def of(self, instance: Instance, where: str) -> list[str]:
        """The instance's choices: a non-empty list of strings."""
        if callable(self.source):
            try:
                value = self.source(instance)
            except Exception as exc:
                raise EvalReplayError(
                    f"{where}: the choices callable raised {type(exc).__name__}: {exc}"
                ) from None
            field = "the choices callable's result"
        else:
            if self.source not in instance:
                raise EvalReplayError(
                    f"{where}: the instance has no choices field {self.source!r} (it has: "
                    f"{', '.join(sorted(map(str, instance)))}); set EvalTask(choices=...) to the field "
                    "that holds the answer choices"
                )
            value = instance[self.source]
            field = f"choices field {self.source!r}"
        if not isinstance(value, (list, tuple)) or not all(isinstance(c, str) for c in value):
            raise EvalReplayError(f"{where}: {field} must be a list of strings, got {show(value)}")
        if not value:
            raise EvalReplayError(f"{where}: {field} is empty; give at least one choice")
        return list(value)

    def continuations(self, choices: Sequence[str]) -> tuple[str, ...]:
        """What the provider scores after the prompt: delimiter + choice."""
        return tuple(self.delimiter + c for c in choices)


def gold_index(target: Any, choices: Sequence[str], where: str, field: str) -> int:
    """The gold choice's index: `target` is that index, or the gold choice's text."""
    if isinstance(target, bool) or not isinstance(target, (int, str)):
        raise EvalReplayError(
            f"{where}: {field} must be the gold choice's index (an int) or its text, got {show(target)}"
        )
    if isinstance(target, int):
        if not 0 <= target < len(choices):
            raise EvalReplayError(
                f"{where}: {field} = {target} is out of range for {len(choices)} choices "
                f"(indices 0..{len(choices) - 1})"
            )
        return target
    if target not in choices:
        raise EvalReplayError(
            f"{where}: {field} = {show(target)} is not among the choices {show(choices, 120)}; give the "
            "gold choice's text exactly, or its index"
        )
    return choices.index(target)
