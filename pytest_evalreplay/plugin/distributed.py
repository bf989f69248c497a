"""pytest-xdist: what the controller hands its workers and gathers back.

Registered only when xdist is installed. The controller holds the output
dir for the whole run and gives every worker the same run id and the same
resume snapshot (the journals' sizes when the run started), so workers
collect and decide identically. Workers share the work of every task under
any `--dist` mode: a chunk is generated once, by the first worker to reach
it, under the chunk's lock, and the others read it from the journal (see
session.py). Under `-n` without `--dist`, each worker also reports its
items' chunk groups and the controller schedules a chunk's items on one
worker (scheduling.py). Each worker sends its tasks' numbers back in `workeroutput`;
the controller's summary keeps, per task, the one computed from the
fullest journal.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson
import pytest

from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.settings import Settings

if TYPE_CHECKING:
    from pytest_evalreplay.report.summary import Summary
    from pytest_evalreplay.run.session import EvalSession

JOURNAL_SUFFIX = "-journal.jsonl"
EXIT_ORPHANED = 3  # a worker's exit status when its controller died (pytest's INTERNAL_ERROR)
COLLECTION_PREFIX = ".evalreplay-collection-"  # + worker id + .json: a worker's collection line


def snapshot(directory: Any) -> dict[str, int]:
    """Each journal's size now: workers read no further when deciding what to reuse."""
    sizes: dict[str, int] = {}
    try:
        paths = list(directory.glob(f"*{JOURNAL_SUFFIX}"))
    except OSError:
        return sizes
    for path in paths:
        task = path.name[: -len(JOURNAL_SUFFIX)]
        try:
            if path.is_file():
                sizes[task] = path.stat().st_size
        except OSError:
            continue
    return sizes


def _collection_file(directory: Path, worker: str) -> Path:
    return directory / f"{COLLECTION_PREFIX}{worker}.json"


def send_collection(
    directory: Path, workerinput: Mapping[str, Any], lines: list[str] | None, groups: list[int]
) -> None:
    """A worker's collection line, for its controller to print, and its
    items' chunk groups, for the controller's scheduler (scheduling.py):
    written before the worker reports its collection, so they are there when
    the controller hears."""
    from pytest_evalreplay.storage.files import atomic_write  # not on a plain run's start-up path

    with contextlib.suppress(OSError):
        body = orjson.dumps({"lines": lines or [], "groups": groups})
        atomic_write(_collection_file(directory, str(workerinput["workerid"])), body)


def item_groups(items: list[pytest.Item], runs: Mapping[str, Any], workers: int) -> list[int]:
    """A worker's items' chunk groups (scheduling.chunk_groups), from its plan."""
    from pytest_evalreplay.plugin.items import RolloutItem
    from pytest_evalreplay.plugin.scheduling import chunk_groups

    taskrun = sys.modules.get("pytest_evalreplay.run.taskrun")  # no TaskRun exists before it is imported
    plain = {
        name: run for name, run in runs.items() if taskrun is not None and isinstance(run, taskrun.TaskRun)
    }
    keys = [
        (item.task.name, (item.key[0], item.key[1]))
        if isinstance(item, RolloutItem) and item.task.name in plain
        else None
        for item in items
    ]
    return chunk_groups(
        keys,
        {name: run.chunk_of for name, run in plain.items()},
        {name: len(run.chunks) for name, run in plain.items()},
        workers,
    )


def take_collection(directory: Path, worker: str) -> tuple[list[str], list[int] | None]:
    """A worker's collection lines and chunk groups (None: it sent none)."""
    path = _collection_file(directory, worker)
    try:
        sent = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return [], None
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
    if not isinstance(sent, dict):
        return [], None
    lines, groups = sent.get("lines"), sent.get("groups")
    if not isinstance(groups, list) or not all(type(g) is int for g in groups):
        groups = None
    return ([str(line) for line in lines] if isinstance(lines, list) else []), groups


DIST_GIVEN = pytest.StashKey[bool]()  # the command line (or addopts) chose a --dist mode


def note_dist_choice(config: pytest.Config) -> None:
    """Before xdist turns `-n` into `--dist=load`: whether the user chose a mode."""
    option = config.option
    given = getattr(option, "dist", "no") != "no" or bool(getattr(option, "distload", False))
    config.stash[DIST_GIVEN] = given


ORPHAN_CHECK = 0.1  # seconds between a worker's checks that its controller lives


def _controller_alive(pid: int, parent: int) -> bool:
    if parent == pid:  # the usual case (popen workers): an orphan is re-parented at once,
        return os.getppid() == pid  # even while the dead controller is an unreaped zombie
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # alive, another user's
    return True


def watch_controller(pid: int, interval: float = ORPHAN_CHECK) -> threading.Thread:
    """A worker whose controller died (SIGKILL, OOM) stops at once: it would
    otherwise go on generating into a journal that a new session may already
    own. Rows already appended are in the file; nothing more is written."""
    parent = os.getppid()

    def watch() -> None:
        while _controller_alive(pid, parent):
            time.sleep(interval)
        os._exit(EXIT_ORPHANED)

    thread = threading.Thread(target=watch, name="evalreplay-controller-watch", daemon=True)
    thread.start()
    return thread


class PluginState(Protocol):
    """What these hooks read of the plugin (plugin.py's `EvalReplayPlugin`):
    named here so the plugin can register them without an import circle."""

    config: pytest.Config
    settings: Settings

    @property
    def session(self) -> EvalSession: ...

    @property
    def summary(self) -> Summary: ...


class XdistHooks:
    def __init__(self, plugin: PluginState) -> None:
        self.plugin = plugin
        self._prepared: dict[str, Any] | None = None
        self._watcher: Any = None
        self._collection_said = False
        self._groups: dict[str, list[int] | None] = {}  # worker id -> its items' chunk groups

    def _controller_state(self) -> dict[str, Any]:
        if self._prepared is None:
            session = self.plugin.session
            state: dict[str, Any] = {
                "evalreplay_run_id": session.run_id,
                "evalreplay_seed": session.seed,
                "evalreplay_controller_pid": os.getpid(),
            }
            if self.plugin.settings.in_play:
                try:
                    session.hold_output()
                except EvalReplayError as exc:
                    raise pytest.UsageError(str(exc)) from None
                state["evalreplay_snapshot"] = snapshot(session.output)
                from pytest_evalreplay.report.progress import clear_progress

                clear_progress(session.output)  # never through a link (prepare_output_dir refuses one)
            self._prepared = state
        return self._prepared

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        pid = getattr(session.config, "workerinput", {}).get("evalreplay_controller_pid")
        if pid is not None and self.plugin.settings.in_play:
            watch_controller(int(pid))

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput.update(self._controller_state())
        if self.plugin.settings.in_play:
            with contextlib.suppress(OSError):
                _collection_file(self.plugin.session.output, str(node.gateway.id)).unlink(missing_ok=True)
        settings = self.plugin.settings
        if (
            self._watcher is None
            and settings.in_play
            and not settings.quiet
            and settings.provider != "replay"
        ):
            from pytest_evalreplay.report.progress import ProgressWatcher

            self._watcher = ProgressWatcher(
                self.plugin.config, self.plugin.session.output, settings.progress_interval
            )
            self._watcher.start()

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """Print the first worker's collection line (every worker plans alike)
        and keep each worker's chunk groups for the scheduler."""
        if not self.plugin.settings.in_play:
            return
        worker = str(node.gateway.id)
        lines, self._groups[worker] = take_collection(self.plugin.session.output, worker)
        if self._collection_said or not lines:
            return
        self._collection_said = True
        reporter = self.plugin.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            for line in lines:
                reporter.write_line(line)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """`-n` without `--dist` in an eval session: a chunk's items on one
        worker (scheduling.py); an explicit `--dist` is xdist's own."""
        if config.stash.get(DIST_GIVEN, True) or not self.plugin.settings.in_play:
            return None
        from pytest_evalreplay.plugin.scheduling import ChunkScheduling

        return ChunkScheduling(config, log, self._groups)

    def pytest_sessionfinish(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        data = getattr(node, "workeroutput", {}).get("evalreplay")
        if not data:
            return
        summary = self.plugin.summary
        for task, (seen, doc, extra) in data.get("docs", {}).items():
            summary.add_doc(task, seen, doc, extra)
        for note in data.get("notes", []):
            summary.add_note(note)
        if data.get("run_dir"):
            summary.run_dir = data["run_dir"]
