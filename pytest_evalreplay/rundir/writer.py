"""The run dir: its layout, the files written from the journal, the manifest,
and the lock that gives one session at a time the output dir.

Per task, `<task>-requests.jsonl`, `<task>-predictions.jsonl` and
`<task>-metrics.json` are written from the task's journal and its
`TaskOutcome` (never from a second log), in canonical order (instance order,
then stage), each atomically (`files.atomic_write`). So a resumed run leaves
the same files as an uninterrupted one, and a generation whose scorer failed
is still saved (a later run or a replay can score it). The rows are built,
and read back by replay and compare, in `runschema`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from filelock import Timeout

try:
    import fcntl
except ImportError:  # Windows: no flock; workers' claims are not taken there
    fcntl = None  # type: ignore[assignment]

from pytest_evalreplay.journal.index import GenRef, JournalIndex
from pytest_evalreplay.model import EvalReplayError, Generation, RequestKey
from pytest_evalreplay.numbers.metrics import TaskOutcome
from pytest_evalreplay.rundir.order import by_instance, saved_items
from pytest_evalreplay.storage.files import (
    NoFollowLock,
    atomic_write,
    link_error,
    not_own_dir,
    os_error,
    process_umask,
    refuse_link,
    remove_temporaries,
)
from pytest_evalreplay.storage.runschema import (
    FORMAT,
    MANIFEST,
    MANIFEST_LOCK,
    OWN_DIRS,
    SAVED_SAMPLING,
    SESSION_HOLDER,
    SESSION_LOCK,
    SESSION_WORKERS,
    WORKERS_GONE_WAIT,
    is_own_file,
    is_own_name,
    is_plain_generation,
    prediction_row,
    request_row,
    task_files,
)

# What pytest writes into the cache dir it creates: backup and indexing tools skip
# a tagged folder (https://bford.info/cachedir/), git ignores everything in it.
CACHEDIR_TAG = b"""Signature: 8a477f597d28d172789f06886806bc55
# This file is a cache directory tag created by pytest-evalreplay.
# For information about cache directory tags, see:
#	https://bford.info/cachedir/spec.html
"""
GITIGNORE = b"# Created by pytest-evalreplay automatically (delete this file to commit the run dir).\n*\n"


def _jsonl(rows: Iterable[Mapping[str, Any]]) -> Iterator[bytes]:
    return (orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows)


def write_task(
    directory: Path,
    outcome: TaskOutcome,
    run: str,
    index: JournalIndex,
    instance_order: Sequence[str],
    num_samples: int,
    metrics: bool = True,
    postprocess: Callable[[Generation], Generation] | None = None,
    doc_of: Callable[[str], Mapping[str, Any]] | None = None,
) -> None:
    """Write a task's three files from its outcome and journal (the caller
    holds the task lock). Only generations the outcome stands on are saved;
    `doc_of` gives each instance's document for its predictions rows (an
    lm-eval task's)."""
    for _, gen in saved_items(outcome.items):
        check_named_rows(index, gen)
    instances = by_instance(outcome.items, instance_order)  # each instance's items, in the row order

    # The sampling a replayed instance's generations were made with, when the
    # replay provider said it differs from the one asked (and they agree):
    # noted while the predictions are written, so each row is decoded once.
    made_with: dict[RequestKey, dict[str, Any]] = {}

    def note_sampling(key: RequestKey, gens: list[GenRef], generations: list[Generation]) -> None:
        if index.providers[gens[0].provider].get("kind") != "replay":
            return  # only replay serves what another sampling made
        found = {orjson.dumps(g.metadata.get(SAVED_SAMPLING)) for g in generations}
        saved = orjson.loads(found.pop()) if len(found) == 1 else None
        if saved is not None:
            made_with[key] = saved

    # Rows are streamed from the journal into the files, a line at a time, so
    # a large task's texts are never all in memory at once.
    def requests() -> Iterator[dict[str, Any]]:
        for pairs in instances:
            (stage, iid, _), gens = pairs[0][0].key, [gen for _, gen in pairs]
            content: dict[str, Any] = dict(index.request(gens[0].request) or {})
            if (saved := made_with.get((stage, iid))) is not None:
                content["sampling"] = saved
            yield request_row(iid, stage, content, num_samples)

    def predictions() -> Iterator[dict[str, Any]]:
        for pairs in instances:
            (stage, iid, _), gens = pairs[0][0].key, [gen for _, gen in pairs]
            gen_rows: Sequence[Any] | None = None if postprocess is not None else as_saved(index, gens, run)
            if gen_rows is None:
                generations = [index.generation(gen) for gen in gens]
                note_sampling((stage, iid), gens, generations)
                if postprocess is not None:
                    generations = [postprocess(g) for g in generations]
                gen_rows = [without_saved_sampling(g).to_row() for g in generations]
            yield prediction_row(
                iid,
                stage,
                outcome.model,
                gen_rows,
                [dict(i.scores) if i.status == "ok" and i.scores is not None else None for i, _ in pairs],
                [i.key[2] for i, _ in pairs],
                num_samples,
                {
                    n: v
                    for n, v in outcome.instance_scores.get(iid, {}).items()
                    if n in outcome.sample_metrics
                },
                None if doc_of is None else doc_of(iid),
            )

    files = task_files(directory, outcome.task)
    atomic_write(files["predictions"], _jsonl(predictions()))  # first: the requests rows take its sampling
    atomic_write(files["requests"], _jsonl(requests()))
    if metrics:
        atomic_write(files["metrics"], orjson.dumps(outcome.to_doc(run), option=orjson.OPT_INDENT_2))


_SAVED_SAMPLING_FIELD = orjson.dumps(SAVED_SAMPLING) + b":"


def as_saved(index: JournalIndex, gens: Sequence[GenRef], run: str) -> list[Any] | None:
    """The generations' rows as saved, where that is what decoding them into
    Generations and encoding them again writes, so the run dir need not build
    one per rollout: rows this run wrote (`Generation.to_row`), as the JSON
    the journal holds, and other runs' rows that are plain
    (`runschema.is_plain_generation`; an earlier run's row may be in an earlier
    version's layout), decoded; none with a saved sampling to move to the
    requests row. None: they are to be built."""
    saved: list[Any] = []
    for gen in gens:
        if gen.run == run:
            piece = index.generation_json(gen)
            if _SAVED_SAMPLING_FIELD in piece:
                return None
            saved.append(orjson.Fragment(piece))
            continue
        row = index.read_row(gen.offset, gen.length).get("generation")
        if not is_plain_generation(row) or SAVED_SAMPLING in row.get("metadata", ()):
            return None
        saved.append(row)
    return saved


def check_named_rows(index: JournalIndex, gen: GenRef) -> None:
    """A generation's request and provider rows must be in its journal (the
    writer appends them before it, in one write): without them the run dir
    cannot say what was asked, and replay would refuse what it wrote."""
    for name, table in (("request", index.requests), ("provider", index.providers)):
        if getattr(gen, name) not in table:
            raise EvalReplayError(
                f"{index.path}:{gen.lineno}: this gen row names {name} {getattr(gen, name)[:16]}..., and "
                f"the journal has no {name} row of that digest (were rows deleted by hand?); restore them, "
                "or delete the rows that name it, or run with --evalreplay-reset to discard this task's "
                "saved results"
            )


def without_saved_sampling(generation: Generation) -> Generation:
    """A replayed generation's saved sampling goes to its requests row, not
    its predictions row (which stays the saved one, byte for byte)."""
    if SAVED_SAMPLING not in generation.metadata:
        return generation
    metadata = {k: v for k, v in generation.metadata.items() if k != SAVED_SAMPLING}
    return dataclasses.replace(generation, metadata=metadata)


def write_manifest(
    directory: Path, model: str | None, provider: Mapping[str, Any], tasks: Iterable[str]
) -> None:
    """Merge this run's tasks into manifest.json (the caller holds the manifest lock)."""
    path = directory / MANIFEST
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        doc = {}
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        doc = {}
    known = doc.get("tasks") if isinstance(doc.get("tasks"), list) else []
    merged = sorted({str(t) for t in known} | set(tasks))
    doc.update({"format": FORMAT, "model": model, "provider": dict(provider), "tasks": merged})
    atomic_write(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2))


def prepare_output_dir(directory: Path) -> None:
    """An output dir is a directory we can write, created if missing. One the
    plugin creates is tagged as a cache dir, as pytest tags its own
    (`CACHEDIR.TAG`, a `.gitignore` of `*`); a directory that already exists
    is the user's and is left as it is. A link planted at one of the plugin's
    own names in it is refused."""
    if directory.is_symlink() and not directory.is_dir():
        raise EvalReplayError(f"--evalreplay-output {directory} is a dangling symlink; remove it")
    if directory.exists() and not directory.is_dir():
        raise EvalReplayError(
            f"--evalreplay-output {directory} exists and is not a directory; "
            "pass a directory (ini evalreplay_output)"
        )
    try:
        if not os.path.lexists(directory):
            _create_tagged(directory)
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_error(directory, exc, "create the output dir") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise EvalReplayError(f"--evalreplay-output {directory}: not writable; check its permissions")
    refuse_own_links(directory)


def _create_tagged(directory: Path) -> None:
    """The output dir with its tags, made whole in a private temporary dir and
    renamed into place (as pytest makes its cache dir), so a kill never leaves
    an untagged dir that a later run would take for the user's."""
    import shutil
    import tempfile

    parent = directory.parent
    if not parent.is_dir():
        if os.path.lexists(parent):  # a file on the way: the OS's own error, naming it
            directory.mkdir(parents=True)
        parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        (staging / "CACHEDIR.TAG").write_bytes(CACHEDIR_TAG)
        (staging / ".gitignore").write_bytes(GITIGNORE)
        staging.chmod(0o777 & ~process_umask())
        os.rename(staging, directory)
    except OSError:
        if not directory.is_dir():  # not another process that made it first
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def refuse_own_links(directory: Path) -> None:
    """A symlink at one of the plugin's own names in the output dir is an error
    naming it (each lock also refuses one when taken: this says so once, at the start)."""
    for name in OWN_DIRS:
        path = directory / name
        refuse_link(path)
        if os.path.lexists(path) and not path.is_dir():
            raise not_own_dir(path)
        if path.is_dir():  # a link planted among its locks would fail every item that takes one
            _refuse_links_in(path)
    _refuse_links_in(directory, lambda name: name.startswith(".") and name.endswith(".lock"))


def _refuse_links_in(directory: Path, named: Callable[[str], bool] = lambda name: True) -> None:
    try:
        with os.scandir(directory) as entries:
            links = [e.name for e in entries if named(e.name) and e.is_symlink()]
    except OSError as exc:
        raise os_error(directory, exc, "list") from None
    if links:
        raise link_error(directory / sorted(links)[0])


def manifest_lock(directory: Path) -> NoFollowLock:
    """The lock every writer of manifest.json holds."""
    return NoFollowLock(directory / MANIFEST_LOCK)


def refuse_self_replay(predictions: Path, output: Path) -> None:
    """Replaying a saved run never modifies it: its output dir must be elsewhere."""
    try:
        pred, out = predictions.resolve(), output.resolve()
    except OSError:
        return
    if pred == out or out in pred.parents:
        raise EvalReplayError(
            f"--evalreplay-predictions {predictions} is inside the output dir {output}: replaying a run "
            "into itself would overwrite what it replays. Pass --evalreplay-output=OTHER_DIR; or, to "
            "rescore that run with the current scorers, run with --resume and the provider that made it"
        )
    if pred.is_dir() and pred in out.parents:  # a saved file's neighbours are not the saved run
        raise EvalReplayError(
            f"the output dir {output} is inside the saved run {predictions}: a replay would write into "
            "what it replays. Pass --evalreplay-output=OTHER_DIR outside it"
        )


def refuse_writing_over_run_dir(
    output: Path, writes: Mapping[str, Path | None], reads: Mapping[str, Path | None]
) -> None:
    """Files a session writes at its end (`writes`, option -> path) never land
    on the run dir's own files, and a saved run it compares with (`reads`) is
    not the run dir this session overwrites."""
    try:
        out = output.resolve()
    except OSError:
        return
    for option, path in writes.items():
        if path is None:
            continue
        if is_own_file(path, out):
            target = path.resolve()
            raise EvalReplayError(
                f"--evalreplay-{option} {path} is one of the output dir's own files ({output}): writing "
                f"it would destroy saved results. Write it elsewhere, e.g. "
                f"--evalreplay-{option}={out.parent / target.name}"
            )
    for option, path in reads.items():
        if path is not None and (out == (target := path.resolve()) or out in target.parents):
            raise EvalReplayError(
                f"--evalreplay-{option} {path} is inside the output dir {output}: this run overwrites what "
                "it would compare with. Copy the saved run elsewhere first, or pass "
                "--evalreplay-output=OTHER_DIR"
            )


@dataclass
class SessionLock:
    """One pytest session at a time per output dir (xdist workers share their
    controller's). Held for the whole session with an OS file lock, which the
    OS releases if the process dies; who holds it is written beside it.

    Each xdist worker also holds a shared OS lock on SESSION_WORKERS for its
    whole life: the controller's lock goes with the controller, and a worker
    may outlive it for a moment (distributed.py stops orphans), so a new
    session also waits for every worker claim to go before it writes."""

    directory: Path
    run: str
    _lock: NoFollowLock | None = None
    _claim: int | None = None  # a worker's open descriptor on SESSION_WORKERS

    @property
    def holder_path(self) -> Path:
        return self.directory / SESSION_HOLDER

    def acquire(self) -> None:
        lock = NoFollowLock(self.directory / SESSION_LOCK, timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise EvalReplayError(
                f"the output dir {self.directory} is in use by another pytest session "
                f"({self.describe_holder()}); wait for it to end, or pass "
                "--evalreplay-output=OTHER_DIR (ini evalreplay_output)"
            ) from None
        try:
            self._wait_for_workers_gone()
        except BaseException:
            lock.release()
            raise
        self._lock = lock
        # No writer of the dir's own files runs now (they all run in a session
        # that holds it, or in its workers, all gone): what a killed one left
        # half written (a journal's header or compaction, a run dir file, the
        # manifest, a worker's collection line, this file) goes.
        remove_temporaries(self.directory, is_own_name)
        holder = {
            "run": self.run,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        atomic_write(self.holder_path, orjson.dumps(holder))

    def describe_holder(self) -> str:
        try:
            doc = orjson.loads(self.holder_path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return "holder unknown"
        if not isinstance(doc, dict):
            return "holder unknown"
        return (
            f"pid {doc.get('pid')} on {doc.get('host')}, started {doc.get('started')}, run {doc.get('run')}"
        )

    def check_held_by_run(self) -> None:
        """An xdist worker: the controller of this run must hold the lock."""
        try:
            doc = orjson.loads(self.holder_path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            doc = None
        if not isinstance(doc, dict) or doc.get("run") != self.run:
            raise EvalReplayError(
                f"the output dir {self.directory} is not held by this run's controller "
                f"({self.describe_holder()}); another session may be writing it"
            )

    def _open_claim(self) -> int | None:
        """SESSION_WORKERS opened without following a link (None where the OS
        has no flock: there, a dead controller's workers are not waited for)."""
        if fcntl is None:
            return None
        path = self.directory / SESSION_WORKERS
        refuse_link(path)
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            return os.open(path, flags, 0o644)
        except OSError as exc:
            if exc.errno == 40:  # ELOOP: a link planted after the check
                raise link_error(path) from None
            raise os_error(path, exc, "lock") from None

    def _wait_for_workers_gone(self) -> None:
        """The session lock is ours: wait (bounded) until no worker of an
        earlier session still holds its claim, else refuse."""
        fd = self._open_claim()
        if fd is None:
            return
        try:
            deadline = time.monotonic() + WORKERS_GONE_WAIT
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # type: ignore[union-attr]
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise EvalReplayError(
                            f"the output dir {self.directory} is still written by pytest-xdist workers of "
                            f"an earlier session ({self.describe_holder()}) {WORKERS_GONE_WAIT:.0f} s after "
                            "its controller ended; stop those worker processes, or pass "
                            "--evalreplay-output=OTHER_DIR (ini evalreplay_output)"
                        ) from None
                    time.sleep(0.05)
                else:
                    return
        finally:
            os.close(fd)  # closing drops the probe's exclusive lock

    def claim_for_worker(self) -> None:
        """An xdist worker: hold a shared claim on the output dir for as long
        as this process lives (the OS drops it when the process dies)."""
        if self._claim is not None:
            return
        fd = self._open_claim()
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # type: ignore[union-attr]
        except BlockingIOError:
            os.close(fd)
            raise EvalReplayError(
                f"the output dir {self.directory} is being taken by another pytest session "
                f"({self.describe_holder()}); this worker's controller no longer holds it"
            ) from None
        self._claim = fd

    def release(self) -> None:
        claim, self._claim = self._claim, None
        if claim is not None:
            with contextlib.suppress(OSError):
                os.close(claim)
        lock, self._lock = self._lock, None
        if lock is not None:
            with contextlib.suppress(OSError):
                self.holder_path.unlink(missing_ok=True)
            lock.release()
