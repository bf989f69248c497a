"""What every run of a session shares, and the shape of a run.

A session runs plain tasks (`taskrun.TaskRun`) and multi-stage ELO evals
(`elorun.EloRun`) through one protocol, `Run`: registered at collection with
its decisions (reuse, run, failed before), asked for an item's result while
items run, and for its outcome at a gate and at the end. The session holds a
name -> Run table and never asks which kind a run is.

`RunContext` is the session's part that runs read: settings, this run's id,
the provider, the output dir, where progress and notes go. It is plain data
plus two lazy values (the output dir, the provider's identity), so runs do
not import the session and the session does not reach into runs.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pytest_evalreplay.journal.recorder import TaskRecorder
from pytest_evalreplay.journal.rows import RolloutKey
from pytest_evalreplay.model import EvalReplayError, digest
from pytest_evalreplay.numbers.gates import BaselineTask, PairedDrop
from pytest_evalreplay.numbers.metrics import TaskOutcome
from pytest_evalreplay.numbers.planning import Decisions, TaskPlan
from pytest_evalreplay.providers import ProviderHost
from pytest_evalreplay.run.execution import RolloutResult
from pytest_evalreplay.rundir.writer import (
    prepare_output_dir,
    refuse_self_replay,
    refuse_writing_over_run_dir,
)
from pytest_evalreplay.settings import Settings


class ProgressSink:
    """Where live generation progress goes (report.py implements it)."""

    def start(self, task: str, requests: int, samples: int) -> None: ...

    def update(self, task: str, requests: int, samples: int, failures: int, tokens: int) -> None: ...

    def metric(self, task: str, text: str) -> None:
        """The task's first metric over what is scored so far, shown with the next update."""

    def end(self, task: str) -> None: ...


@dataclass(frozen=True)
class WorkerInfo:
    """This process's place in a pytest-xdist run (None outside xdist)."""

    index: int
    count: int


class ProviderExit(Exception):
    """The provider raised SystemExit: the session stops as on Ctrl-C."""


@dataclass
class RunContext:
    settings: Settings
    host: ProviderHost
    output_factory: Callable[[], Path]
    progress: ProgressSink = field(default_factory=ProgressSink)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    worker: WorkerInfo | None = None
    snapshot: Mapping[str, int] = field(default_factory=dict)
    seed: int = field(default_factory=lambda: random.SystemRandom().randrange(2**31))
    notes: list[str] = field(default_factory=list)
    # How many more failed items the session takes before it stops (0: it is
    # stopping now: -x, --maxfail reached, an interrupt; None: no limit), so a
    # run starts no work pytest will not reach. The plugin sets it from pytest's session.
    failures_left: Callable[[], int | None] = lambda: None
    journals: list[TaskRecorder] = field(default_factory=list)  # every one open_journal made
    _output: Path | None = None
    _identity: dict[str, Any] | None = None
    _pv: str | None = None

    @property
    def output(self) -> Path:
        """The run dir, resolved on first use so a session without evals writes nothing."""
        if self._output is None:
            out = self.output_factory()
            if self.settings.predictions is not None and self.settings.provider == "replay":
                refuse_self_replay(self.settings.predictions, out)
            refuse_writing_over_run_dir(
                out,
                writes={
                    "report": self.settings.report,
                    "html": self.settings.html,
                    "baseline": self.settings.baseline if self.settings.update_baseline else None,
                },
                reads={"compare": self.settings.compare},
            )
            prepare_output_dir(out)
            self._output = out
        return self._output

    @property
    def output_resolved(self) -> Path | None:
        return self._output

    @property
    def provider_identity(self) -> dict[str, Any]:
        if self._identity is None:
            self._identity = self.host.identity()
        return self._identity

    def adopt_provider(self, identity: dict[str, Any]) -> None:
        """--resume with no provider chosen: the one provider the journals name
        stands in, so what it made is reused; generating anything still needs
        a provider (the host refuses when asked to build one)."""
        self._identity, self._pv = dict(identity), None

    def model(self) -> str | None:
        """The model of the run: the provider's, or the adopted identity's."""
        if self.settings.provider is None and self._identity is not None:
            model = self._identity.get("model")
            return model if isinstance(model, str) else None
        return self.host.model()

    @property
    def provider_digest(self) -> str:
        if self._pv is None:
            self._pv = digest(self.provider_identity)
        return self._pv

    @property
    def resuming(self) -> bool:
        return self.settings.resume or self.settings.resume_stage is not None

    def open_journal(self, directory: Path, name: str) -> TaskRecorder:
        """The writer of journal `name` in `directory` for this run, with the
        journal read as the session found it (a run without --resume compacts
        it once before its first write; --evalreplay-reset starts it afresh)."""
        reset = self.settings.reset
        recorder = TaskRecorder(
            directory, name, self.run_id, reset, self.snapshot.get(name), compact=not self.resuming
        )
        if not reset:
            recorder.read_snapshot()
        self.journals.append(recorder)
        return recorder

    def compact_journals(self) -> None:
        """At the end of a plain run in one process: each journal this run
        wrote drops what its rows superseded. xdist workers leave it to the
        next run's first write: a worker at its end cannot know that no peer
        still reads the rows it would move."""
        if self.worker is None:
            for recorder in self.journals:
                try:
                    recorder.compact_superseded()
                except EvalReplayError as exc:
                    self.note(f"journal not compacted: {exc}")

    def note(self, line: str) -> None:
        if line not in self.notes:
            self.notes.append(line)


class Run(Protocol):
    """One task's part of a session (a plain EvalTask or an EloEval)."""

    name: str
    plan: TaskPlan
    decisions: Decisions
    selected: list[RolloutKey]
    waiting: list[RolloutKey]  # a shard's items of ELO stages that wait for every shard's stage before
    replayed: set[RolloutKey]  # reused keys a replay's saved run answered at collection
    touched: bool
    gate: Any
    recorder: TaskRecorder

    def status(self) -> Sequence[str]:
        """Lines for the collection report: what this run keeps, replays, redoes."""
        ...

    def chunk(self, batch_size: int | None) -> None:
        """Group what is to be generated into the provider's batches."""
        ...

    def rescore_reused(self) -> list[RolloutKey]:
        """Before items run (serial --resume, or a serial replay once the saved
        run answered): rescore what is reused; return the keys whose result is
        complete without running (to deselect)."""
        ...

    def result(self, key: RolloutKey) -> RolloutResult: ...

    def is_reused(self, key: RolloutKey) -> bool: ...

    def complete(self) -> TaskOutcome:
        """Every selected item's result in the journal, then the numbers (a gate)."""
        ...

    def finish(self) -> TaskOutcome:
        """The run dir files from the journal, at the end; nothing more runs."""
        ...

    def paired_drop(self, baseline: BaselineTask) -> PairedDrop | None:
        """The gate's paired test against a baseline entry (None: the instance scores')."""
        ...
