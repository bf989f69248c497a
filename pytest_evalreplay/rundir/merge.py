"""Joining shard dirs into one output dir: pure logic over their markers and
journal bytes (`sharddir.py` reads and writes the files).

Each journal of the merged dir holds the rows of every shard's journal of
that name, once: shards are taken in shard order and each one's rows in its
file order, so every newest-wins rule of `JournalIndex` and `StageLog` reads
as it did in the shard that wrote the rows (a rollout's rows come from the
one shard that owns it; rows a shard copied from an earlier merge appear
once). Stage records are compared without the run that wrote them: every
shard of an ELO stage plans it from the same merged journal, so their plans
are one. The output depends only on the inputs, never on the order the dirs
are given in, so merging twice writes the same bytes.

Refused, naming the dirs: a dir given twice, two dirs of one shard, shards
of different counts or configurations (a task's requests, provider, model
or stages), and two shards holding different results for one rollout (or
different plans for one stage). Missing shards are reported here (the
merge command refuses them unless `--allow-missing`): their rollouts are
missing from the merged dir, which `pytest --resume` finishes.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from pytest_evalreplay.journal.rows import FORMAT, header_row
from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.storage.lines import check_line_lengths

CONFIG_FIELDS = {
    "requests": "requests (prompts as rendered, sampling)",
    "items": "number of items",
    "kind": "provider kind",
    "model": "model",
    "provider": "provider configuration",
    "stages": "ELO stage configuration (seed, references, judge, stages)",
    "rundir": "run dir configuration (instance order, strip_reasoning, pass@k, gate)",
}


@dataclass(frozen=True)
class ShardDir:
    """One input: its path as given, its marker, its journals (file name ->
    bytes; read from disk when taken, for a shard dir: `sharddir.JournalFiles`)."""

    label: str
    marker: Mapping[str, Any]
    journals: Mapping[str, bytes]

    @property
    def shard(self) -> tuple[int, int]:
        k, _, n = str(self.marker["shard"]).partition("/")
        return int(k), int(n)


@dataclass
class Merged:
    journals: MergedJournals
    shards: list[str]  # "K/N" of each merged shard, in order
    of: int
    missing: list[int]  # shard numbers not given
    tasks: dict[str, Any]  # each task's configuration
    notes: list[str] = field(default_factory=list)
    # each shard's dir (as given) -> its "K/N" and the suite its marker records:
    # the merge compares them with the suite it runs, never runs one of them
    suites: dict[str, tuple[str, Any]] = field(default_factory=dict)
    markers: list[Mapping[str, Any]] = field(default_factory=list)  # in shard order


def merge(dirs: Sequence[ShardDir]) -> Merged:
    if not dirs:
        raise EvalReplayError("merge needs at least one shard dir")
    for d in dirs:
        if "shard" not in d.marker:
            raise EvalReplayError(
                f"{d.label} is a merged dir, not a shard: merge the shard dirs it was made from "
                "with the others (or seed the next stage's shards with a copy of it)"
            )
    counts = {d.shard[1] for d in dirs}
    if len(counts) > 1:
        shown = ", ".join(f"{d.label} ({d.marker['shard']})" for d in dirs)
        raise EvalReplayError(
            f"these dirs are shards of different splits: {shown}; merge shards of one K/N run"
        )
    ordered = sorted(dirs, key=lambda d: (d.shard[0], d.label))
    for a, b in itertools.pairwise(ordered):
        if a.shard == b.shard:
            raise EvalReplayError(
                f"shard {a.marker['shard']} is given twice: {a.label} and {b.label} (a shard written "
                "twice); pass the one that holds the shard's run"
            )
    tasks = _check_configs(ordered)
    notes: list[str] = []
    names = sorted({name for d in ordered for name in d.journals})
    # Each shard's journal is taken (read, where `journals` reads files) as its turn comes.
    journals = MergedJournals({name: merge_journal(name, _takes(ordered, name), notes) for name in names})
    n = counts.pop()
    given = {d.shard[0] for d in ordered}
    return Merged(
        journals=journals,
        shards=[str(d.marker["shard"]) for d in ordered],
        of=n,
        missing=[k for k in range(1, n + 1) if k not in given],
        tasks=tasks,
        notes=notes,
        suites={d.label: (str(d.marker["shard"]), d.marker.get("suite")) for d in ordered},
        markers=[d.marker for d in ordered],
    )


def _takes(dirs: Sequence[ShardDir], name: str) -> Iterator[tuple[str, Take]]:
    for d in dirs:
        if name in d.journals:
            yield d.label, functools.partial(d.journals.__getitem__, name)


def _check_configs(dirs: Sequence[ShardDir]) -> dict[str, Any]:
    """Every task's configuration, equal in every shard that ran it."""
    seen: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for d in dirs:
        for task, config in d.marker["tasks"].items():
            first = seen.setdefault(task, (d.label, config))
            if first[1] == config:
                continue
            what = next((f for f in CONFIG_FIELDS if first[1].get(f) != config.get(f)), "requests")
            a, b = first[1].get(what), config.get(what)
            shown = f"{a!r} vs {b!r}" if what in ("kind", "model", "items") else "they differ"
            raise EvalReplayError(
                f"{first[0]} and {d.label} are shards of different configurations: task {task!r}'s "
                f"{CONFIG_FIELDS[what]} ({shown}); merge only shards of one run configuration (run the "
                "odd shard again with the others' suite, options and provider)"
            )
    return {task: config for task, (_, config) in sorted(seen.items())}


def _without_run(row: Mapping[str, Any]) -> bytes:
    return orjson.dumps({k: v for k, v in row.items() if k != "run"}, option=orjson.OPT_SORT_KEYS)


def _rows(label: str, name: str, data: bytes, notes: list[str]) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """A journal's rows after its header, one at a time, each with where its
    line (newline included) starts and ends in `data`: the caller keeps
    positions, not lines (a torn last line, from a killed shard, is left out)."""
    check_line_lengths(f"{label}/{name}", data)
    last = data.rfind(b"\n") + 1
    if data[last:].strip():
        torn = data.count(b"\n", 0, last) + 1
        notes.append(f"{label}/{name}:{torn}: left out a torn last line (a shard killed mid-write)")
    pos, lineno, loads = 0, 0, orjson.loads
    while pos < last:
        end = data.index(b"\n", pos) + 1
        start, pos, lineno = pos, end, lineno + 1
        line = data[start : end - 1]
        if not line.strip():
            continue
        try:
            row = loads(line)
        except orjson.JSONDecodeError as exc:
            row = exc
        if not isinstance(row, dict) or not isinstance(row.get("type"), str):
            raise EvalReplayError(
                f"{label}/{name}:{lineno}: not a journal row; repair that shard (pytest --resume into it "
                "reports what is wrong) before merging"
            )
        if row["type"] == "header":
            if row.get("format") != FORMAT:
                raise EvalReplayError(
                    f"{label}/{name}:{lineno}: a journal of another format ({row.get('format')!r}, this "
                    f"version merges {FORMAT!r}); run that shard again with this version"
                )
            continue
        yield start, end, row


def _digest(data: bytes) -> bytes:
    """What the merge keeps of a row's identity or subject: 16 bytes of
    BLAKE2b (a collision is as likely as two equal random 128-bit numbers),
    not the row itself, which was most of the merge's memory."""
    return hashlib.blake2b(data, digest_size=16).digest()


def _identity(row: Mapping[str, Any], line: bytes) -> bytes:
    """What makes two rows the same row: a request or provider row its digest;
    a stage record its content less its run; any other row its bytes (its
    line, newline included)."""
    kind = row["type"]
    if kind in ("request", "provider"):
        return _digest(orjson.dumps([kind, row.get("digest")]))
    if kind == "stage":
        return _digest(b"s" + _without_run(row))
    return _digest(b"l" + line)


def _subject(row: Mapping[str, Any]) -> Any:
    """What a row decides (newest wins), to find two shards deciding it differently."""
    kind = row["type"]
    key = (row.get("stage"), row.get("instance_id"), row.get("rollout"))
    if kind == "gen":
        return ("a generation of", key, row.get("request"), row.get("provider"))
    if kind == "score":
        return ("the scores of", key, row.get("of"))
    if kind == "stage" and row.get("kind") in ("planned", "complete"):
        return (f"the {row['kind']} record of stage", row.get("stage"))
    return None


Starts = int | list[int]  # where a subject's lines start in its shard's journal: one, or several


def _as_list(starts: Starts) -> list[int]:
    return [starts] if isinstance(starts, int) else starts


# A subject's one line, at `start` in the journal of the shard at `place`, as
# one int: `start << _PLACE_BITS | place`.
_PLACE_BITS = 32
_PLACE = (1 << _PLACE_BITS) - 1


def _canonical(data: bytes, starts: Starts) -> tuple[bytes, set[bytes]]:
    """A subject's rows (their lines start at `starts` in `data`) as compared
    across shards (less their run): the newest, and all."""
    every = [_without_run(orjson.loads(data[s : data.index(b"\n", s)])) for s in _as_list(starts)]
    return every[-1], set(every)


Take = Callable[[], bytes]  # a shard's journal, read (again) when called


@dataclass(frozen=True)
class MergedJournal:
    """One merged journal as the merge decided it, without holding its rows:
    its header, then the lines kept, as byte ranges of each shard's journal
    in shard order (each journal read again when written, a shard at a
    time). `digest` is the kept lines' BLAKE2b, the header's run: what is
    written is checked against it, so a shard journal that changed since it
    was merged is refused, never written half old, half new."""

    name: str
    header: bytes
    parts: tuple[tuple[str, Take, tuple[tuple[int, int], ...]], ...]
    digest: bytes

    def chunks(self) -> Iterator[bytes | memoryview]:
        """The journal's bytes, in pieces (for `files.atomic_write`)."""
        yield self.header
        check = hashlib.blake2b(digest_size=16)
        for _, take, spans in self.parts:
            view = memoryview(take())
            for start, end in spans:
                check.update(view[start:end])
                yield view[start:end]
        if check.digest() != self.digest:
            labels = ", ".join(f"{label}/{self.name}" for label, _, _ in self.parts)
            raise EvalReplayError(
                f"a shard journal changed while it was merged (one of {labels}): is a shard still "
                "running? Merge again, into a new dir, once every shard has finished"
            )


class MergedJournals(Mapping[str, bytes]):
    """The merged journals by file name; each one's bytes made when taken."""

    def __init__(self, journals: Mapping[str, MergedJournal]) -> None:
        self.of = dict(journals)

    def __getitem__(self, name: str) -> bytes:
        return b"".join(self.of[name].chunks())

    def __iter__(self) -> Iterator[str]:
        return iter(self.of)

    def __len__(self) -> int:
        return len(self.of)


def merge_journal(name: str, parts: Iterable[tuple[str, Take]], notes: list[str]) -> MergedJournal:
    """One journal from the same-named journals of several shards (in shard
    order), each taken (read) once here and once more when written."""
    seen: set[bytes] = set()
    taken: list[tuple[str, Take, tuple[tuple[int, int], ...]]] = []
    body = hashlib.blake2b(digest_size=16)
    # subject digest -> (its shard's place in `taken`, where its lines start there,
    # (newest, all) as compared): the comparable form is made only when a second
    # shard decides the subject too (a rollout belongs to one shard, so mostly
    # never), from the first shard's journal, taken again then, once per shard pair.
    # A subject of one line that no second shard decided is one int (`_PLACE_BITS`).
    newest: dict[bytes, int | tuple[int, Starts, tuple[bytes, set[bytes]] | None]] = {}
    task = name.removesuffix("-journal.jsonl")
    for label, take in parts:
        data = take()
        spans: list[tuple[int, int]] = []
        mine: dict[bytes, Starts] = {}
        for start, end, row in _rows(label, name, data, notes):
            subject = _subject(row)
            if subject is not None:
                digest = _digest(orjson.dumps(subject))
                known = mine.get(digest)
                if known is None:
                    mine[digest] = start
                elif isinstance(known, int):
                    mine[digest] = [known, start]
                else:
                    known.append(start)
            line = data[start:end]
            identity = _identity(row, line)
            if identity not in seen:
                seen.add(identity)
                body.update(line)
                if spans and spans[-1][1] == start:
                    spans[-1] = (spans[-1][0], end)
                else:
                    spans.append((start, end))
        here = len(taken)
        taken.append((label, take, tuple(spans)))
        earlier: dict[int, bytes] = {}  # an earlier shard's journal, taken again for its subjects here
        for subject, starts in mine.items():
            other = newest.get(subject)
            if other is None:
                one = type(starts) is int
                newest[subject] = starts << _PLACE_BITS | here if one else (here, starts, None)
                continue
            if isinstance(other, int):
                other = (other & _PLACE, other >> _PLACE_BITS, None)
            if other[2] is None:
                if other[0] not in earlier:
                    earlier[other[0]] = taken[other[0]][1]()
                other_last, other_every = _canonical(earlier[other[0]], other[1])
            else:
                other_last, other_every = other[2]
            last, every = _canonical(data, starts)
            if other_last != last and other_last not in every and last not in other_every:
                first = _as_list(starts)[0]
                what, *key = _subject(orjson.loads(data[first : data.index(b"\n", first)]))
                raise EvalReplayError(
                    f"{taken[other[0]][0]} and {label} hold conflicting results for one rollout: {what} "
                    f"{_shown(key)} in {task!r} differs ({name}); a rollout belongs to one shard: was one "
                    "dir written by two shards' runs, or a shard run twice with different results? Merge "
                    "the dir that holds the shard's run and leave the other out"
                )
            if last not in other_every:
                newest[subject] = (here, starts, (last, every | other_every))
            else:
                newest[subject] = (other[0], other[1], (other_last, other_every))
        del data, earlier
    digest = body.digest()
    run = "merged-" + digest.hex()
    header = orjson.dumps(header_row(task, run), option=orjson.OPT_APPEND_NEWLINE)
    return MergedJournal(name, header, tuple(taken), digest)


def _shown(key: Sequence[Any]) -> str:
    if len(key) == 1:
        return str(key[0])
    stage, iid, rollout = key[0]
    return f"{iid}[s{stage}-r{rollout}]"
