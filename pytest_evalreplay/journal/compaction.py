"""Dropping a journal's superseded rows, as a stream.

A plain run (no `--resume`) regenerates what it selected and appends it
after the older answers, so without a compaction every repeated run would
grow the journal by a run's worth. What a later `--resume` can use is, per
item, the newest generation (and failure) of each request and provider, the
newest scores of those generations, the request and provider rows they name,
the stage records still in force and the compacting run's `done` rows; the
rest is superseded.

Which lines stay is read off the `JournalIndex` the session already holds
(it records where every row it read or wrote is), so nothing is decoded a
second time; the file is then copied line by line into a new one, renamed
over the old (the caller holds the task lock). Memory stays that of the
index plus one line, whatever the journal's size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_evalreplay.journal import rows as journal
from pytest_evalreplay.journal.index import JournalIndex
from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.storage.files import atomic_write, os_error

_READ_BUFFER = 1 << 20


@dataclass(frozen=True)
class Kept:
    """The rows a compaction keeps: by line number, and request rows by
    their byte offset (the index records a request row's place so)."""

    lines: frozenset[int]
    offsets: frozenset[int]
    dropped: int  # superseded generations and failures


def superseded(index: JournalIndex, run: str | None = None) -> int:
    """How many generations and failures a newer one of the same item,
    request and provider supersedes: what a compaction drops. With `run`,
    that run's own rows are left out (a run about to write compacts what
    earlier runs left, so once it has written its xdist peers find nothing)."""
    n = 0
    for refs in (*index.gens.values(), *index.fails.values()):
        cells = [(r.request, r.provider) for r in refs if r.run != run]
        n += len(cells) - len(set(cells))
    return n


def kept(index: JournalIndex, run: str) -> Kept:
    """What a compaction by `run` keeps: per item, the newest generation and
    the newest failure of each request and provider (and every failure of
    `run` itself); the newest scores of each kept generation; the first
    request and provider row of each digest they name; the first seed
    record, each stage's newest plan and the newest matching `complete`
    after it; the `done` rows of `run` (another run's say nothing now). The
    order of the file is kept, so every newest-wins rule of `JournalIndex`
    and `StageLog` reads the same."""
    lines: set[int] = set()
    requests: set[str] = set()
    providers: set[str] = set()
    dropped = 0
    for key, gens in index.gens.items():
        newest = {(g.request, g.provider): g for g in gens}
        dropped += len(gens) - len(newest)
        runs = set()
        for g in newest.values():
            lines.add(g.lineno)
            runs.add(g.run)
            requests.add(g.request)
            providers.add(g.provider)
        for run_of in runs:
            score = index.scores.get((key, run_of))
            if score is not None:
                lines.add(score.lineno)
    for fails in index.fails.values():
        newest_fail = {(f.request, f.provider): f for f in fails}
        # The compacting run's own attempts all stay (at most the attempt cap a
        # cell): the record of what failed, and how, in the run just made.
        stay = {id(f): f for f in (*newest_fail.values(), *(f for f in fails if f.run == run))}
        dropped += len(fails) - len(stay)
        for f in stay.values():
            lines.add(f.lineno)
            requests.add(f.request)
            providers.add(f.provider)
    lines.update(index.provider_lines[pv] for pv in providers if pv in index.provider_lines)
    lines.update(_stage_lines(index.stage_rows))
    lines.update(line for (_, of), line in index.done_lines.items() if of == run)
    offsets = frozenset(at[0] for rq in requests if (at := index.request_at(rq)) is not None)
    return Kept(frozenset(lines), offsets, dropped)


def _stage_lines(stage_rows: Sequence[tuple[int, dict[str, Any]]]) -> list[int]:
    seed: int | None = None
    planned: dict[Any, tuple[int, Any]] = {}  # stage -> (line, fingerprint)
    complete: dict[Any, int] = {}
    for line, row in stage_rows:
        kind, stage = row.get("kind"), row.get("stage")
        if kind == "seed" and seed is None:
            seed = line
        elif kind == "planned":
            planned[stage] = (line, row.get("fingerprint"))
            complete.pop(stage, None)
        elif kind == "complete" and stage in planned and planned[stage][1] == row.get("fingerprint"):
            complete[stage] = line
    return [i for i in (seed, *(i for i, _ in planned.values()), *complete.values()) if i is not None]


def compact(index: JournalIndex, run: str, keep: Kept | None = None) -> None:
    """Rewrite the journal `index` has read to its end (the caller holds the
    task lock and has refreshed it) keeping `keep` (default `kept(index,
    run)`) under a header naming `run`, streamed line by line; a torn last
    line goes too. The index is reset afterwards: its positions were the old
    file's."""
    keep = kept(index, run) if keep is None else keep
    path, end = index.path, index.offset
    header = journal.encode([journal.header_row(index.task, run)])
    try:
        source = path.open("rb", buffering=_READ_BUFFER)
    except OSError as exc:
        raise os_error(path, exc, "read the journal") from None
    with source:
        atomic_write(path, _stream(source, path, end, keep, header))
    index.reset()


def _stream(source: Any, path: Path, end: int, keep: Kept, header: bytes) -> Iterator[bytes]:
    yield header
    offset = lineno = 0
    lines, offsets = keep.lines, keep.offsets
    try:
        for line in source if end else ():
            lineno += 1
            if lineno in lines or offset in offsets:
                yield line
            offset += len(line)
            if offset >= end:
                break
    except OSError as exc:
        raise os_error(path, exc, "read the journal") from None
    if offset != end:
        raise EvalReplayError(
            f"{path}: the journal changed while it was compacted (it ended at byte {offset}, "
            f"not {end}); another process wrote it without the task lock: run again with --resume"
        )


def compact_journal(path: Path, task: str, run: str) -> None:
    """Read the journal at `path` and compact it (the caller holds the task lock)."""
    index = JournalIndex(path, task)
    index.refresh()
    compact(index, run)
