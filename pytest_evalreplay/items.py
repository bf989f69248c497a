"""Collection: an `EvalTask` becomes a collector of one item per
(stage, instance, rollout), with node ids like `test_evals.py::gsm8k::q0042[s1-r0]`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_evalreplay.model import EvalReplayError, RolloutResult
from pytest_evalreplay.task import EvalTask

if TYPE_CHECKING:
    from typing_extensions import Self

    from pytest_evalreplay.session import EvalSession

SESSION_KEY: pytest.StashKey[EvalSession] = pytest.StashKey()
REUSED_REASON = "evalreplay: reused from journal"


class ItemFailed(Exception):
    """Generation or scoring failed for good; reported as a short message."""


class TaskCollector(pytest.Collector):
    def __init__(self, *, task: EvalTask, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.task = task

    @classmethod
    def from_parent(cls, parent: pytest.Collector, *, name: str, task: EvalTask) -> TaskCollector:  # type: ignore[override]
        return super().from_parent(parent, name=name, task=task)

    def collect(self) -> Iterator[RolloutItem]:
        stage = 1
        for instance in self.task.instances:
            for rollout in range(self.task.num_samples):
                name = f"{instance['id']}[s{stage}-r{rollout}]"
                yield RolloutItem.from_parent(
                    self,
                    name=name,
                    # Given as a string so pytest >= 9.2 parses "[s1-r0]" as the
                    # item's params, as it does when reading --lf's cache.
                    nodeid=f"{self.nodeid}::{name}",
                    task=self.task,
                    stage=stage,
                    instance_id=instance["id"],
                    rollout=rollout,
                )
        if self.task.gate is not None:
            yield GateItem.from_parent(self, name="gate", task=self.task)


class TaskItem(pytest.Item):
    """An item of an eval task: marked `evalreplay`, matched by the task's
    name, failing with a one-line message rather than a traceback."""

    def __init__(self, *, task: EvalTask, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.task = task
        self.add_marker("evalreplay")
        self.extra_keyword_matches.add(task.name)

    @classmethod
    def from_parent(cls, parent: pytest.Collector, **kwargs: Any) -> Self:  # type: ignore[override]
        return super().from_parent(parent, **kwargs)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, ItemFailed):
            return f"{self.task.name} {self.name}: {excinfo.value}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        line = self.task.defined_line - 1 if self.task.defined_in == self.path else 0
        return self.path, line, f"{self.task.name}::{self.name}"


class RolloutItem(TaskItem):
    """One rollout of one instance. Running it reads the task's batched result
    (the first item of a batch to run generates the whole batch)."""

    def __init__(self, *, stage: int, instance_id: str, rollout: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stage = stage
        self.instance_id = instance_id
        self.rollout = rollout
        self.extra_keyword_matches.update({instance_id, f"s{stage}", f"r{rollout}", f"s{stage}-r{rollout}"})
        self.user_properties.extend(_identity(self))

    @property
    def key(self) -> tuple[int, str, int]:
        return (self.stage, self.instance_id, self.rollout)

    def runtest(self) -> None:
        result = self.config.stash[SESSION_KEY].result_for(self)
        record(self, result)
        if not result.ok:
            raise ItemFailed(result.error)


class GateItem(TaskItem):
    """`<file>::<task>::gate`: judges the task's results against its Gate.
    Collected after the task's rollouts, so it runs once they have."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.user_properties.append(("evalreplay.gate", self.task.name))

    def runtest(self) -> None:
        try:
            outcome = self.config.stash[SESSION_KEY].gate_outcome(self.task)
        except EvalReplayError as exc:
            raise ItemFailed(str(exc)) from None
        self.user_properties.extend(
            [
                ("gate.metric", outcome.gate.metric),
                ("gate.value", outcome.value),
                ("gate.passed", outcome.passed),
                ("gate.summary", outcome.describe()),
            ]
        )
        if not outcome.passed:
            raise ItemFailed(outcome.describe())


def _identity(item: RolloutItem) -> list[tuple[str, object]]:
    return [
        ("evalreplay.task", item.task.name),
        ("evalreplay.instance", item.instance_id),
        ("evalreplay.stage", item.stage),
        ("evalreplay.rollout", item.rollout),
    ]


def record(item: pytest.Item, result: RolloutResult) -> None:
    """Put the item's scores and finish reason in user_properties (and so in JUnit XML)."""
    props = item.user_properties
    for name, value in result.scores.items():
        props.append((f"score.{name}", value))
    gen = result.generation
    if gen is not None:
        props.append(("finish_reason", gen.finish_reason))
        if gen.completion_tokens is not None:
            props.append(("completion_tokens", gen.completion_tokens))


def mark_reused(item: RolloutItem, result: RolloutResult) -> None:
    """Report a journal-held item as skipped, carrying its stored scores."""
    record(item, result)
    item.user_properties.append(("evalreplay.reused", True))
    item.add_marker(pytest.mark.skip(reason=REUSED_REASON))
