"""One task's recorder: its journal (written through under the task lock,
compacted once per plain run) and the run dir files written from it.

Every answer reaches the journal file the moment it arrives: `add` writes a
generation's rows (and a failure's, a stage record's) with one write(2) under
the task lock, so a killed process loses only what was in flight at the
provider, and `--resume` asks only for that. fsync is grouped (it guards
against power loss, not a kill): a background thread syncs within half a
second of a write, and `flush` syncs at once. Score rows alone are buffered
(a few hundred, or half a second) and go with the next write: a crash only
means they are computed again.

Nothing but `--evalreplay-reset` discards a saved result. A run without
`--resume` appends its generations after the older ones (it reuses none),
and drops what they superseded (`compaction.py`: per item, the newest
generation and failure of each request and provider stay): at its end in a
single process, so repeated plain runs leave the journal the size one run
leaves, and before its first write what an earlier run (killed, or under
xdist, whose workers cannot compact at their end while peers still read)
left. `--resume` still finds every result it could use.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.journal import compaction
from pytest_evalreplay.journal import rows as journal
from pytest_evalreplay.journal.index import JournalIndex
from pytest_evalreplay.journal.rows import Failure, RolloutKey
from pytest_evalreplay.model import Generation
from pytest_evalreplay.storage import lines as line_reader
from pytest_evalreplay.storage.files import NoFollowLock, own_dir
from pytest_evalreplay.storage.runschema import LOCKS_DIR, remove_task_files
from pytest_evalreplay.values.credentials import configured_secrets, redact

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
    compact: bool = False  # drop superseded rows, once per run, at the first write
    # The API keys hidden from every failure message and scoring error saved.
    secrets: tuple[str, ...] = field(default_factory=lambda: configured_secrets(os.environ), repr=False)
    index: JournalIndex = field(init=False)
    path: Path = field(init=False)
    _buffer: list[dict[str, Any]] = field(default_factory=list)
    _first_unsaved: float | None = None
    _known_requests: set[str] = field(default_factory=set)
    _known_providers: set[str] = field(default_factory=set)
    _prepared: bool = False
    _inherited: bool = False  # the journal held another run's answers when the session read it
    _lock: NoFollowLock | None = None
    # Held by add, flush, request_rows and provider_rows, so the threads of an
    # agent task (its episodes and turn batches) share one recorder without one
    # holding a lock while a provider generates.
    mutex: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def __post_init__(self) -> None:
        self.path = journal.journal_path(self.directory, self.task)
        self.index = JournalIndex(self.path, self.task)

    # -- locks -----------------------------------------------------------------

    def locked(self) -> NoFollowLock:
        """The task lock (`with recorder.locked():`): held briefly by every
        write, refresh-before-decide and finalize."""
        if self._lock is None:
            self._lock = journal.task_lock(self.directory, self.task)
        return self._lock

    @contextmanager
    def chunk_locked(self, chunk: int | str) -> Iterator[None]:
        """Held while generating a chunk, so one process of a run generates it;
        the others wait, then read its rows from the journal. Neither the
        locks folder nor a lock file in it is ever a link."""
        locks = own_dir(self.directory / LOCKS_DIR)
        with NoFollowLock(locks / f"{self.task}.{chunk}.lock"):
            yield

    def done_in_this_run(self, unit: str) -> bool:
        """Whether a process of this run finished `unit` (a whole stage, say)
        that may have left nothing else new in the journal to tell by: a
        `done` row of this run (catch up first, under the unit's lock)."""
        return (unit, self.run) in self.index.done

    def mark_done(self, unit: str) -> None:
        """Record in the journal that this run finished `unit` (see `done_in_this_run`)."""
        self.add([journal.done_row(unit, self.run)])

    # -- reading -----------------------------------------------------------------

    def read_snapshot(self) -> JournalIndex:
        """The journal as it stood when the session started (for resume decisions)."""
        self.index.refresh(self.limit)
        self._inherited = bool(self.index.gens or self.index.fails)
        return self.index

    def refresh(self) -> JournalIndex:
        """Catch up with the journal (call under the task lock)."""
        self.index.refresh()
        return self.index

    # -- writing -----------------------------------------------------------------

    def _prepare(self) -> None:
        """Before the first write of this process: reset the journal once per
        run when asked (xdist peers of the run share the run id in its header),
        compact it once per run when asked, or give a new journal its header."""
        if self._prepared:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        header = self.index.header
        if self.reset and (header is None or header.get("run") != self.run):
            if _header_run(self.path) != self.run:
                journal.start_fresh(self.directory, self.task, self.run)
                remove_task_files(self.directory, self.task)
                self.index.reset()
        elif self.compact and _header_run(self.path) != self.run:
            self.index.refresh()
            if compaction.superseded(self.index, self.run):
                compaction.compact(self.index, self.run)
                self.index.refresh()  # a new file: read afresh
        journal.ensure_header(self.directory, self.task, self.run)
        if self.index.file_id is None:
            self.index.refresh()  # a new journal: its header, so this process's rows index as written
        self._prepared = True

    def add(self, rows: Sequence[dict[str, Any]]) -> None:
        """Write rows to the journal file at once, under the task lock; rows
        that are only scores wait for a group (or the next write, or `flush`)."""
        if not rows:
            return
        with self.mutex:
            self._buffer.extend(rows)
            if any(row["type"] != "score" for row in rows):
                self._write()
                return
            if self._first_unsaved is None:
                self._first_unsaved = time.monotonic()
            if len(self._buffer) >= GROUP_ROWS or time.monotonic() - self._first_unsaved >= GROUP_SECONDS:
                self._write()

    def hold(self, rows: Sequence[dict[str, Any]]) -> None:
        """Rows that may wait for the next write (`add` of rows that are not
        scores, `write_held`, `flush`): an agent's tool results, which need
        to be on disk only before its next turn reaches the provider, so a
        batch of turns writes every episode's once (`EpisodeRunner._generate`)."""
        with self.mutex:
            self._buffer.extend(rows)

    def write_held(self) -> None:
        """Write whatever waits in the buffer now (held rows, scores)."""
        with self.mutex:
            if self._buffer:
                self._write()

    def _write(self) -> None:
        with self.locked():
            self._append_buffer()

    def _append_buffer(self) -> None:
        """Write the buffered rows in one write (the caller holds the task lock)."""
        self._prepare()
        if self._buffer:
            lines = journal.encoded_lines(self._buffer)
            at = journal.append_durably(self.path, b"".join(lines))
            self.index.note_written(self._buffer, lines, at)
            self._buffer.clear()
        self._first_unsaved = None

    def flush(self) -> None:
        """Write what is buffered, fsync what this process wrote, and catch up."""
        with self.mutex, self.locked():
            self._append_buffer()
            journal.sync(self.path)
            self.index.refresh()

    def compact_superseded(self) -> bool:
        """At the end of a plain run that wrote here: drop what this run's
        rows superseded, so the journal holds one run's worth, not two
        (`compaction.kept`). The index is left empty (its positions were the
        old file's): call it once nothing of the session reads the journal
        again. Whether it rewrote the file."""
        if not (self.compact and self._prepared and self._inherited):
            return False  # wrote nothing, or nothing older to supersede
        with self.mutex, self.locked():
            self._append_buffer()
            self.index.refresh()
            keep = compaction.kept(self.index, self.run)
            if not keep.dropped:
                return False
            compaction.compact(self.index, self.run, keep)
        return True

    def has_request(self, rq: str) -> bool:
        """Whether the journal holds (or this process wrote) the request row of `rq`."""
        return rq in self._known_requests or rq in self.index.requests

    def request_rows(self, rq: str, content: Mapping[str, Any]) -> list[dict[str, Any]]:
        with self.mutex:
            if self.has_request(rq):
                return []
            self._known_requests.add(rq)
        return [journal.request_row(rq, content)]

    def provider_rows(self, pv: str, identity: Mapping[str, Any]) -> list[dict[str, Any]]:
        with self.mutex:
            if pv in self._known_providers or pv in self.index.providers:
                return []
            self._known_providers.add(pv)
        return [journal.provider_row(pv, identity)]

    def gen(self, key: RolloutKey, rq: str, pv: str, generation: Generation) -> dict[str, Any]:
        return journal.gen_row(key, rq, pv, self.run, generation)

    def fail(self, failure: Failure, rq: str, pv: str) -> dict[str, Any]:
        return journal.fail_row(
            replace(failure, message=redact(failure.message, self.secrets)), rq, pv, self.run
        )

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
        error = None if error is None else redact(error, self.secrets)
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


def _header_run(path: Path) -> str | None:
    try:
        with path.open("rb") as fh:
            first = fh.readline(line_reader.MAX_LINE_BYTES + 1)  # over the cap: not JSON, and not read whole
    except OSError:
        return None
    try:
        row = orjson.loads(first)
    except orjson.JSONDecodeError:
        return None
    return row.get("run") if isinstance(row, dict) else None
