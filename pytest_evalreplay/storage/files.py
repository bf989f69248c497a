"""Safe file I/O: the one atomic writer and the one durable append of the
package (its JSONL lines are read by `storage.lines`).

Everything the plugin writes lives in an output dir that other tools, other
sessions and users share, so writes never follow a link planted there:
temporary files are created exclusively (`O_EXCL`) in the target's own
directory and renamed into place, appends refuse a symlinked file
(`O_NOFOLLOW`), lock files and the plugin's own folders are refused when
they are links (`NoFollowLock`, `own_dir`), and every write is fsynced
before it counts. Journals are
the exception: `AppendFile` writes each group of rows to the OS at once (a
killed process loses nothing it wrote) and fsyncs within `SYNC_SECONDS`
from a background thread, since fsync guards against power loss only.
Reading turns every OS and JSON error into an `EvalReplayError` naming the
file (and line).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path

from filelock import FileLock, Timeout

try:
    import fcntl as _flock
except ImportError:  # Windows: filelock's locks throughout
    _flock = None  # type: ignore[assignment]

from pytest_evalreplay.model import EvalReplayError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
SYNC_SECONDS = 0.5  # the longest an appended row waits for its fsync
# The process umask, read once: files written atomically get the mode a plain
# open() would give them, not mkstemp's private 0600.


def process_umask() -> int:
    """The umask, read without changing process state (Linux: /proc/self/status);
    set and restored only where the OS does not say."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = process_umask()


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


def link_error(path: Path) -> EvalReplayError:
    """A link planted at one of the plugin's own names in the output dir."""
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return EvalReplayError(
        f"{path} is a symbolic link (to {target}): the plugin never follows a link inside its output "
        f"dir, so it neither writes nor deletes through it; remove the link (rm {path}) and run again, "
        "or pass --evalreplay-output=OTHER_DIR"
    )


def refuse_link(path: Path) -> None:
    """`path` (which may not exist yet) must not be a symlink."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise os_error(path, exc, "check") from None
    if stat.S_ISLNK(st.st_mode):
        raise link_error(path)


def shown_path(path: Path) -> Path:
    """A path as printed: with `.` and `..` folded (`a/../runs` -> `runs`)
    where that names the same folder, else resolved (a link before `..`
    leads elsewhere than folding says)."""
    folded = Path(os.path.normpath(path))
    try:
        return folded if os.path.samefile(folded, path) else path.resolve()
    except OSError:
        return path


def own_dir(path: Path) -> Path:
    """A folder the plugin keeps in the output dir, created if missing: never
    a link (writes or deletes there would reach the link's target)."""
    refuse_link(path)
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except OSError as exc:
        raise os_error(path, exc, "create") from None
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise os_error(path, exc, "create") from None
    if stat.S_ISLNK(st.st_mode):  # planted between the check and the mkdir
        raise link_error(path)
    if not stat.S_ISDIR(st.st_mode):
        raise not_own_dir(path)
    return path


def not_own_dir(path: Path) -> EvalReplayError:
    return EvalReplayError(
        f"{path}: expected a folder of the plugin's here, found a file; remove it and run again"
    )


class NoFollowLock:
    """An OS file lock on a file in the output dir, refused when a link sits
    at its name. Every OS error names the file. Reentrant, like FileLock.

    A blocking lock on POSIX is a `flock` on a descriptor kept open (opened
    with O_NOFOLLOW, never truncated): the task lock is taken once per
    journal write, and filelock's open-lock-close costs ten times more. A
    lock with a timeout is filelock's (from 3.20.1 it opens with O_NOFOLLOW
    too; before, it follows links and truncates, hence the check first)."""

    def __init__(self, path: Path, timeout: float = -1) -> None:
        self.path = path
        self._fast = _flock is not None and timeout == -1
        self._lock = None if self._fast else FileLock(str(path), timeout=timeout)
        self._fd: int | None = None
        self._depth = 0
        self._mutex = threading.RLock()  # one thread at a time holds it, as filelock's

    @property
    def is_locked(self) -> bool:
        return self._depth > 0 if self._lock is None else self._lock.is_locked

    def acquire(self) -> None:
        """Take the lock; filelock's `Timeout` when `timeout` runs out."""
        if self._lock is None:
            self._mutex.acquire()
            if self._depth == 0:
                try:
                    self._take()
                except BaseException:
                    self._mutex.release()
                    raise
            self._depth += 1
            return
        if not self._lock.is_locked:
            refuse_link(self.path)
        try:
            self._lock.acquire()
        except Timeout:
            raise
        except OSError as exc:
            raise self._error(exc) from None

    def _take(self) -> None:
        assert _flock is not None
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o644)
            _flock.flock(self._fd, _flock.LOCK_EX)
        except OSError as exc:
            raise self._error(exc) from None

    def _error(self, exc: OSError) -> EvalReplayError:
        if getattr(exc, "errno", None) == 40:  # ELOOP: the open met a link
            return link_error(self.path)
        return os_error(self.path, exc, "lock")

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            return
        self._depth -= 1
        if self._depth == 0 and self._fd is not None and _flock is not None:
            _flock.flock(self._fd, _flock.LOCK_UN)
        self._mutex.release()

    def __enter__(self) -> NoFollowLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)


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


def temporary_prefix(path: Path) -> str:
    """How `atomic_write`'s temporary files for `path` begin: the whole name
    (cut at 200 characters, so the temporary's own name fits the file
    system's 255), which `temporary_target` reads back."""
    return f".{path.name[:200]}."


def temporary_target(name: str) -> str | None:
    """The name of the file an `atomic_write` temporary named `name` was
    written for (None: not one): a folder's own files are known by their
    names' pattern (`runschema.is_own_name`), not listed."""
    if not (name.startswith(".") and name.endswith(".tmp")):
        return None
    target, dot, _ = name[1:-4].rpartition(".")  # mkstemp's random part has no dot
    return target if dot and target else None


def remove_temporaries(directory: Path, named: Callable[[str], bool]) -> None:
    """Remove the `atomic_write` temporaries in `directory` (not below it) of
    the files whose names `named` accepts: what writers killed mid-write left.
    Only for a caller that knows no writer of those files runs (the session
    that has just taken the output dir), or one could lose its rename. A
    temporary of a name over 200 characters names a cut name and stays."""
    try:
        stale = [
            e.path
            for e in os.scandir(directory)
            if (of := temporary_target(e.name)) and named(of) and e.is_file(follow_symlinks=False)
        ]
    except OSError:
        return
    for path in stale:
        with contextlib.suppress(OSError):
            os.unlink(path)


def atomic_write(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Replace `path` with `data` (bytes, or chunks written as they come, so a
    large file is never held whole): a fresh temporary file (created
    exclusively, so a planted symlink is never followed) is written, fsynced
    and renamed over `path`. A symlink at `path` is replaced, never written
    through."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temporary_prefix(path), suffix=".tmp")
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


def _cut_torn_tail(fd: int, end: int) -> int:
    """Cut a last line without its newline (a writer died mid-write); the new end."""
    if not end or os.pread(fd, 1, end - 1) == b"\n":
        return end
    pos, cut = end, 0
    while pos > 0:  # the last newline, a block at a time from the end
        start = max(0, pos - 65536)
        i = os.pread(fd, pos - start, start).rfind(b"\n")
        if i >= 0:
            cut = start + i + 1
            break
        pos = start
    os.ftruncate(fd, cut)
    return cut


class ReadFile:
    """A file kept open for positional reads, closed when dropped: a reader of
    many rows (the run dir reads back every generation) opens it once, not per row."""

    def __init__(self, path: Path) -> None:
        self._fd: int | None = None
        self._fd = os.open(path, os.O_RDONLY)

    def read(self, offset: int, length: int) -> bytes:
        assert self._fd is not None
        return os.pread(self._fd, length, offset)

    def __del__(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)


class AppendFile:
    """An append-only file kept open by one process: each `write` reaches
    the OS at once (one write(2) per call; the caller holds the file's lock,
    so writers of other processes never interleave), and is fsynced by the
    background syncer within `SYNC_SECONDS`, or at `sync`/`close`.

    A file replaced under it (another process rewrote or removed it) is
    reopened by name before the next write; a symlink there is refused."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._id: tuple[int, int] | None = None
        self._end = -1  # where this process's last write ended: the tail there is a whole line
        self._dirty = False
        self._mutex = threading.Lock()  # the fd against the syncer thread

    def _current_fd(self) -> int:
        """The open fd of the file now at `path` (reopened when it was replaced)."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
            now = (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None
        except FileNotFoundError:
            now = None
        if self._fd is not None and now == self._id:
            return self._fd
        self._close()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | _NOFOLLOW, 0o644)
        st = os.fstat(fd)
        with self._mutex:
            self._fd, self._id = fd, (st.st_dev, st.st_ino)
        return fd

    def write(self, blob: bytes) -> tuple[int, tuple[int, int] | None]:
        """Append `blob`; where it starts, and the (st_dev, st_ino) of the file it went to."""
        if not blob:
            return -1, None
        try:
            fd = self._current_fd()
            end = os.lseek(fd, 0, os.SEEK_END)
            start = end if end == self._end else _cut_torn_tail(fd, end)
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view) :]
        except OSError as exc:
            raise os_error(self.path, exc, "append to") from None
        self._end = start + len(blob)
        with self._mutex:
            first = not self._dirty
            self._dirty = True
        if first:
            _SYNCER.due(self)
        return start, self._id

    def sync(self) -> None:
        """fsync what was written since the last sync, if anything. The fd is
        duplicated under the mutex, so the syncer never fsyncs a closed (or
        reused) descriptor and a write never waits for a disk."""
        with self._mutex:
            if not self._dirty or self._fd is None:
                return
            fd = os.dup(self._fd)
            self._dirty = False
        try:
            os.fsync(fd)
        except OSError as exc:
            with self._mutex:
                self._dirty = True  # still unsynced: the writer's own sync raises it again
            raise os_error(self.path, exc, "sync") from None
        finally:
            os.close(fd)

    def _close(self) -> None:
        with self._mutex:
            fd, self._fd, self._id, self._end = self._fd, None, None, -1
            dirty, self._dirty = self._dirty, False
        if fd is not None:
            try:
                if dirty:
                    os.fsync(fd)
            finally:
                os.close(fd)

    def close(self) -> None:
        """fsync what is unsynced and close the file."""
        try:
            self._close()
        except OSError as exc:
            raise os_error(self.path, exc, "sync") from None


class _Syncer:
    """One daemon thread per process that fsyncs each written `AppendFile`
    `SYNC_SECONDS` after its first unsynced write: fsync is grouped without
    waiting for the next write."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: weakref.WeakSet[AppendFile] = weakref.WeakSet()
        self._thread: threading.Thread | None = None

    def due(self, file: AppendFile) -> None:
        with self._cond:
            self._due.add(file)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="evalreplay-fsync", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._due:
                    self._cond.wait()
            time.sleep(SYNC_SECONDS)  # let the group gather
            with self._cond:
                files, self._due = list(self._due), weakref.WeakSet()
            for file in files:
                with contextlib.suppress(OSError, EvalReplayError):
                    file.sync()


_SYNCER = _Syncer()


def read_bytes(path: Path) -> bytes:
    """A file's bytes, or an error naming it (a directory, unreadable, ...)."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise os_error(path, exc, "read") from None
