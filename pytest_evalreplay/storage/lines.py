"""JSONL lines as every reader takes them: the one cap on a line's length and
the one strict line reader (file:line in every error).

A line is capped before it is parsed so a hostile or corrupt file (one 1 GB
line) is refused in constant memory, not after gigabytes are allocated.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.storage.files import read_bytes

# The longest JSONL line any reader parses (journals, run dirs, foreign saved
# runs, instances, transcripts, shard journals): a longer one is refused,
# naming file:line, before it is parsed (one 1 GB line took gigabytes).
MAX_LINE_BYTES = 256 * 2**20


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector paused while many decoded rows live on at
    once (a replay's index, a merge's rows and outcomes): they are plain,
    acyclic objects, hundreds of thousands of them, and each full collection
    would walk them all again for nothing (at 100k rollouts, half a merge's
    journal step). Left as it was found: a caller that disabled it keeps it so."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def check_line_lengths(path: Path | str, data: bytes, first_lineno: int = 1) -> None:
    """Refuse JSONL `data` (from `path`, its first line numbered `first_lineno`)
    holding a line over `MAX_LINE_BYTES`: a cap's width at a time, newline to
    newline, so data under the cap costs one comparison."""
    cap, n, pos = MAX_LINE_BYTES, len(data), 0
    while n - pos > cap:
        nl = data.rfind(b"\n", pos, pos + cap + 1)
        if nl < 0:
            lineno = first_lineno + data.count(b"\n", 0, pos)
            raise EvalReplayError(
                f"{path}:{lineno}: a line over {cap:,} bytes, the most one JSONL line may hold: not read. "
                "Fix or delete that line (was the file written by hand, or two lines joined?)"
            )
        pos = nl + 1


def read_jsonl(path: Path) -> bytes:
    """A JSONL file's bytes (`read_bytes`), refused if a line is over the cap."""
    data = read_bytes(path)
    check_line_lengths(path, data)
    return data


def jsonl_lines(path: Path, data: bytes) -> Iterator[tuple[int, bytes, Any]]:
    """Each non-blank line of JSONL `data` read from `path`: its number, bytes and value.

    A line that is not JSON is an error naming file:line (the journal, which
    must survive a torn last line, has its own reader). A UTF-8 byte order
    mark on the first line is ignored. A line over the cap is refused.
    """
    check_line_lengths(path, data)
    loads = orjson.loads
    for lineno, line in enumerate(data.split(b"\n"), 1):
        if lineno == 1 and line.startswith(b"\xef\xbb\xbf"):
            line = line[3:]
        if not line.strip():
            continue
        try:
            row = loads(line)
        except orjson.JSONDecodeError as exc:
            raise EvalReplayError(
                f"{path}:{lineno}: not valid JSON ({exc}); fix or delete that line"
            ) from None
        yield lineno, line, row
