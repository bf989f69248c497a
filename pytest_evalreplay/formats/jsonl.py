"""Reading the JSONL files of saved runs, for every reader alike: lines split
as editors number them, each row parsed with errors naming file:line, paths
that must be files or readable directories, and a saved generation's fields
checked one by one (a wrong type names its field)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.model import EvalReplayError, Generation, RollingLoglikelihood, loglikelihoods_problem
from pytest_evalreplay.storage import lines as line_reader
from pytest_evalreplay.storage.files import os_error
from pytest_evalreplay.storage.lines import read_jsonl
from pytest_evalreplay.storage.rowfields import bad_field, not_an_object, optional_string, token_count

BOM = b"\xef\xbb\xbf"


def split_lines(data: bytes) -> list[bytes]:
    """A JSONL file's lines (split on newlines only, as editors number them),
    a UTF-8 byte order mark dropped, no empty element after a final newline."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    if lines and lines[0].startswith(BOM):
        lines[0] = lines[0][len(BOM) :]
    return lines


def rows_of(path: Path, lines: list[bytes]) -> Iterator[tuple[int, Any]]:
    """Each non-blank line's number and value; a line that is not JSON is an
    error naming file:line."""
    loads = orjson.loads
    for lineno, line in enumerate(lines, 1):
        try:
            row = loads(line)
        except orjson.JSONDecodeError as exc:
            if line.strip():
                raise malformed(path, lineno, exc) from None
            continue
        yield lineno, row


def parse_lines(path: Path) -> Iterator[tuple[int, bytes, Any]]:
    """Each non-blank line of a JSONL file: its number, its bytes and its row."""
    lines = split_lines(read_jsonl(path))
    for lineno, row in rows_of(path, lines):
        yield lineno, lines[lineno - 1], row


def malformed(path: Path, lineno: int, exc: Exception) -> EvalReplayError:
    return malformed_at(f"{path}:{lineno}", exc)


def malformed_at(where: str, exc: Exception) -> EvalReplayError:
    return EvalReplayError(
        f"{where}: not valid JSON ({exc}); fix or delete that line, "
        "or point --evalreplay-predictions elsewhere"
    )


def bad_row(path: Path | str, lineno: int | None, expected: str) -> EvalReplayError:
    where = f"{path}:{lineno}" if lineno is not None else str(path)
    return EvalReplayError(f"{where}: {expected}; fix or delete that line (was the file written by hand?)")


def first_row(path: Path) -> object:
    """The first non-blank row of a JSONL file, for sniffing layouts: None if
    the file is empty, that row is not JSON or its line is over the cap (the
    reader then says so)."""
    try:
        with path.open("rb") as fh:
            for lineno, line in enumerate(iter(lambda: fh.readline(line_reader.MAX_LINE_BYTES + 2), b""), 1):
                if lineno == 1 and line.startswith(BOM):
                    line = line[len(BOM) :]
                if len(line.rstrip(b"\n")) > line_reader.MAX_LINE_BYTES:
                    return None
                if line.strip():
                    try:
                        return orjson.loads(line)
                    except orjson.JSONDecodeError:
                        return None
    except OSError as exc:
        raise os_error(path, exc, "read") from None
    return None


def listable(path: Path) -> None:
    """An unreadable directory is an error naming it (a glob or a stat below
    it would say nothing is there, or name a path that does not exist)."""
    try:
        with os.scandir(path):
            pass
        os.stat(path / ".")
    except OSError as exc:
        raise os_error(path, exc, "list") from None


def list_dir(path: Path, pattern: str) -> list[Path]:
    """The entries of `path` matching a glob pattern, sorted; an unreadable
    directory is an error (a plain glob would silently find nothing)."""
    listable(path)
    return sorted(path.glob(pattern))


def only_files(paths: list[Path], what: str) -> list[Path]:
    """`paths`, refusing one that is not a regular file (a directory named
    like a predictions file is a mistake worth a message, not a silent skip)."""
    for p in paths:
        if not p.is_file():
            raise EvalReplayError(
                f"{p}: expected {what} here, found a directory or special file; remove or rename it"
            )
    return paths


def require_file(path: Path, missing: str) -> None:
    """`path` must exist (`missing` says what to do if not); a directory or an
    unreadable file is reported when it is read."""
    if not os.path.lexists(path):
        raise EvalReplayError(missing)
    if path.is_dir():
        raise EvalReplayError(f"{path}: expected a file here, found a directory; remove or rename it")


def generation_from_row(row: Any, where: str, index: int) -> Generation:
    """A saved generation, every field checked (a wrong type names its field)."""
    name = f"generations[{index}]"
    if type(row) is not dict:
        raise not_an_object(where, name, row)
    text = row.get("text")
    if type(text) is not str:
        raise bad_field(where, f"{name}.text", "a string", text)
    original = optional_string(row, "original_text", where, name)
    finish = optional_string(row, "finish_reason", where, name)
    metadata = row.get("metadata")
    if metadata is not None and type(metadata) is not dict:
        raise bad_field(where, f"{name}.metadata", "an object or null", metadata)
    pairs = row.get("loglikelihoods")
    if pairs is not None and (type(pairs) is not list or loglikelihoods_problem(pairs) is not None):
        raise bad_field(
            where, f"{name}.loglikelihoods", "a list of [log-probability, is_greedy] pairs", pairs
        )
    rolling = row.get("rolling")
    return Generation(
        text=text,
        original_text=original,
        finish_reason=finish,
        prompt_tokens=token_count(row.get("prompt_tokens"), where, f"{name}.prompt_tokens"),
        completion_tokens=token_count(row.get("completion_tokens"), where, f"{name}.completion_tokens"),
        metadata=metadata or {},
        loglikelihoods=tuple((float(ll), greedy) for ll, greedy in pairs or ()),
        rolling=None if rolling is None else RollingLoglikelihood.from_row(rolling, f"{where}: {name}"),
    )


def instance_id(value: Any, where: str, name: str = "instance_id") -> str:
    """An id field: a string, or an integer (read as its decimal string)."""
    if type(value) is str:
        return value
    if type(value) is int:
        return str(value)
    raise bad_field(where, name, "a string or an integer", value)
