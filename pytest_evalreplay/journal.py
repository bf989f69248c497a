"""The per-task journal: the one durable log that `--resume` trusts and the
run dir is written from.

`<task>-journal.jsonl` in the output dir, append-only, one JSON object per
line (orjson), each row typed:

- `header`: `format`, `task`, `run` (the run that started the file).
- `provider`: a provider identity (`kind`, `model`, ...) and its digest.
- `request`: a request's content (context, system prompt, request type,
  sampling, images, tools) and its digest. Written once per distinct content.
- `gen`: one generated rollout: `stage`, `instance_id`, `rollout`, the
  digests of the `request` it answered and the `provider` that made it, the
  `run`, and the `generation`.
- `score`: the scores (or the scoring error) of one rollout's generation,
  named by the run that generated it (`of`); the latest row for a
  generation wins. Written only when the scores are new or changed.
- `fail`: one failed attempt (`model.Failure`), with request, provider, run.
- `stage`: multi-stage records (`planned`, `complete`), see `stages.py`.

Reuse is decided by content: a rollout's `gen` row is reused when its request
digest and provider digest equal those of the request rendered now. Writers
append rows with one write(2) each (`append_durably`: in the OS at once, so a
killed process loses nothing it wrote; fsynced in groups within
`files.SYNC_SECONDS`) under a per-task file lock, so pytest-xdist workers
never interleave rows. Reading is incremental (from a byte offset), keeps
only compact references (positions of rows, not their text), and validates
every row: a malformed line names file and line; a torn last line (a crash
mid-write) is skipped and reported. A journal rewritten under a reader (a
reset, a compaction) is a new file, and the reader starts over.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.files import AppendFile, NoFollowLock, ReadFile, atomic_write, os_error
from pytest_evalreplay.model import EvalReplayError, Failure, Generation

FORMAT = "evalreplay-journal/2"
RolloutKey = tuple[int, str, int]  # (stage, instance_id, rollout)


def journal_path(directory: Path, task: str) -> Path:
    return directory / f"{task}-journal.jsonl"


def task_lock(directory: Path, task: str) -> NoFollowLock:
    """The lock every writer of a task's journal (and its run dir files) holds (never through a link)."""
    return NoFollowLock(directory / f".{task}.lock")


@dataclass(frozen=True, slots=True)
class GenRef:
    """Where a `gen` row is, and what it answered (its text stays on disk)."""

    request: str
    provider: str
    run: str
    offset: int
    length: int
    lineno: int
    seq: int  # row number in the file, to order events of one key
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ScoreRef:
    """The latest scores (or scoring error) of one generation. For an ELO
    item, `scores` holds its mean verdict per reference, `judgments` each
    judgment (one per judge trial) and `no_answer` the references that had
    no saved answer to judge against."""

    scores: Mapping[str, float] | None
    error: str | None
    run: str
    lineno: int
    judgments: Mapping[str, tuple[float, ...]] | None = None
    no_answer: tuple[str, ...] = ()
    unreadable: int = 0  # judge replies that could not be read


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
    gens: dict[RolloutKey, list[GenRef]] = field(default_factory=dict)
    scores: dict[tuple[RolloutKey, str], ScoreRef] = field(default_factory=dict)
    fails: dict[RolloutKey, list[FailRef]] = field(default_factory=dict)
    requests: dict[str, tuple[int, int]] = field(default_factory=dict)  # digest -> (offset, length)
    providers: dict[str, dict[str, Any]] = field(default_factory=dict)
    stage_rows: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (lineno, row)
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
        self._parse(data)

    def _parse(self, data: bytes) -> None:
        base = self.offset
        pos = 0
        n = len(data)
        loads = orjson.loads
        while pos < n:
            nl = data.find(b"\n", pos)
            if nl < 0:  # no newline yet: torn (a crash) or being written; read again later
                if data[pos:].strip():
                    self.torn = self.lineno + 1
                return
            line = data[pos:nl]
            start = base + pos
            pos = nl + 1
            self.lineno += 1
            if line.strip():
                where = f"{self.path}:{self.lineno}"
                try:
                    row = loads(line)
                except orjson.JSONDecodeError as exc:
                    self.lineno -= 1
                    raise EvalReplayError(
                        f"{where}: malformed journal line ({exc}); delete that line, or run with "
                        "--evalreplay-reset to discard this task's saved results"
                    ) from None
                try:
                    self._apply(row, where, start, len(line))
                except EvalReplayError:
                    self.lineno -= 1
                    raise
            self.offset = base + pos
            self.torn = None

    def _apply(self, row: Any, where: str, offset: int, length: int) -> None:
        if not isinstance(row, dict) or not isinstance(row.get("type"), str):
            raise EvalReplayError(f"{where}: a journal row must be a JSON object with a 'type'")
        kind = row["type"]
        self.rows += 1
        if kind == "header":
            if self.header is not None:
                raise EvalReplayError(f"{where}: a second journal header; run with --evalreplay-reset")
            if row.get("format") != FORMAT:
                raise EvalReplayError(
                    f"{where}: a journal of another format ({row.get('format')!r}, this version reads "
                    f"{FORMAT!r}); delete it, or run with --evalreplay-reset to discard it"
                )
            self.header = row
            return
        if self.header is None:
            raise EvalReplayError(
                f"{where}: journal rows before its header; delete the file or run with --evalreplay-reset"
            )
        seq = self.rows
        if kind == "gen":
            key = self._one(_key(row, where, "rollout"))
            generation = row.get("generation")
            if not isinstance(generation, dict) or not isinstance(generation.get("text"), str):
                raise EvalReplayError(f"{where}: a gen row needs a 'generation' object with a 'text'")
            ptok, ctok = generation.get("prompt_tokens"), generation.get("completion_tokens")
            self.gens.setdefault(key, []).append(
                GenRef(
                    request=self._one(_str_field(row, "request", where)),
                    provider=self._one(_str_field(row, "provider", where)),
                    run=self._one(_str_field(row, "run", where)),
                    offset=offset,
                    length=length,
                    lineno=self.lineno,
                    seq=seq,
                    prompt_tokens=ptok if type(ptok) is int else None,
                    completion_tokens=ctok if type(ctok) is int else None,
                )
            )
        elif kind == "score":
            key = self._one(_key(row, where, "rollout"))
            of = _str_field(row, "of", where)
            scores = row.get("scores")
            error = row.get("error")
            if scores is not None:
                scores = _scores(scores, where)
                scores = self._shared.setdefault(("scores", *scores.items()), scores)
            elif not isinstance(error, str):
                raise EvalReplayError(f"{where}: a score row needs 'scores' or an 'error'")
            judgments = row.get("judgments")
            if judgments is not None:
                judgments = _judgments(judgments, where)
            no_answer = row.get("no_answer", [])
            if not isinstance(no_answer, list) or not all(isinstance(r, str) for r in no_answer):
                raise EvalReplayError(f"{where}: 'no_answer' must list reference names; delete that line")
            unreadable = row.get("unreadable", 0)
            if type(unreadable) is not int or unreadable < 0:
                raise EvalReplayError(
                    f"{where}: 'unreadable' must be a count (an int >= 0); delete that line"
                )
            run = self._one(_str_field(row, "run", where))
            self.scores[(key, of)] = ScoreRef(
                scores, error, run, self.lineno, judgments, tuple(no_answer), unreadable
            )
        elif kind == "fail":
            failure = Failure.from_row(row, where)
            ref = FailRef(
                failure,
                self._one(_str_field(row, "request", where)),
                self._one(_str_field(row, "provider", where)),
                self._one(_str_field(row, "run", where)),
                self.lineno,
                seq,
            )
            for rollout in failure.rollouts:
                self.fails.setdefault((failure.stage, failure.instance_id, rollout), []).append(ref)
        elif kind == "request":
            rq = _str_field(row, "digest", where)
            if not isinstance(row.get("request"), dict):
                raise EvalReplayError(f"{where}: a request row needs a 'request' object")
            self.requests.setdefault(self._one(rq), (offset, length))
        elif kind == "provider":
            pv = _str_field(row, "digest", where)
            if not isinstance(row.get("provider"), dict):
                raise EvalReplayError(f"{where}: a provider row needs a 'provider' object")
            self.providers.setdefault(pv, row["provider"])
        elif kind == "stage":
            self.stage_rows.append((self.lineno, row))
        else:
            raise EvalReplayError(f"{where}: unknown journal row type {kind!r}")

    # -- reading rows back ---------------------------------------------------

    def read_row(self, offset: int, length: int) -> dict[str, Any]:
        """The row at a position this index recorded (a `gen` or `request` row)."""
        try:  # one descriptor kept open (a run dir reads back every generation), reopened for a new file
            if self._reader is None or self._reader[1] != self.file_id:
                self._reader = (ReadFile(self.path), self.file_id)
            line = self._reader[0].read(offset, length)
        except OSError as exc:
            raise os_error(self.path, exc, "read the journal") from None
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            row = None
        if not isinstance(row, dict):
            raise EvalReplayError(
                f"{self.path}: the journal changed under this session (a row moved); "
                "another process rewrote it: run again with --resume"
            )
        return row

    def generation(self, ref: GenRef) -> Generation:
        row = self.read_row(ref.offset, ref.length)
        return Generation.from_row(row.get("generation"), f"{self.path}:{ref.lineno}")

    def request(self, rq: str) -> dict[str, Any] | None:
        at = self.requests.get(rq)
        return None if at is None else self.read_row(*at)["request"]

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


def _key(row: dict[str, Any], where: str, rollout_field: str) -> RolloutKey:
    stage, iid, rollout = row.get("stage"), row.get("instance_id"), row.get(rollout_field)
    if type(stage) is not int or not isinstance(iid, str) or type(rollout) is not int:
        raise EvalReplayError(
            f"{where}: journal row needs an integer 'stage', a string 'instance_id' and an integer "
            f"'{rollout_field}'; delete that line or run with --evalreplay-reset"
        )
    return (stage, iid, rollout)


def _str_field(row: dict[str, Any], name: str, where: str) -> str:
    value = row.get(name)
    if not isinstance(value, str):
        raise EvalReplayError(f"{where}: journal row lacks a string {name!r}; delete that line")
    return value


def _judgments(judgments: Any, where: str) -> dict[str, tuple[float, ...]]:
    ok = isinstance(judgments, dict) and all(
        isinstance(v, list) and all(x in (0, 0.5, 1) and not isinstance(x, bool) for x in v)
        for v in judgments.values()
    )
    if not ok:
        raise EvalReplayError(
            f"{where}: 'judgments' must map references to lists of 0, 0.5 or 1; delete that line"
        )
    return {str(k): tuple(float(x) for x in v) for k, v in judgments.items()}


def _scores(scores: Any, where: str) -> dict[str, float]:
    if not isinstance(scores, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in scores.values()
    ):
        raise EvalReplayError(f"{where}: 'scores' must map names to finite numbers; delete that line")
    return {str(k): float(v) for k, v in scores.items()}


# -- writing ---------------------------------------------------------------------


def header_row(task: str, run: str) -> dict[str, Any]:
    return {"type": "header", "format": FORMAT, "task": task, "run": run}


def request_row(rq: str, request: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "request", "digest": rq, "request": dict(request)}


def provider_row(pv: str, provider: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "provider", "digest": pv, "provider": dict(provider)}


def gen_row(key: RolloutKey, rq: str, pv: str, run: str, generation: Generation) -> dict[str, Any]:
    return {
        "type": "gen",
        "stage": key[0],
        "instance_id": key[1],
        "rollout": key[2],
        "request": rq,
        "provider": pv,
        "run": run,
        "generation": generation.to_row(),
    }


def score_row(
    key: RolloutKey,
    of: str,
    run: str,
    scores: Mapping[str, float] | None,
    error: str | None,
    judgments: Mapping[str, Sequence[float]] | None = None,
    no_answer: Sequence[str] = (),
    unreadable: int = 0,
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "type": "score",
        "stage": key[0],
        "instance_id": key[1],
        "rollout": key[2],
        "of": of,
        "run": run,
    }
    if error is None:
        row["scores"] = dict(scores or {})
    else:
        row["error"] = error
    if judgments is not None:
        row["judgments"] = {k: list(v) for k, v in judgments.items()}
    if no_answer:
        row["no_answer"] = list(no_answer)
    if unreadable:
        row["unreadable"] = unreadable
    return row


def fail_row(failure: Failure, rq: str, pv: str, run: str) -> dict[str, Any]:
    return {"type": "fail", **failure.to_row(), "request": rq, "provider": pv, "run": run}


def encode(rows: Iterable[Mapping[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows)


_OPEN: dict[Path, AppendFile] = {}  # the journals this process writes, each kept open


def append_durably(path: Path, blob: bytes) -> None:
    """Append encoded rows (the caller holds the task lock): one write(2) to a
    file kept open, so a killed process loses none of them once this returns;
    fsynced (power loss) within `files.SYNC_SECONDS`, or at `sync`."""
    file = _OPEN.get(path)
    if file is None:
        file = _OPEN[path] = AppendFile(path)
    file.write(blob)


def sync(path: Path) -> None:
    """fsync what this process appended to a journal and has not synced yet."""
    if (file := _OPEN.get(path)) is not None:
        file.sync()


def append(directory: Path, task: str, rows: Iterable[Mapping[str, Any]]) -> None:
    """Append rows and fsync them. The caller holds the task lock."""
    path = journal_path(directory, task)
    append_durably(path, encode(rows))
    sync(path)


def start_fresh(directory: Path, task: str, run: str) -> None:
    """Replace the journal by one holding only a header (the caller holds the lock)."""
    atomic_write(journal_path(directory, task), encode([header_row(task, run)]))


def ensure_header(directory: Path, task: str, run: str) -> None:
    """Give a missing or empty journal its header (the caller holds the lock)."""
    path = journal_path(directory, task)
    try:
        empty = path.stat().st_size == 0
    except FileNotFoundError:
        empty = True
    except OSError as exc:
        raise os_error(path, exc, "read the journal") from None
    if empty:
        start_fresh(directory, task, run)
