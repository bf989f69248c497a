"""Reading a task's journal (`journal.py` has its rows and how they are
written): compact references to its rows, caught up incrementally from a
byte offset, every row validated where it is read.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from pytest_evalreplay.journal.rows import FORMAT, Failure, RolloutKey, journal_path
from pytest_evalreplay.model import EvalReplayError, Generation
from pytest_evalreplay.storage.files import ReadFile, os_error
from pytest_evalreplay.storage.lines import check_line_lengths

_GENERATION_FIELD = b',"generation":'


class GenRef(NamedTuple):
    """Where a `gen` row is, and what it answered (its text stays on disk).
    Immutable; a NamedTuple, not a frozen dataclass, because one is built
    for every gen row read or written, and a frozen dataclass takes three
    times as long to build."""

    request: str
    provider: str
    run: str
    offset: int
    length: int
    lineno: int
    seq: int  # row number in the file, to order events of one key
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class ScoreRef(NamedTuple):
    """The latest scores (or scoring error) of one generation. For an ELO
    item, `scores` holds its mean verdict per reference, `judgments` each
    judgment (one per judge trial) and `no_answer` the references that had
    no saved answer to judge against. A NamedTuple, as GenRef: one per row."""

    scores: Mapping[str, float] | None
    error: str | None
    run: str
    lineno: int
    judgments: Mapping[str, tuple[float, ...]] | None = None
    no_answer: tuple[str, ...] = ()
    unreadable: int = 0  # judge replies that could not be read


# GenRef and ScoreRef rows built as tuples of all their fields, without the
# NamedTuple's own `__new__` (a Python frame, its defaults): one per row read.
_new = tuple.__new__


class _BadRow(ValueError):
    """A row that fails its checks: what is wrong and what to do, without
    where (`JournalIndex._checked_apply` adds its file and line)."""


@dataclass(frozen=True, slots=True)
class FailRef:
    failure: Failure
    request: str
    provider: str
    run: str
    lineno: int
    seq: int


@dataclass
class JournalIndex:
    """What a task's journal holds, as compact references, read incrementally.

    `refresh()` reads rows appended since the last read (by this process or
    another), so an xdist worker sees what its peers generated once it holds
    the task lock. `limit` caps the bytes read (the resume snapshot the
    controller takes, so every worker decides from the same journal).
    """

    path: Path
    task: str
    header: dict[str, Any] | None = None
    offset: int = 0
    lineno: int = 0
    rows: int = 0
    # Tuples, not lists: an item mostly has one reference, and a tuple of one is
    # half a list of one, for every item of the session.
    gens: dict[RolloutKey, tuple[GenRef, ...]] = field(default_factory=dict)
    scores: dict[tuple[RolloutKey, str], ScoreRef] = field(default_factory=dict)
    fails: dict[RolloutKey, tuple[FailRef, ...]] = field(default_factory=dict)
    # digest -> where its first row is, `offset << 32 | length` (`request_at`): one
    # int, not a tuple of two, for each request of the session (a line is < 2**28).
    requests: dict[str, int] = field(default_factory=dict)
    providers: dict[str, dict[str, Any]] = field(default_factory=dict)
    provider_lines: dict[str, int] = field(default_factory=dict)  # digest -> line of its first row
    stage_rows: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (lineno, row)
    done: set[tuple[str, str]] = field(default_factory=set)  # (unit, run): `done` rows
    done_lines: dict[tuple[str, str], int] = field(default_factory=dict)  # (unit, run) -> its first line
    torn: int | None = None  # line number of a torn last line, if any
    file_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the file read: a rewrite is a new one
    notes: list[str] = field(default_factory=list)
    # One object per distinct key, digest, run id and score mapping: a large
    # task repeats them on every row, and the index lives as long as the session.
    _shared: dict[Any, Any] = field(default_factory=dict, repr=False)
    _reader: tuple[ReadFile, tuple[int, int] | None] | None = field(default=None, repr=False)  # read_row's

    def _one(self, value: Any) -> Any:
        return self._shared.setdefault(value, value)

    @classmethod
    def read(cls, directory: Path, task: str, limit: int | None = None) -> JournalIndex:
        index = cls(journal_path(directory, task), task)
        index.refresh(limit)
        return index

    def reset(self) -> None:
        """Forget everything (the file was replaced by a fresh one)."""
        fresh = JournalIndex(self.path, self.task)
        self.__dict__.update(fresh.__dict__)

    def refresh(self, limit: int | None = None) -> None:
        """Read what was appended since the last read (up to `limit` bytes in all)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            if self.offset:
                self.reset()  # the file went away: another process reset it
            return
        except OSError as exc:
            raise os_error(self.path, exc, "read the journal") from None
        try:
            st = os.fstat(fd)
            size = st.st_size
            if self.file_id != (st.st_dev, st.st_ino) or size < self.offset:
                if self.offset:  # replaced (a reset or compaction by a peer): read it afresh
                    self.reset()
                self.file_id = (st.st_dev, st.st_ino)
            end = size if limit is None else min(size, limit)
            if end <= self.offset:
                return
            data = os.pread(fd, end - self.offset, self.offset)
        except OSError as exc:
            raise os_error(self.path, exc, "read the journal") from None
        finally:
            os.close(fd)
        if self.offset == 0 and data[:1] != b"{" and data.strip() and not data.lstrip().startswith(b"{"):
            raise EvalReplayError(
                f"{self.path}:1: not a journal (its first line is not a JSON object); "
                "delete it, or run with --evalreplay-reset to discard this task's saved results"
            )
        check_line_lengths(self.path, data, self.lineno + 1)
        self._parse(data)

    def _parse(self, data: bytes) -> None:
        base = self.offset
        pos = 0
        n = len(data)
        loads = orjson.loads
        torn = None
        try:
            while pos < n:
                nl = data.find(b"\n", pos)
                if nl < 0:  # no newline yet: torn (a crash) or being written; read again later
                    if data[pos:].strip():
                        torn = self.lineno + 1
                    break
                line = data[pos:nl]
                self.lineno += 1
                if line.strip():
                    try:
                        row = loads(line)
                    except orjson.JSONDecodeError as exc:
                        self.lineno -= 1
                        raise EvalReplayError(
                            f"{self._where(self.lineno + 1)}: malformed journal line ({exc}); delete "
                            "that line, or run with --evalreplay-reset to discard this task's saved results"
                        ) from None
                    self._checked_apply(row, base + pos, len(line), undo=True)
                pos = nl + 1
        finally:
            # Read up to the end of the last line indexed, set once, not per row: a
            # refused line is read again next time (its error raised each time).
            self.offset = base + pos
        self.torn = torn

    def _where(self, lineno: int | None = None) -> str:
        """The "file:line" of a row (line `lineno`, or the one being read), for its error."""
        return f"{self.path}:{self.lineno if lineno is None else lineno}"

    def _checked_apply(self, row: Any, offset: int, length: int, undo: bool) -> None:
        """`_apply`, its `_BadRow` named by file and line; `undo`: a refused
        row is not counted as read (the next read starts at it again)."""
        try:
            self._apply(row, offset, length)
        except _BadRow as exc:
            where = self._where()
            if undo:
                self.lineno -= 1
            raise EvalReplayError(f"{where}: {exc}") from None
        except EvalReplayError:
            if undo:
                self.lineno -= 1
            raise

    def _apply(self, row: Any, offset: int, length: int) -> None:
        """Index one row (line `self.lineno`); a bad one raises `_BadRow`, which
        the caller turns into an error naming the line: that string is made
        only then, not for each of a large journal's rows."""
        if not isinstance(row, dict) or not isinstance(row.get("type"), str):
            raise _BadRow("a journal row must be a JSON object with a 'type'")
        kind = row["type"]
        self.rows += 1
        if kind == "header":
            if self.header is not None:
                raise _BadRow("a second journal header; run with --evalreplay-reset")
            if row.get("format") != FORMAT:
                raise _BadRow(
                    f"a journal of another format ({row.get('format')!r}, this version reads "
                    f"{FORMAT!r}); delete it, or run with --evalreplay-reset to discard it"
                )
            self.header = row
            return
        if self.header is None:
            raise _BadRow("journal rows before its header; delete the file or run with --evalreplay-reset")
        seq = self.rows
        if kind == "gen":
            key = _key(row, "rollout")
            generation = row.get("generation")
            if not isinstance(generation, dict) or not isinstance(generation.get("text"), str):
                raise _BadRow("a gen row needs a 'generation' object with a 'text'")
            request, provider, run = row.get("request"), row.get("provider"), row.get("run")
            if type(request) is not str or type(provider) is not str or type(run) is not str:
                request, provider, run = (_str_field(row, f) for f in ("request", "provider", "run"))
            self._add_gen(key, request, provider, run, generation, offset, length)
        elif kind == "score":
            key = self._one(_key(row, "rollout"))
            of = self._one(_str_field(row, "of"))
            scores = row.get("scores")
            error = row.get("error")
            judgments = row.get("judgments")
            if judgments is not None:
                judgments = _judgments(judgments)
                if error is None:  # an ELO item's scores: its verdicts' means (earlier versions wrote both)
                    scores = {r: math.fsum(v) / len(v) for r, v in judgments.items()}
            if scores is not None:
                scores = _scores(scores)
                scores = self._shared.setdefault(("scores", *scores.items()), scores)
            elif not isinstance(error, str):
                raise _BadRow("a score row needs 'scores', 'judgments' or an 'error'")
            no_answer = row.get("no_answer", ())  # most rows have none: no list made, none walked
            if no_answer != ():
                if not isinstance(no_answer, list) or not all(isinstance(r, str) for r in no_answer):
                    raise _BadRow("'no_answer' must list reference names; delete that line")
                no_answer = tuple(no_answer)
            unreadable = row.get("unreadable", 0)
            if type(unreadable) is not int or unreadable < 0:
                raise _BadRow("'unreadable' must be a count (an int >= 0); delete that line")
            run = self._one(_str_field(row, "run"))
            self.scores[(key, of)] = _new(
                ScoreRef, (scores, error, run, self.lineno, judgments, no_answer, unreadable)
            )
        elif kind == "fail":
            failure = Failure.from_row(row, self._where())
            ref = FailRef(
                failure,
                self._one(_str_field(row, "request")),
                self._one(_str_field(row, "provider")),
                self._one(_str_field(row, "run")),
                self.lineno,
                seq,
            )
            for rollout in failure.rollouts:
                at = (failure.stage, failure.instance_id, rollout)
                self.fails[at] = (*self.fails.get(at, ()), ref)
        elif kind == "request":
            rq = row.get("digest")
            if type(rq) is not str:
                rq = _str_field(row, "digest")
            if type(row.get("request")) is not dict:
                raise _BadRow("a request row needs a 'request' object")
            self._add_request(rq, offset, length)
        elif kind == "provider":
            pv = _str_field(row, "digest")
            if not isinstance(row.get("provider"), dict):
                raise _BadRow("a provider row needs a 'provider' object")
            self.providers.setdefault(pv, row["provider"])
            self.provider_lines.setdefault(pv, self.lineno)
        elif kind == "stage":
            self.stage_rows.append((self.lineno, row))
        elif kind == "done":
            fact = (_str_field(row, "unit"), _str_field(row, "run"))
            self.done.add(fact)
            self.done_lines.setdefault(fact, self.lineno)
        else:
            raise _BadRow(f"unknown journal row type {kind!r}")

    def _add_request(self, rq: str, offset: int, length: int) -> None:
        self.requests.setdefault(self._one(rq), offset << 32 | length)  # the first row of a content stays

    def _add_gen(
        self,
        key: RolloutKey,
        request: str,
        provider: str,
        run: str,
        generation: Mapping[str, Any],
        offset: int,
        length: int,
    ) -> None:
        ptok, ctok = generation.get("prompt_tokens"), generation.get("completion_tokens")
        one = self._shared.setdefault  # `_one`, inlined: three or four times a row
        ref = _new(
            GenRef,
            (
                one(request, request),
                one(provider, provider),
                one(run, run),
                offset,
                length,
                self.lineno,
                self.rows,  # seq
                ptok if type(ptok) is int else None,
                ctok if type(ctok) is int else None,
            ),
        )
        key = one(key, key)
        self.gens[key] = (*self.gens.get(key, ()), ref)

    def note_written(
        self,
        rows: Sequence[Mapping[str, Any]],
        lines: Sequence[bytes],
        at: tuple[int, tuple[int, int] | None],
    ) -> None:
        """Index rows this process just appended as `lines` (`at`: where, in
        which file) without reading the file back, when this index had read
        exactly up to there (no other writer came between). Request and gen
        rows, the large ones, index as built (the writer made them, so they
        need no checks); score rows, one per item, are checked as built (their
        key and ids are then the objects the index holds, not decoded copies);
        the others parse their own line."""
        start, file_id = at
        if start != self.offset or file_id != self.file_id or self.header is None:
            return
        for row, line in zip(rows, lines, strict=True):
            self.lineno += 1
            kind, length = row["type"], len(line) - 1
            if kind == "request":
                self.rows += 1
                self._add_request(row["digest"], self.offset, length)
            elif kind == "gen":
                self.rows += 1
                key = (row["stage"], row["instance_id"], row["rollout"])
                self._add_gen(
                    key, row["request"], row["provider"], row["run"], row["generation"], self.offset, length
                )
            elif kind == "score":
                self._checked_apply(row, self.offset, length, undo=False)
            else:
                self._checked_apply(orjson.loads(line), self.offset, length, undo=False)
            self.offset += len(line)
            self.torn = None

    # -- reading rows back ---------------------------------------------------

    def read_line(self, offset: int, length: int) -> bytes:
        """The bytes of the row at a position this index recorded."""
        try:  # one descriptor kept open (a run dir reads back every generation), reopened for a new file
            if self._reader is None or self._reader[1] != self.file_id:
                self._reader = (ReadFile(self.path), self.file_id)
            return self._reader[0].read(offset, length)
        except OSError as exc:
            raise os_error(self.path, exc, "read the journal") from None

    def read_row(self, offset: int, length: int) -> dict[str, Any]:
        """The row at a position this index recorded (a `gen` or `request` row)."""
        try:
            row = orjson.loads(self.read_line(offset, length))
        except orjson.JSONDecodeError:
            row = None
        if not isinstance(row, dict):
            raise self._moved()
        return row

    def _moved(self) -> EvalReplayError:
        return EvalReplayError(
            f"{self.path}: the journal changed under this session (a row moved); "
            "another process rewrote it: run again with --resume"
        )

    def generation_json(self, ref: GenRef) -> bytes:
        """A gen row's generation as the journal holds its JSON, not decoded.
        For rows this code wrote (`rows.gen_row`): there the generation is the
        last field and every field before it a string or number, and a JSON
        string cannot hold `,"` (its quotes are escaped), so the first
        `,"generation":` is that field's."""
        line = self.read_line(ref.offset, ref.length)
        at = line.find(_GENERATION_FIELD)
        if at < 0 or not line.startswith(b'{"type":"gen",') or not line.endswith(b"}}"):
            raise self._moved()
        return line[at + len(_GENERATION_FIELD) : -1]

    def generation(self, ref: GenRef) -> Generation:
        row = self.read_row(ref.offset, ref.length)
        return Generation.from_row(row.get("generation"), f"{self.path}:{ref.lineno}")

    def request(self, rq: str) -> dict[str, Any] | None:
        at = self.request_at(rq)
        return None if at is None else self.read_row(*at)["request"]

    def request_at(self, rq: str) -> tuple[int, int] | None:
        """The offset and length of the first request row of `rq`, if any."""
        at = self.requests.get(rq)
        return None if at is None else (at >> 32, at & 0xFFFFFFFF)

    def latest_gen(self, key: RolloutKey, request: str, provider: str) -> GenRef | None:
        """The newest generation of `key` that answered exactly this request with this provider."""
        for ref in reversed(self.gens.get(key, ())):
            if ref.request == request and ref.provider == provider:
                return ref
        return None

    def latest_fail(self, key: RolloutKey, request: str, provider: str) -> FailRef | None:
        for ref in reversed(self.fails.get(key, ())):
            if ref.request == request and ref.provider == provider:
                return ref
        return None

    def standing(self, key: RolloutKey, request: str, provider: str) -> tuple[GenRef | None, FailRef | None]:
        """The generation `key` stands on for this request and provider (None
        when a later failure overrides it), and its newest failure."""
        gen = self.latest_gen(key, request, provider)
        fail = self.latest_fail(key, request, provider)
        if gen is not None and fail is not None and fail.seq > gen.seq:
            gen = None
        return gen, fail

    def score_of(self, key: RolloutKey, gen: GenRef) -> ScoreRef | None:
        return self.scores.get((key, gen.run))


def _key(row: dict[str, Any], rollout_field: str) -> RolloutKey:
    stage, iid, rollout = row.get("stage"), row.get("instance_id"), row.get(rollout_field)
    if type(stage) is not int or not isinstance(iid, str) or type(rollout) is not int:
        raise _BadRow(
            f"journal row needs an integer 'stage', a string 'instance_id' and an integer "
            f"'{rollout_field}'; delete that line or run with --evalreplay-reset"
        )
    return (stage, iid, rollout)


def _str_field(row: dict[str, Any], name: str) -> str:
    value = row.get(name)
    if not isinstance(value, str):
        raise _BadRow(f"journal row lacks a string {name!r}; delete that line")
    return value


def _judgments(judgments: Any) -> dict[str, tuple[float, ...]]:
    ok = isinstance(judgments, dict) and all(
        isinstance(v, list) and v and all(x in (0, 0.5, 1) and not isinstance(x, bool) for x in v)
        for v in judgments.values()
    )
    if not ok:
        raise _BadRow("'judgments' must map references to non-empty lists of 0, 0.5 or 1; delete that line")
    return {str(k): tuple(float(x) for x in v) for k, v in judgments.items()}


def _scores(scores: Any) -> dict[str, float]:
    if type(scores) is dict:
        for v in scores.values():  # a loop, not all(...): one generator a row is a third of this check
            if type(v) is not float or not math.isfinite(v):
                break
        else:
            return scores  # as decoded (JSON's keys are strings): the usual row, no copy
    if not isinstance(scores, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in scores.values()
    ):
        raise _BadRow("'scores' must map names to finite numbers; delete that line")
    return {str(k): float(v) for k, v in scores.items()}
