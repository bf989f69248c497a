"""One task's recorder: its journal (group commit under the task lock) and
the run dir files written from it.

Rows are buffered and committed in groups: when a few hundred have piled up,
when half a second has passed since the first unsaved one, before a retry,
and at the end of every generation chunk and before anything reads the
numbers. One commit is one write and one fsync, so a crash loses at most the
last group (and what was in flight at the provider), and `--resume` asks only
for the rest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from pytest_evalreplay import journal, rundir
from pytest_evalreplay.journal import JournalIndex, RolloutKey
from pytest_evalreplay.metrics import TaskOutcome
from pytest_evalreplay.model import Failure, Generation

GROUP_ROWS = 256
GROUP_SECONDS = 0.5


@dataclass
class TaskRecorder:
    """Journal and run dir of one task, for one session (one process)."""

    directory: Path
    task: str
    run: str
    reset: bool  # discard what the journal holds, once per run, at the first write
    limit: int | None = None  # the resume snapshot: read no further at collection
    index: JournalIndex = field(init=False)
    _buffer: list[dict[str, Any]] = field(default_factory=list)
    _first_unsaved: float | None = None
    _known_requests: set[str] = field(default_factory=set)
    _known_providers: set[str] = field(default_factory=set)
    _prepared: bool = False
    _lock: FileLock | None = None

    def __post_init__(self) -> None:
        self.index = JournalIndex(journal.journal_path(self.directory, self.task), self.task)

    # -- locks -----------------------------------------------------------------

    @contextmanager
    def locked(self) -> Iterator[None]:
        """The task lock: held briefly by every write, refresh-before-decide and finalize."""
        if self._lock is None:
            self._lock = journal.task_lock(self.directory, self.task)
        with self._lock:
            yield

    @contextmanager
    def chunk_locked(self, chunk: int | str) -> Iterator[None]:
        """Held while generating a chunk, so one process of a run generates it;
        the others wait, then read its rows from the journal."""
        locks = self.directory / ".evalreplay-locks"
        locks.mkdir(exist_ok=True)
        with FileLock(str(locks / f"{self.task}.{chunk}.lock")):
            yield

    # -- reading -----------------------------------------------------------------

    def read_snapshot(self) -> JournalIndex:
        """The journal as it stood when the session started (for resume decisions)."""
        self.index.refresh(self.limit)
        return self.index

    def refresh(self) -> JournalIndex:
        """Catch up with the journal (call under the task lock)."""
        self.index.refresh()
        return self.index

    # -- writing -----------------------------------------------------------------

    def _prepare(self) -> None:
        """Before the first write of this process: reset the journal once per
        run when asked (xdist peers of the run share the run id in its header),
        or give a new journal its header."""
        if self._prepared:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        header = self.index.header
        path = journal.journal_path(self.directory, self.task)
        if self.reset and (header is None or header.get("run") != self.run):
            current = _header_run(path)
            if current != self.run:
                journal.start_fresh(self.directory, self.task, self.run)
                rundir.remove_task_files(self.directory, self.task)
                self.index.reset()
        else:
            journal.ensure_header(self.directory, self.task, self.run)
        self._prepared = True

    def add(self, rows: Sequence[dict[str, Any]]) -> None:
        if not rows:
            return
        if self._first_unsaved is None:
            self._first_unsaved = time.monotonic()
        self._buffer.extend(rows)
        if len(self._buffer) >= GROUP_ROWS or time.monotonic() - self._first_unsaved >= GROUP_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Commit the buffered rows (one write, one fsync) and catch up."""
        with self.locked():
            self._prepare()
            if self._buffer:
                journal.append(self.directory, self.task, self._buffer)
                self._buffer.clear()
            self._first_unsaved = None
            self.index.refresh()

    def request_rows(self, rq: str, content: Mapping[str, Any]) -> list[dict[str, Any]]:
        if rq in self._known_requests or rq in self.index.requests:
            return []
        self._known_requests.add(rq)
        return [journal.request_row(rq, content)]

    def provider_rows(self, pv: str, identity: Mapping[str, Any]) -> list[dict[str, Any]]:
        if pv in self._known_providers or pv in self.index.providers:
            return []
        self._known_providers.add(pv)
        return [journal.provider_row(pv, identity)]

    def gen(self, key: RolloutKey, rq: str, pv: str, generation: Generation) -> dict[str, Any]:
        return journal.gen_row(key, rq, pv, self.run, generation)

    def fail(self, failure: Failure, rq: str, pv: str) -> dict[str, Any]:
        return journal.fail_row(failure, rq, pv, self.run)

    def score(
        self,
        key: RolloutKey,
        of: str,
        scores: Mapping[str, float] | None,
        error: str | None,
        judgments: Mapping[str, Sequence[float]] | None = None,
        no_answer: Sequence[str] = (),
        unreadable: int = 0,
    ) -> list[dict[str, Any]]:
        """A score row, unless the journal already holds these very scores for that generation."""
        prior = self.index.scores.get((key, of))
        if (
            prior is not None
            and prior.error == error
            and prior.scores == (dict(scores) if scores is not None and error is None else None)
            and (prior.judgments or None)
            == ({k: tuple(v) for k, v in judgments.items()} if judgments else None)
            and prior.no_answer == tuple(no_answer)
            and prior.unreadable == unreadable
        ):
            return []
        return [journal.score_row(key, of, self.run, scores, error, judgments, no_answer, unreadable)]

    # -- the run dir ---------------------------------------------------------------

    def write_run_dir(
        self,
        outcome: TaskOutcome,
        run: str,
        instance_order: Sequence[str],
        num_samples: int,
        postprocess: Callable[[Generation], Generation],
    ) -> None:
        """The task's run dir files from the journal (the caller holds the task lock)."""
        rundir.write_task(
            self.directory, outcome, run, self.index, instance_order, num_samples, postprocess=postprocess
        )


def _header_run(path: Path) -> str | None:
    try:
        with path.open("rb") as fh:
            first = fh.readline()
    except OSError:
        return None
    import orjson

    try:
        row = orjson.loads(first)
    except orjson.JSONDecodeError:
        return None
    return row.get("run") if isinstance(row, dict) else None
