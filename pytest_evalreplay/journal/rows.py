"""The per-task journal: the one durable log that `--resume` trusts and the
run dir is written from.

`<task>-journal.jsonl` in the output dir, append-only, one JSON object per
line (orjson), each row typed:

- `header`: `format`, `task`, `run` (the run that started the file).
- `provider`: a provider identity (`kind`, `model`, ...) and its digest.
- `request`: a request's content (context, system prompt, request type,
  sampling, images, tools) and its digest. Written once per distinct content.
  An agent turn's holds what the turn added (`after`, `added`: agents.md);
  its digest is still over the whole request.
- `gen`: one generated rollout: `stage`, `instance_id`, `rollout`, the
  digests of the `request` it answered and the `provider` that made it, the
  `run`, and the `generation`.
- `score`: the scores (or the scoring error) of one rollout's generation,
  named by the run that generated it (`of`); the latest row for a
  generation wins. Written only when the scores are new or changed. An ELO
  item's holds its verdicts once, as `judgments` (each trial's, per
  reference); its scores (the mean per reference) are read from them. An
  LLM judge's journal holds its raw replies, not these verdicts.
- `fail`: one failed attempt (`Failure`, below), with request, provider, run.
- `stage`: multi-stage records (`planned`, `complete`), see `stages.py`.
- `done`: a process of `run` finished `unit` (an ELO stage, `stage-<s>`)
  that may have left nothing else new in the journal; run-scoped, so a
  compaction keeps only the compacting run's.

Reuse is decided by content: a rollout's `gen` row is reused when its request
digest and provider digest equal those of the request rendered now. Writers
append rows with one write(2) each (`append_durably`: in the OS at once, so a
killed process loses nothing it wrote; fsynced in groups within
`files.SYNC_SECONDS`) under a per-task file lock, so pytest-xdist workers
never interleave rows. Reading (`journalindex.py`) is incremental (from a
byte offset), keeps only compact references (positions of rows, not their
text), and validates every row: a malformed line names file and line; a torn last line (a crash
mid-write) is skipped and reported. A journal rewritten under a reader (a
reset, a compaction) is a new file, and the reader starts over.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.model import EvalReplayError, Generation
from pytest_evalreplay.storage.files import AppendFile, NoFollowLock, atomic_write, os_error

FORMAT = "evalreplay-journal/2"
RolloutKey = tuple[int, str, int]  # (stage, instance_id, rollout)

FAILURE_CLASSES = ("retryable", "terminal", "scoring", "judging")


@dataclass(frozen=True)
class Failure:
    """One failed attempt at some rollouts of one request: what the journal
    records, what the attempt cap counts, and what a failed item reports.

    `failure_class`: `retryable` (tried again up to the attempt cap),
    `terminal` (final at once), `scoring` (the scorer raised or returned a
    non-finite value), `judging` (a pairwise judge failed). `final` says
    whether this attempt was the last under the cap of the run that made it.
    """

    stage: int
    instance_id: str
    rollouts: tuple[int, ...]
    attempt: int
    failure_class: str
    message: str
    final: bool

    def to_row(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "instance_id": self.instance_id,
            "rollouts": list(self.rollouts),
            "attempt": self.attempt,
            "failure_class": self.failure_class,
            "message": self.message,
            "final": self.final,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any], where: str) -> Failure:
        """Build from a saved row; `where` ("file:line") names it in errors."""
        rollouts = row.get("rollouts")
        attempt = row.get("attempt")
        ok = (
            type(row.get("stage")) is int
            and isinstance(row.get("instance_id"), str)
            and isinstance(rollouts, list)
            and all(type(r) is int and r >= 0 for r in rollouts)
            and type(attempt) is int
            and attempt >= 1
            and row.get("failure_class") in FAILURE_CLASSES
            and isinstance(row.get("message"), str)
            and isinstance(row.get("final"), bool)
        )
        if not ok:
            raise EvalReplayError(
                f"{where}: not a valid failure row (needs stage, instance_id, rollouts of non-negative "
                f"integers, attempt >= 1, failure_class one of {', '.join(FAILURE_CLASSES)}, message, final)"
            )
        return cls(
            stage=row["stage"],
            instance_id=row["instance_id"],
            rollouts=tuple(rollouts),  # type: ignore[arg-type]
            attempt=attempt,  # type: ignore[arg-type]
            failure_class=row["failure_class"],
            message=row["message"],
            final=row["final"],
        )


def journal_path(directory: Path, task: str) -> Path:
    return directory / f"{task}-journal.jsonl"


def task_lock(directory: Path, task: str) -> NoFollowLock:
    """The lock every writer of a task's journal (and its run dir files) holds (never through a link)."""
    return NoFollowLock(directory / f".{task}.lock")


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
    if error is not None:
        row["error"] = error
    elif judgments is None:
        row["scores"] = dict(scores or {})  # else read from the judgments, each verdict recorded once
    if judgments is not None:
        row["judgments"] = {k: list(v) for k, v in judgments.items()}
    if no_answer:
        row["no_answer"] = list(no_answer)
    if unreadable:
        row["unreadable"] = unreadable
    return row


def done_row(unit: str, run: str) -> dict[str, Any]:
    return {"type": "done", "unit": unit, "run": run}


def fail_row(failure: Failure, rq: str, pv: str, run: str) -> dict[str, Any]:
    return {"type": "fail", **failure.to_row(), "request": rq, "provider": pv, "run": run}


def encoded_lines(rows: Iterable[Mapping[str, Any]]) -> list[bytes]:
    return [orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows]


def encode(rows: Iterable[Mapping[str, Any]]) -> bytes:
    return b"".join(encoded_lines(rows))


_OPEN: dict[Path, AppendFile] = {}  # the journals this process writes, each kept open


def append_durably(path: Path, blob: bytes) -> tuple[int, tuple[int, int] | None]:
    """Append encoded rows (the caller holds the task lock): one write(2) to a
    file kept open, so a killed process loses none of them once this returns;
    fsynced (power loss) within `files.SYNC_SECONDS`, or at `sync`. Returns
    where they start and which file (st_dev, st_ino) they went to."""
    file = _OPEN.get(path)
    if file is None:
        file = _OPEN[path] = AppendFile(path)
    return file.write(blob)


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
