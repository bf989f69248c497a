"""The per-task journal: what `--resume` trusts.

Two append-only JSONL files per task, beside the run dir:

- `<task>-journal.jsonl`: a header (run id, fingerprint, config), then
  `request` rows (one per stage and instance) and `done` rows (one per
  scored rollout). Rows are written, flushed and fsynced per batch before any
  item of that batch reports, so a passed item is always durable.
- `<task>-failures.jsonl`: one row per failed attempt, with the attempt
  number and a failure class. Never read into metrics.

One writer at a time: every write holds a `filelock` on the journal, so
pytest-xdist workers never interleave rows. The journal is data, never code:
read with orjson and validated row by row.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from filelock import FileLock

from pytest_evalreplay.fingerprint import canonical, describe_change
from pytest_evalreplay.model import EvalReplayError, Generation, RolloutResult

FORMAT = "evalreplay-journal/1"
RolloutKey = tuple[int, str, int]  # (stage, instance_id, rollout)
RequestKey = tuple[int, str]


class TornLineWarning(UserWarning):
    """The last line of a journal was cut short by a crash and is ignored."""


@dataclass(frozen=True)
class Failure:
    attempts: int
    message: str
    failure_class: str
    final: bool


@dataclass
class JournalState:
    """What a journal holds, validated."""

    header: dict[str, Any] | None = None
    requests: dict[RequestKey, dict[str, Any]] = field(default_factory=dict)
    done: dict[RolloutKey, RolloutResult] = field(default_factory=dict)
    models: dict[RolloutKey, str | None] = field(default_factory=dict)
    failures: dict[RolloutKey, Failure] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str | None:
        return None if self.header is None else self.header.get("fingerprint")

    def attempts(self) -> dict[RequestKey, int]:
        """Failed attempts per request so far, for the attempt cap across runs."""
        out: dict[RequestKey, int] = {}
        for (stage, iid, _), failure in self.failures.items():
            if failure.failure_class in ("retryable", "terminal"):
                out[(stage, iid)] = max(out.get((stage, iid), 0), failure.attempts)
        return out

    def final_failures(self, max_attempts: int | None = None) -> dict[RolloutKey, Failure]:
        """Failed rollouts not to try again. Given this run's `max_attempts`, a
        retryable failure is final by its attempt count rather than by the cap
        it was recorded under, so raising the cap retries it."""
        return {
            k: f
            for k, f in self.failures.items()
            if k not in self.done
            and (
                f.attempts >= max_attempts
                if max_attempts is not None and f.failure_class == "retryable"
                else f.final
            )
        }


def journal_path(directory: Path, task: str) -> Path:
    return directory / f"{task}-journal.jsonl"


def failures_path(directory: Path, task: str) -> Path:
    return directory / f"{task}-failures.jsonl"


def _lock(directory: Path, task: str) -> FileLock:
    return FileLock(str(directory / f".{task}-journal.lock"))


def _lines(path: Path) -> Iterable[tuple[int, Any]]:
    """Parsed rows; a torn last line (no newline, bad JSON) is dropped with a warning."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    lines = data.split(b"\n")
    last = len(lines)
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield lineno, orjson.loads(line)
        except orjson.JSONDecodeError:
            if lineno == last:  # no newline after it: the write was cut short
                warnings.warn(
                    f"{path}:{lineno}: ignoring a torn last line (the run died mid-write)",
                    TornLineWarning,
                    stacklevel=2,
                )
                return
            raise EvalReplayError(
                f"{path}:{lineno}: malformed journal line; delete the file (or run without "
                "--resume) to start this task fresh"
            ) from None


def _need(row: Any, where: str, **types: type | tuple[type, ...]) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise EvalReplayError(f"{where}: a journal row must be a JSON object")
    for name, kind in types.items():
        if not isinstance(row.get(name), kind) or (isinstance(row.get(name), bool) and kind is int):
            raise EvalReplayError(f"{where}: journal row lacks a valid {name!r}; run without --resume")
    return row


def read(directory: Path, task: str) -> JournalState:
    """Read and validate a task's journal and failures sidecar."""
    state = JournalState()
    path = journal_path(directory, task)
    for lineno, row in _lines(path):
        where = f"{path}:{lineno}"
        kind = _need(row, where, type=str)["type"]
        if kind == "header":
            if row.get("format") != FORMAT or state.header is not None:
                what = "a second header" if state.header is not None else f"not an {FORMAT} journal"
                raise EvalReplayError(f"{where}: {what}; delete the file to start this task fresh")
            state.header = _need(row, where, fingerprint=str, config=dict)
        elif kind == "request":
            _need(row, where, stage=int, instance_id=str, request=dict)
            state.requests[(row["stage"], row["instance_id"])] = row["request"]
        elif kind == "done":
            _need(row, where, stage=int, instance_id=str, rollout=int, generation=dict, scores=dict)
            key: RolloutKey = (row["stage"], row["instance_id"], row["rollout"])
            state.done[key] = RolloutResult(
                task=task,
                stage=key[0],
                instance_id=key[1],
                rollout=key[2],
                generation=Generation.from_row(row["generation"], where),
                scores=_scores(row["scores"], where),
            )
            state.models[key] = row.get("model")
        else:
            raise EvalReplayError(f"{where}: unknown journal row type {kind!r}")
        if state.header is None:
            raise EvalReplayError(f"{where}: journal rows before its header; delete the file")
    fpath = failures_path(directory, task)
    for lineno, row in _lines(fpath):
        where = f"{fpath}:{lineno}"
        _need(
            row, where, stage=int, instance_id=str, rollouts=list, attempt=int, failure_class=str, message=str
        )
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in row["rollouts"]):
            raise EvalReplayError(f"{where}: 'rollouts' must be a list of integers; run without --resume")
        for rollout in row["rollouts"]:
            state.failures[(row["stage"], row["instance_id"], rollout)] = Failure(
                attempts=row["attempt"],
                message=row["message"],
                failure_class=row["failure_class"],
                final=bool(row.get("final")),
            )
    return state


def _scores(scores: dict[str, Any], where: str) -> dict[str, float]:
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in scores.values()):
        raise EvalReplayError(f"{where}: 'scores' must map names to numbers; run without --resume")
    return {str(k): float(v) for k, v in scores.items()}


def staleness(state: JournalState, fingerprint: str, config: Mapping[str, Any]) -> str | None:
    """Why a journal cannot be resumed from, or None when it can."""
    if state.header is None:
        return "no journal yet" if not state.done else "journal has no header"
    if state.fingerprint == fingerprint:
        return None
    old = state.header.get("config")
    return describe_change(old, config) if isinstance(old, dict) else "config changed"


def _append(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Append rows, first cutting a half-written last line (a writer died
    mid-write: an xdist worker, or an earlier run), so rows never run together."""
    blob = b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows)
    if not blob:
        return
    with path.open("a+b") as fh:
        end = fh.seek(0, os.SEEK_END)
        if end:
            fh.seek(end - 1)
            if fh.read(1) != b"\n":
                fh.seek(0)
                fh.truncate(fh.read().rfind(b"\n") + 1)
        fh.write(blob)
        fh.flush()
        os.fsync(fh.fileno())


class JournalWriter:
    """Appends one task's rows; opened by the first generation of a run.

    Opening decides, under the lock, whether to keep what the files hold
    (same run id: another xdist worker of this run; or a resume with an equal
    fingerprint) or to start them fresh.
    """

    def __init__(
        self,
        directory: Path,
        task: str,
        fingerprint: str,
        config: Mapping[str, Any],
        run_id: str,
        resume: bool,
    ) -> None:
        self.directory = directory
        self.task = task
        self.fingerprint = fingerprint
        self.config = canonical(config)
        self.run_id = run_id
        self.resume = resume
        self.opened = False
        self.fresh = False

    @property
    def path(self) -> Path:
        return journal_path(self.directory, self.task)

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        header = self._header()
        keep = header is not None and (
            header.get("run_id") == self.run_id
            or (self.resume and header.get("fingerprint") == self.fingerprint)
        )
        self.fresh = not keep
        if not keep:
            failures_path(self.directory, self.task).unlink(missing_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_bytes(orjson.dumps(self._new_header(), option=orjson.OPT_APPEND_NEWLINE))
            os.replace(tmp, self.path)
        self.opened = True

    def _header(self) -> dict[str, Any] | None:
        try:
            with self.path.open("rb") as fh:
                first = fh.readline()
            row = orjson.loads(first)
        except (FileNotFoundError, orjson.JSONDecodeError):
            return None
        return row if isinstance(row, dict) and row.get("type") == "header" else None

    def _new_header(self) -> dict[str, Any]:
        return {
            "type": "header",
            "format": FORMAT,
            "task": self.task,
            "run_id": self.run_id,
            "fingerprint": self.fingerprint,
            "config": self.config,
        }

    def write(
        self,
        done: Iterable[Mapping[str, Any]] = (),
        failures: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        """Append a batch's rows durably (flush + fsync) under the lock."""
        with _lock(self.directory, self.task):
            if not self.opened:
                self._open()
            _append(self.path, done)
            _append(failures_path(self.directory, self.task), failures)

    def open(self) -> None:
        """Open now, before the first generation, so a bare run clears a stale
        journal even if it dies before its first row (`fresh` says which way)."""
        with _lock(self.directory, self.task):
            if not self.opened:
                self._open()


def request_row(stage: int, instance_id: str, request: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "request", "stage": stage, "instance_id": instance_id, "request": request}


def done_row(result: RolloutResult, model: str | None) -> dict[str, Any]:
    assert result.generation is not None
    return {
        "type": "done",
        "stage": result.stage,
        "instance_id": result.instance_id,
        "rollout": result.rollout,
        "model": model,
        "generation": result.generation.to_row(),
        "scores": dict(result.scores),
    }


def failure_row(
    stage: int,
    instance_id: str,
    rollouts: Iterable[int],
    attempt: int,
    failure_class: str,
    message: str,
    final: bool,
    run_id: str,
) -> dict[str, Any]:
    return {
        "stage": stage,
        "instance_id": instance_id,
        "rollouts": list(rollouts),
        "attempt": attempt,
        "failure_class": failure_class,
        "message": message,
        "final": final,
        "run_id": run_id,
    }
