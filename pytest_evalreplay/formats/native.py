"""Our own run dir: `<task>-predictions.jsonl` joined to `<task>-requests.jsonl`.

A predictions row says which instance (and stage) it answers; the requests row
of that instance, in the requests file of the same task, says the prompt. The
plugin writes both files in the same order (batch by batch while running, in
instance order once finished), so rows are joined in step, and by
(stage, instance_id) where the order differs. Other files of a run dir
(metrics, failures, journal) play no part in replay; the manifest gives the
model's name when rows do not.

Two ways through a file pair, with the same result (tests/test_native_ways.py
compares them on generated pairs):

- in step (`_load_in_step`), for the files the plugin writes: both files the
  same length, row i of one answering row i of the other, requests rows of
  plain text generation (the six keys of `runschema.REQUEST_FIELDS`). Requests rows
  are parsed in small blocks with C-level passes (no Python work per row); of
  a predictions row only its beginning `{"instance_id":"..","model":..,"generations":[`
  is compared with what orjson writes for row i's id, the rest is parsed (and
  checked) when a request asks for it, where a full parse that disagrees with
  that beginning fails that request. Anything else (another length, a
  loglikelihood, staged, image or tool row, an id or prompt the blocks cannot
  vouch for) undoes the file's entries and takes the general way.
- row by row (`_load_general`), every row parsed and checked at load.

A loglikelihood row (a multiple-choice task's) is indexed by its prompt like
a generation, and its requests row's `continuations` join the `SavedRow`
(`SavedFile.continuations`), so replay serves it only to a request with the
same ones.
"""

from __future__ import annotations

import re
from collections import deque as consume
from collections.abc import Iterator, Sequence
from functools import partial
from itertools import compress, repeat
from operator import is_, itemgetter, not_
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from pytest_evalreplay.formats.saved import (
    BOM,
    OWN_LAYOUT,
    IndexBuilder,
    IndexKey,
    SamplingRuns,
    SavedRow,
    generation_from_row,
    index_key,
    list_dir,
    malformed_at,
    only_files,
    require_file,
    rows_of,
    split_lines,
)
from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.storage import lines as line_reader
from pytest_evalreplay.storage.files import os_error
from pytest_evalreplay.storage.lines import read_jsonl
from pytest_evalreplay.storage.rowfields import bad_field, not_an_object, show
from pytest_evalreplay.storage.runschema import (
    JUDGE_PREDICTIONS_SUFFIX,
    MANIFEST,
    PREDICTIONS_SUFFIX,
    REQUEST_FIELDS,
    REQUESTS_SUFFIX,
    prediction_fields,
    read_manifest,
    request_fields,
    rollouts_of,
)

LAYOUT = OWN_LAYOUT
LOOK_AHEAD = 8  # requests rows skipped in step (instances that failed) before joining by id
_CHUNK = 1 << 20  # bytes per pass when finding line ends
BLOCK = 256  # rows per block on the in-step way: a block's parsed rows stay in the CPU's cache

# (stage, instance) is keyed by the bare instance id for stage 1 (most rows).
JoinKey = Any
_AMBIGUOUS = object()  # a join key with two different prompts in the requests file

# The prefix of a predictions row as orjson writes `runschema.prediction_row`: an
# id and a model with nothing escaped, then the generations list.
_FIRST = re.compile(
    rb'\{"instance_id":"([^"\\\x00-\x1f]+)","model":("[^"\\\x00-\x1f]*"|null),"generations":\['
)
_ESCAPED = re.compile(rb'["\\\x00-\x1f]')  # what JSON writes escaped in a string
_REQUEST_FIELDS = itemgetter(*REQUEST_FIELDS)
_SIX = {6}
_STR = {str}
_STR_OR_NONE = {str, type(None)}
_DICT = {dict}
_encode = str.encode
_startswith = bytes.startswith


def prediction_files(directory: Path) -> list[Path]:
    """A run dir's predictions files: every `<task>-predictions.jsonl` but an
    EloEval's `<name>-judge-predictions.jsonl` (the judge's verdicts, another
    model's: replay reads them only to serve that judge)."""
    found = list_dir(directory, f"*{PREDICTIONS_SUFFIX}")
    return only_files(
        [p for p in found if not p.name.endswith(JUDGE_PREDICTIONS_SUFFIX)], "a predictions file"
    )


def load_dir(builder: IndexBuilder, directory: Path) -> None:
    builder.fallback_model = manifest_model(directory / MANIFEST)
    for path in prediction_files(directory):
        load_file(builder, path)


def manifest_model(manifest: Path) -> str | None:
    """The manifest's model, the name replay reports when rows carry none.
    A manifest is optional; one that is there must be ours and readable."""
    found = read_manifest(manifest)
    return None if found is None else found.model


def load_file(builder: IndexBuilder, path: Path) -> None:
    task = path.name[: -len(PREDICTIONS_SUFFIX)]
    requests_path = path.with_name(task + REQUESTS_SUFFIX)
    require_file(
        requests_path,
        f"{path}: no {requests_path.name} beside it; replay needs the requests file "
        "to know which prompt each saved row answered (copy it along with the predictions)",
    )
    try:
        requests = requests_path.open("rb")
    except OSError as exc:
        raise os_error(requests_path, exc, "read") from None
    with requests:
        data = read_jsonl(path)
        in_step = _load_in_step(builder, path, task, requests, data)
    if not in_step:
        lines = split_lines(read_jsonl(requests_path))
        _load_general(builder, path, requests_path, task, lines, split_lines(data))


# -- the in-step way ----------------------------------------------------------


def _load_in_step(builder: IndexBuilder, path: Path, task: str, requests: BinaryIO, data: bytes) -> bool:
    """Index a file pair whose rows correspond one to one; False (with nothing
    left in the index) where it cannot vouch for the result. The requests
    file is read a piece at a time (never whole beside the growing index)."""
    first = _FIRST.match(data)
    if first is None or b'"stage"' in data:
        return False
    bounds = line_bounds(data)
    n = len(bounds) - 1
    # Row i of the predictions must begin as orjson writes row i's instance id
    # and the first row's model: the ids are then equal, and so are the models.
    head = b'{"instance_id":"'
    tail = b'","model":' + first[2] + b',"generations":['
    systems_seen: dict[str | None, str | None] = {}  # one str per system prompt: the keys share it
    keys = builder.keys
    setdefault = keys.setdefault
    base = builder.size
    loads = orjson.loads
    inserted = 0  # rows whose keys went into `keys` (undone, by parsing them again, on giving up)
    samplings = SamplingRuns()
    done = False
    a = 0
    try:
        for lines in request_blocks(requests):
            b = a + len(lines)
            if b > n:
                return False  # more requests rows than predictions rows
            rows = list(map(loads, lines))
            del lines
            # Exactly the six keys `runschema.request_row` writes for a plain text request:
            # no stage, images or tools (those take the general way).
            ids, kinds, contexts, systems, _, block_sampling = zip(*map(_REQUEST_FIELDS, rows), strict=True)
            if set(map(len, rows)) != _SIX or set(map(type, block_sampling)) != _DICT:
                return False
            del rows
            encoded = list(map(_encode, ids))  # a TypeError for an id that is not a string
            if (
                kinds.count("generate") != len(kinds)
                or set(map(type, contexts)) != _STR
                or not set(map(type, systems)) <= _STR_OR_NONE
                or _ESCAPED.search(b"".join(encoded))  # the file would hold such an id escaped
                or not all(
                    map(
                        _startswith,
                        repeat(data),
                        map(b"".join, zip(repeat(head), encoded, repeat(tail))),
                        (bounds[a:b] + 1).tolist(),
                    )
                )
            ):
                return False
            systems = tuple(map(systems_seen.setdefault, systems, systems))
            positions = range(base + a, base + b)
            block_keys: Sequence[IndexKey]
            if systems.count(None) == len(systems):
                block_keys, order = contexts, positions
            elif None not in systems:
                block_keys, order = list(zip(contexts, systems, strict=True)), positions
            else:  # a bare context where there is no system prompt, else the pair (see IndexKey)
                plain = list(map(is_, systems, repeat(None)))
                paired = list(map(not_, plain))
                block_keys = [
                    *compress(contexts, plain),
                    *zip(compress(contexts, paired), compress(systems, paired), strict=True),
                ]
                order = [*compress(positions, plain), *compress(positions, paired)]
            if block_sampling.count(block_sampling[0]) == len(block_sampling):
                samplings.add(a, block_sampling[0])  # the common case: one sampling for the block
            else:
                consume(map(samplings.add, range(a, b), block_sampling), 0)
            size = len(keys)
            inserted = b
            consume(map(setdefault, block_keys, order), 0)  # never overwrites another file's entry
            if len(keys) - size != b - a:
                return False  # a prompt saved twice: the general way sorts it out
            a = b
        if a != n:
            return False
        model = None if first[2] == b"null" else orjson.loads(first[2])
        done = True
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, OSError):
        return False  # UnicodeDecodeError is a ValueError; an OSError is reported by the general way
    finally:
        if not done:
            _undo(keys, requests, inserted, base)
    builder.add_file(
        path, task, LAYOUT, decode_in_step, identify=identify, data=data, bounds=bounds, samplings=samplings
    )
    builder.note_model(model, path)
    return True


def line_bounds(data: bytes) -> Any:
    """The bounds of `data`'s lines, as `split_lines` splits them: line i is
    `data[bounds[i] + 1 : bounds[i + 1]]` (numpy finds the newlines at C speed)."""
    import numpy as np

    view = np.frombuffer(data, dtype=np.uint8)
    # A chunk at a time: a comparison of the whole file would be a temporary
    # as large as the file, at the moment the index is largest.
    parts = [np.array([-1], dtype=np.int64)]
    for start in range(0, len(view), _CHUNK):
        parts.append(np.flatnonzero(view[start : start + _CHUNK] == 10) + start)
    if data and not data.endswith(b"\n"):
        parts.append(np.array([len(data)], dtype=np.int64))
    return np.concatenate(parts).astype(np.int64, copy=False)


def request_blocks(requests: BinaryIO) -> Iterator[list[bytes]]:
    """A requests file's lines as `split_lines` gives them, `BLOCK` at a time
    (the last block shorter), read `_CHUNK` bytes at a time from the start;
    a ValueError for a file that begins with a byte order mark or holds a
    line over the cap (the general way reads those, or names that line)."""
    requests.seek(0)
    pending: list[bytes] = []
    rest = b""
    start = True
    for piece in iter(partial(requests.read, _CHUNK), b""):
        if start and piece.startswith(BOM):
            raise ValueError("byte order mark")
        start = False
        joined = rest + piece
        lines = joined.split(b"\n")
        rest = lines.pop()
        if (
            len(joined) > line_reader.MAX_LINE_BYTES
            and max(map(len, [rest, *lines])) > line_reader.MAX_LINE_BYTES
        ):
            raise ValueError("a line over the cap")
        pending += lines
        full = len(pending) - len(pending) % BLOCK
        for i in range(0, full, BLOCK):
            yield pending[i : i + BLOCK]
        pending = pending[full:]
    if rest:
        pending.append(rest)
    if pending:
        yield pending


def _undo(keys: dict[IndexKey, Any], requests: BinaryIO, stop: int, base: int) -> None:
    """Take out of `keys` what the first `stop` requests rows put there (their
    slots are `base` on); those rows passed the block checks, so they parse
    again the same."""
    done = 0
    try:
        for lines in request_blocks(requests) if stop else ():
            for line in lines[: stop - done]:
                row = orjson.loads(line)
                key = index_key(row["context"], row["system_prompt"])
                slot = keys.get(key)
                if type(slot) is int and slot >= base:
                    del keys[key]
            done += len(lines)
            if done >= stop:
                break
    except OSError as exc:
        raise os_error(Path(requests.name), exc, "read again") from None


def identify(blob: bytes) -> tuple[int, str] | None:
    """A predictions row's (stage, instance id) from its prefix, if it has ours."""
    match = _FIRST.match(blob)
    if match is None or b'"stage"' in blob:
        return None
    try:
        return 1, match[1].decode()
    except UnicodeDecodeError:
        return None


def decode_in_step(blob: bytes, where: str, file: Path) -> SavedRow:
    """`decode`, for a row indexed by its prefix: the full parse must agree
    with what the prefix said (a duplicated or escaped key could differ)."""
    row = parse(blob, where)
    saved = row_from(row, where, file)
    match = _FIRST.match(blob)
    if (
        match is None
        or saved.stage != 1
        or match[1].decode() != saved.instance_id
        or orjson.loads(match[2]) != row.get("model")
    ):
        raise EvalReplayError(
            f"{where}: the row's instance_id, model or stage reads differently in full than in "
            "its first fields (a key given twice, or spelled with escapes); write each key once"
        )
    return saved


# -- the general way ----------------------------------------------------------


def _load_general(
    builder: IndexBuilder,
    path: Path,
    requests_path: Path,
    task: str,
    requests: list[bytes],
    lines: list[bytes],
) -> None:
    joins, prompts, request_samplings, request_continuations = read_requests(requests_path, requests)
    samplings = SamplingRuns()
    continuations: dict[int, tuple[str, ...]] = {}
    base = builder.add_file(
        path,
        task,
        LAYOUT,
        decode,
        identify=identify,
        lines=lines,
        samplings=samplings,
        continuations=continuations,
    ).start
    n = len(joins)
    i = 0  # the requests row expected next
    table: dict[JoinKey, IndexKey | None] | None = None
    model: Any = None
    for lineno, row in rows_of(path, lines):
        where = f"{path}:{lineno}"
        fields = prediction_fields(row, where)
        iid, stage, row_model = fields.instance_id, fields.stage, fields.model
        k = iid if stage == 1 else (stage, iid)
        if i < n and joins[i] == k:
            key, sampling, conts = prompts[i], request_samplings[i], request_continuations[i]
            i += 1
        else:
            j = _find(joins, k, i, min(n, i + LOOK_AHEAD))
            if j >= 0:
                key, sampling, conts = prompts[j], request_samplings[j], request_continuations[j]
                i = j + 1
            else:
                if table is None:
                    table = _table(joins, prompts, request_samplings, request_continuations)
                if k not in table:
                    raise EvalReplayError(
                        f"{where}: predictions row for instance {show(iid)} (stage {stage}) has no row in "
                        f"{requests_path.name}, so its prompt is unknown; restore the requests file the "
                        "run wrote, or delete the row"
                    )
                key, sampling, conts = table[k]
                if key is _AMBIGUOUS:
                    raise EvalReplayError(
                        f"{requests_path}: instance {show(iid)} (stage {stage}) appears with "
                        f"different prompts, and {where} cannot be matched to one of them by order; "
                        "was the file edited or concatenated?"
                    )
        if row_model != model:
            builder.note_model(row_model, path)
            model = row_model
        if key is None:
            builder.skipped += 1
            continue
        samplings.add(lineno - 1, sampling)
        if conts:
            continuations[lineno - 1] = conts
        builder.insert(key, base + lineno - 1)


Sampling = dict[str, Any] | None


def read_requests(
    path: Path, lines: list[bytes]
) -> tuple[list[JoinKey], list[IndexKey | None], list[Sampling], list[tuple[str, ...]]]:
    """Each requests row's join key, prompt key, sampling and continuations
    (a loglikelihood row's; empty for a generation), in file order; the
    prompt key is None for rows replay skips (images, tools), the sampling
    None for a row that does not say (written by hand)."""
    joins: list[JoinKey] = []
    prompts: list[IndexKey | None] = []
    samplings: list[Sampling] = []
    continuations: list[tuple[str, ...]] = []
    for lineno, row in rows_of(path, lines):
        where = f"{path}:{lineno}"
        fields = request_fields(row, where)
        sampling = row.get("sampling")
        if sampling is not None and type(sampling) is not dict:
            raise bad_field(where, "sampling", "an object of sampling settings, or null", sampling)
        samplings.append(sampling)
        continuations.append(fields.continuations)
        if (
            fields.request_type in ("generate", "loglikelihood", "loglikelihood_rolling")
            and not fields.extras
        ):
            try:
                prompts.append(index_key(fields.context, fields.system_prompt))
            except TypeError as exc:
                raise bad_field(where, "context", f"JSON orjson can encode ({exc})", fields.context) from None
        else:
            prompts.append(None)
        joins.append(fields.instance_id if fields.stage == 1 else (fields.stage, fields.instance_id))
    return joins, prompts, samplings, continuations


def _find(joins: list[JoinKey], k: JoinKey, start: int, stop: int) -> int:
    for j in range(start, stop):
        if joins[j] == k:
            return j
    return -1


def _table(
    joins: list[JoinKey],
    prompts: list[IndexKey | None],
    samplings: list[Sampling],
    continuations: list[tuple[str, ...]],
) -> dict[JoinKey, tuple[Any, Sampling, tuple[str, ...]]]:
    """Join key -> (prompt key, sampling, continuations) for rows that cannot
    be joined in step; the first row's where a key's rows say the same prompt
    (and continuations)."""
    table: dict[JoinKey, tuple[Any, Sampling, tuple[str, ...]]] = {}
    for k, key, sampling, conts in zip(joins, prompts, samplings, continuations, strict=True):
        prev = table.setdefault(k, (key, sampling, conts))
        if prev[0] is not _AMBIGUOUS and (prev[0] != key or prev[2] != conts):
            table[k] = (_AMBIGUOUS, None, ())
    return table


def decode(blob: bytes, where: str, file: Path) -> SavedRow:
    return row_from(parse(blob, where), where, file)


def parse(blob: bytes, where: str) -> dict[str, Any]:
    try:
        row = orjson.loads(blob)
    except orjson.JSONDecodeError as exc:
        raise malformed_at(where, exc) from None
    if type(row) is not dict:
        raise not_an_object(where, "a predictions row", row)
    return row


def row_from(row: dict[str, Any], where: str, file: Path) -> SavedRow:
    fields = prediction_fields(row, where)
    generations = tuple(generation_from_row(g, where, i) for i, g in enumerate(fields.generations))
    return SavedRow(
        instance_id=fields.instance_id,
        stage=fields.stage,
        rollouts=rollouts_of(row.get("rollouts"), len(generations), where),
        generations=generations,
        where=where,
        file=file,
    )
