"""Safe file I/O: the one atomic writer, the one durable append and the one
JSONL line reader of the package.

Everything the plugin writes lives in an output dir that other tools, other
sessions and users share, so writes never follow a link planted there:
temporary files are created exclusively (`O_EXCL`) in the target's own
directory and renamed into place, appends refuse a symlinked file
(`O_NOFOLLOW`), and every write is fsynced before it counts. Reading turns
every OS and JSON error into an `EvalReplayError` naming the file (and line).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.model import EvalReplayError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# The process umask, read once: files written atomically get the mode a plain
# open() would give them, not mkstemp's private 0600.
_UMASK = os.umask(0)
os.umask(_UMASK)


def os_error(path: Path, exc: OSError, doing: str) -> EvalReplayError:
    """An OS error as a user-facing message naming the file and the fix."""
    reason = exc.strerror or str(exc)
    if isinstance(exc, IsADirectoryError):
        hint = "it is a directory; point the option at a file"
    elif isinstance(exc, NotADirectoryError):
        hint = "a parent of it is not a directory"
    elif isinstance(exc, PermissionError):
        hint = "check its permissions"
    elif getattr(exc, "errno", None) == 40:  # ELOOP: O_NOFOLLOW met a symlink
        hint = "it is a symlink, and the plugin never writes through links: remove the link"
        reason = "symbolic link"
    elif getattr(exc, "errno", None) == 36:  # ENAMETOOLONG
        hint = "the file name is too long for this filesystem: use a shorter task name"
    else:
        hint = "check the path"
    return EvalReplayError(f"{path}: cannot {doing}: {reason} ({hint})")


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable: fsync the directory that holds it (where the OS allows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Replace `path` with `data` (bytes, or chunks written as they come, so a
    large file is never held whole): a fresh temporary file (created
    exclusively, so a planted symlink is never followed) is written, fsynced
    and renamed over `path`. A symlink at `path` is replaced, never written
    through."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:80]}.", suffix=".tmp")
    except OSError as exc:
        raise os_error(path, exc, "write") from None
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as fh:
            if isinstance(data, bytes):
                fh.write(data)
            else:
                fh.writelines(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise os_error(path, exc, "write") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def append_durably(path: Path, blob: bytes) -> None:
    """Append `blob` and fsync. A half-written last line (a writer died
    mid-write) is cut off first, so rows never run together. Refuses a
    symlinked file rather than appending to whatever it points at."""
    if not blob:
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o644)
    except OSError as exc:
        raise os_error(path, exc, "append to") from None
    try:
        end = os.lseek(fd, 0, os.SEEK_END)
        if end and os.pread(fd, 1, end - 1) != b"\n":
            # Find the last newline from the end, a block at a time.
            pos = end
            cut = 0
            while pos > 0:
                start = max(0, pos - 65536)
                chunk = os.pread(fd, pos - start, start)
                i = chunk.rfind(b"\n")
                if i >= 0:
                    cut = start + i + 1
                    break
                pos = start
            os.ftruncate(fd, cut)
            end = cut
        view = memoryview(blob)
        while view:
            written = os.pwrite(fd, view, end)
            view = view[written:]
            end += written
        os.fsync(fd)
    except OSError as exc:
        raise os_error(path, exc, "append to") from None
    finally:
        os.close(fd)


def read_bytes(path: Path) -> bytes:
    """A file's bytes, or an error naming it (a directory, unreadable, ...)."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise os_error(path, exc, "read") from None


def jsonl_lines(path: Path, data: bytes) -> Iterator[tuple[int, bytes, Any]]:
    """Each non-blank line of JSONL `data` read from `path`: its number, bytes and value.

    A line that is not JSON is an error naming file:line (the journal, which
    must survive a torn last line, has its own reader). A UTF-8 byte order
    mark on the first line is ignored.
    """
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
