"""Saved runs, read into one index: prompt -> the saved rows that answer it.

Every reader (our run dir, olmo-eval, lm-evaluation-harness) fills the same
`IndexBuilder`, so replay has one set of rules whatever wrote the files; this
module holds the index (the readers' file and row helpers are in
`formats.jsonl`), and imports none of them (`formats.load` picks the
reader). Loading is one streaming pass: each file is read once, and a saved
row is kept as its raw bytes (each file's rows numbered from the file's `start`, the
index holding only those positions); a row is decoded into `SavedRow` (and
checked field by field) when a request asks for its prompt. A file read the
fast way keeps its bytes as one buffer and the bounds of its lines, so a
million saved rows cost little more than their bytes in memory.

Everything a reader can meet in a file (bad JSON, a wrong field type, a
directory or an unreadable file where a file should be) is an
`EvalReplayError` naming the file, the line and the field; nothing else
escapes `load`.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.formats.jsonl import (
    BOM,
    bad_row,
    first_row,
    generation_from_row,
    instance_id,
    list_dir,
    listable,
    malformed,
    malformed_at,
    only_files,
    parse_lines,
    require_file,
    rows_of,
    split_lines,
)
from pytest_evalreplay.model import EvalReplayError, Generation, PromptKey
from pytest_evalreplay.storage.rowfields import bad_field, not_an_object, show, token_count

# The readers' shared helpers live in `formats.jsonl` and `rowfields`; they are named here too,
# where the readers have always imported them from.
__all__ = [
    "BOM",
    "IndexBuilder",
    "IndexKey",
    "SamplingRuns",
    "SavedFile",
    "SavedIndex",
    "SavedRow",
    "bad_field",
    "bad_row",
    "first_row",
    "generation_from_row",
    "index_key",
    "instance_id",
    "key_of",
    "list_dir",
    "listable",
    "malformed",
    "malformed_at",
    "not_an_object",
    "only_files",
    "parse_lines",
    "require_file",
    "rows_of",
    "split_lines",
    "token_count",
]

# A prompt in the index: the context alone (a str, or for chat messages their
# canonical JSON as bytes) when there is no system prompt, else the pair. Most
# saves have no system prompt, and a bare string costs no tuple per row.
IndexKey = Any
# A prompt's saves: one position, or (a prompt saved twice) several.
Slot = int | list[int]


def index_key(context: Any, system_prompt: str | None) -> IndexKey:
    """The index's key for a prompt (see `IndexKey`); raises TypeError for a
    context that is not a string or a list, or one orjson cannot encode."""
    if type(context) is not str:
        if not isinstance(context, (str, list)):
            raise TypeError("context")
        context = context if isinstance(context, str) else orjson.dumps(context, option=orjson.OPT_SORT_KEYS)
    return context if system_prompt is None else (context, system_prompt)


def key_of(prompt: PromptKey) -> IndexKey:
    """`model.prompt_key`'s pair as an index key."""
    return prompt[0] if prompt[1] is None else prompt


def split_key(key: IndexKey) -> tuple[str | bytes, str | None]:
    return (key[0], key[1]) if type(key) is tuple else (key, None)


def context_text(key: IndexKey) -> str:
    """A key's context as text (chat messages as their canonical JSON)."""
    context = split_key(key)[0]
    return context if type(context) is str else context.decode("utf-8", "replace")


@dataclass(frozen=True)
class SavedRow:
    """One saved answer to one prompt, decoded on demand.

    `rollouts[i]` is the sample index of `generations[i]`; a row that holds all
    of an instance's samples has rollouts 0..n-1.
    """

    instance_id: str
    stage: int
    rollouts: tuple[int, ...]
    generations: tuple[Generation, ...]
    where: str  # "file:line", for messages
    file: Path
    sampling: dict[str, Any] | None = None  # its saved request's sampling, where the layout says
    # A loglikelihood save: the continuations its generations' `loglikelihoods`
    # answer, in order (replay serves it only to a request with the same ones).
    continuations: tuple[str, ...] = ()


@dataclass(frozen=True)
class SamplingRuns:
    """The saved sampling of each row of a predictions file, run-length coded
    (rows from `starts[i]` on have `values[i]`): a run's rows nearly always
    share one sampling, so a million rows cost a few entries, not a dict each."""

    starts: list[int] = field(default_factory=list)
    values: list[dict[str, Any] | None] = field(default_factory=list)

    def add(self, row: int, sampling: dict[str, Any] | None) -> None:
        """Row `row` (rows are added in increasing order) has `sampling`."""
        if not self.values or self.values[-1] != sampling:
            self.starts.append(row)
            self.values.append(sampling)

    def at(self, row: int) -> dict[str, Any] | None:
        i = bisect_right(self.starts, row) - 1
        return None if i < 0 else self.values[i]


Decoder = Callable[[bytes, str, Path], SavedRow]
OWN_LAYOUT = "evalreplay"  # the plugin's own run dir: one predictions file per task
# A saved row's (stage, instance id) without a full decode, for the
# diagnostics of a miss; None when the row cannot say.
Identify = Callable[[bytes], "tuple[int, str] | None"]


@dataclass(frozen=True)
class SavedFile:
    """A predictions file: its rows' bytes, where their positions start, and
    how to decode them.

    The rows are `lines`, or, for a file read the fast way, slices of one
    buffer: row i is `data[bounds[i] + 1 : bounds[i + 1]]`. `linenos` is None
    when row i is line i + 1 of the file, else the line number of each row.
    """

    path: Path
    task: str
    layout: str  # "evalreplay" | "olmo-eval" | "lm-eval"
    decode: Decoder
    start: int
    linenos: list[int] | None = None
    identify: Identify | None = None
    lines: list[bytes] = field(default_factory=list)
    data: bytes = b""
    bounds: Any = None  # a numpy int64 array, when `data` holds the rows
    samplings: SamplingRuns | None = None  # where the layout saves each row's sampling
    # A loglikelihood row's continuations by row offset, where the layout keeps
    # them beside the row (our run dir: in the requests file).
    continuations: dict[int, tuple[str, ...]] | None = None

    def __len__(self) -> int:
        return len(self.lines) if self.bounds is None else len(self.bounds) - 1

    def blob(self, offset: int) -> bytes:
        if self.bounds is None:
            return self.lines[offset]
        return self.data[int(self.bounds[offset]) + 1 : int(self.bounds[offset + 1])]


@dataclass(frozen=True)
class SavedIndex:
    """Every saved prompt of a loaded path, ready for lookups."""

    source: Path
    files: tuple[SavedFile, ...]
    keys: dict[IndexKey, Slot]
    model: str | None
    skipped: int  # loglikelihood, image and tool saves left out at load
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.keys)

    def task_rows(self, rows: list[SavedRow], task: str) -> list[SavedRow]:
        """Of a prompt's rows, those the plugin's own run dir saved for `task`
        (its files name the task that wrote them); all of them when it saved
        none for `task`, or the layout is another harness's (prompt-only)."""
        own = self._cache.get("own_files")
        if own is None:
            own = self._cache["own_files"] = {f.path: f.task for f in self.files if f.layout == OWN_LAYOUT}
        mine = [row for row in rows if own.get(row.file) == task] if own else []
        return mine or rows

    def rows(self, prompt: PromptKey) -> list[SavedRow]:
        """The saved rows for a prompt (`Request.prompt_key`), in file order (empty if none).

        Raises EvalReplayError naming file:line when a saved row is malformed.
        """
        slot = self.keys.get(key_of(prompt))
        if slot is None:
            return []
        return [self.decode(pos) for pos in ([slot] if type(slot) is int else slot)]

    def decode(self, pos: int) -> SavedRow:
        return decode_at(self.files, pos)

    def where(self, pos: int) -> str:
        source, lineno = locate(self.files, pos)
        return f"{source.path}:{lineno}"

    def prompts(self) -> Iterator[tuple[str | list[Any], str | None]]:
        """Every saved prompt as (context, system prompt), chat contexts as messages."""
        for key in self.keys:
            context, system = split_key(key)
            yield (context if type(context) is str else orjson.loads(context)), system

    def identify(self, pos: int) -> tuple[int, str] | None:
        """A saved row's (stage, instance id), cheaply where the layout allows."""
        source, _ = locate(self.files, pos)
        if source.identify is not None:
            found = source.identify(source.blob(pos - source.start))
            if found is not None:
                return found
        try:
            row = self.decode(pos)
        except EvalReplayError:
            return None
        return row.stage, row.instance_id

    def by_instance(self) -> dict[tuple[int, str], list[IndexKey]]:
        """(stage, instance id) -> the keys saved for it; built on first use
        (a miss), never at load."""
        table = self._cache.get("by_instance")
        if table is None:
            table = {}
            for key, slot in self.keys.items():
                found = self.identify(slot if type(slot) is int else slot[0])
                if found is not None:
                    table.setdefault(found, []).append(key)
            self._cache["by_instance"] = table
        return table

    def sorted_contexts(self) -> tuple[list[str], list[IndexKey]]:
        """Every key and its context as text, in text order; built on first use (a miss)."""
        found = self._cache.get("sorted")
        if found is None:
            keys = sorted(self.keys, key=context_text)
            found = ([context_text(k) for k in keys], keys)
            self._cache["sorted"] = found
        return found


def locate(files: list[SavedFile] | tuple[SavedFile, ...], pos: int) -> tuple[SavedFile, int]:
    """The file of a blob position, and the blob's line number in it."""
    source = files[bisect_right(files, pos, key=_start) - 1]
    offset = pos - source.start
    return source, (offset + 1 if source.linenos is None else source.linenos[offset])


def _start(saved: SavedFile) -> int:
    return saved.start


def decode_at(files: list[SavedFile] | tuple[SavedFile, ...], pos: int) -> SavedRow:
    source, lineno = locate(files, pos)
    offset = pos - source.start
    row = source.decode(source.blob(offset), f"{source.path}:{lineno}", source.path)
    continuations = source.continuations.get(offset) if source.continuations else None
    if continuations is None and source.samplings is None:
        return row
    # Built here, not by `dataclasses.replace` (some 9k instructions a
    # row: replay and an ELO eval's references decode every row they serve).
    return SavedRow(
        instance_id=row.instance_id,
        stage=row.stage,
        rollouts=row.rollouts,
        generations=row.generations,
        where=row.where,
        file=row.file,
        sampling=row.sampling if source.samplings is None else source.samplings.at(offset),
        continuations=row.continuations if continuations is None else continuations,
    )


@dataclass
class IndexBuilder:
    """Collects files and keys from readers; `finish` checks the whole-path rules.

    A reader starts a file with `add_file`, appends its rows to that file's
    `lines` (or gives the whole buffer), and inserts each row's position
    (`start` + its offset) with `insert`, which calls `collide` when the
    prompt is already there.
    """

    source: Path
    files: list[SavedFile] = field(default_factory=list)
    keys: dict[IndexKey, Slot] = field(default_factory=dict)
    models: dict[str, list[Path]] = field(default_factory=dict)
    fallback_model: str | None = None
    skipped: int = 0

    @property
    def size(self) -> int:
        """The position the next file's rows start at."""
        return self.files[-1].start + len(self.files[-1]) if self.files else 0

    def add_file(
        self,
        path: Path,
        task: str,
        layout: str,
        decode: Decoder,
        linenos: list[int] | None = None,
        identify: Identify | None = None,
        lines: list[bytes] | None = None,
        data: bytes = b"",
        bounds: Any = None,
        samplings: SamplingRuns | None = None,
        continuations: dict[int, tuple[str, ...]] | None = None,
    ) -> SavedFile:
        """Start a file (the last one's rows are all in by now)."""
        rows = [] if lines is None else lines
        saved = SavedFile(
            path,
            task,
            layout,
            decode,
            self.size,
            linenos,
            identify,
            rows,
            data,
            bounds,
            samplings,
            continuations,
        )
        self.files.append(saved)
        return saved

    def note_model(self, model: str | None, path: Path) -> None:
        """Record that `path` holds predictions of `model` (None: unknown)."""
        if model is None:
            return
        paths = self.models.setdefault(model, [])
        if path not in paths:
            paths.append(path)

    def insert(self, key: IndexKey, pos: int) -> None:
        prev = self.keys.setdefault(key, pos)
        if prev is not pos:
            self.collide(key, prev, pos)

    def collide(self, key: IndexKey, prev: Slot, pos: int) -> None:
        """A prompt saved twice: fine within one file (replay compares the
        saves when asked), and across the task files of the plugin's own run
        dir (each task is served from its own file, `SavedIndex.task_rows`);
        refused across other files, where the choice of which run to trust
        belongs to the user."""
        first = prev if type(prev) is int else prev[0]
        (a, la), (b, lb) = locate(self.files, first), locate(self.files, pos)
        if a is not b and not (a.layout == b.layout == OWN_LAYOUT and a.task != b.task):
            raise EvalReplayError(
                f"{a.path}:{la} and {b.path}:{lb} both save the same prompt "
                f"(instances {self._instance(first)} and {self._instance(pos)}); "
                f"replay cannot tell which run to serve: pass the file instead, "
                f"e.g. --evalreplay-predictions={a.path}"
            )
        if type(prev) is int:
            self.keys[key] = [prev, pos]
        else:
            prev.append(pos)

    def _instance(self, pos: int) -> str:
        try:
            return show(decode_at(self.files, pos).instance_id)
        except EvalReplayError:
            return "?"

    def check_one_model(self) -> None:
        """Refuse predictions of several models (checked as soon as they are known)."""
        if len(self.models) > 1:
            listing = "; ".join(
                f"{show(model)} in {', '.join(str(p) for p in paths[:3])}"
                + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
                for model, paths in sorted(self.models.items())
            )
            raise EvalReplayError(
                f"{self.source} holds predictions of {len(self.models)} models ({listing}); "
                "replay serves one model's generations: pass one model's directory or file"
            )

    def finish(self) -> SavedIndex:
        self.check_one_model()
        model = next(iter(self.models), None) or self.fallback_model
        return SavedIndex(
            source=self.source,
            files=tuple(self.files),
            keys=self.keys,
            model=model,
            skipped=self.skipped,
        )
