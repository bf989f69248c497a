"""Live generation progress: a line per task on the terminal (`TerminalProgress`),
and under pytest-xdist the workers' progress files (`FileProgress`) that the
controller reads and prints (`ProgressWatcher`).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.storage.files import atomic_write, own_dir, remove_temporaries
from pytest_evalreplay.storage.runschema import PROGRESS_DIR

TTY_INTERVAL = 0.25
WORKER_FILE = re.compile(r"gw[0-9]+\.json")  # a progress file's name: the xdist worker id
_PROGRESS_KEYS = ("task", "elapsed", "requests", "total", "samples", "total_samples", "failures", "tokens")
PREFIX = "evalreplay: "


@dataclass(frozen=True)
class ProgressSnapshot:
    """One task's generation progress at one moment."""

    task: str
    elapsed: float
    done: int
    total: int
    samples: int
    total_samples: int
    failures: int
    tokens: int
    metric: str = ""  # the task's first metric over what is scored so far, e.g. "acc=0.625"


def progress_line(snap: ProgressSnapshot, width: int | None = None, prefix: str = PREFIX) -> str:
    """The progress line, in at most `width` characters: a line that wraps
    adds a line per update instead of rewriting one, so fields are dropped,
    least useful first (samples, tok/s, elapsed, the "evalreplay:" prefix,
    ETA, the running metric, failures), then the task name is cut; requests
    done/total stay."""
    samples = f"({snap.samples:,}/{snap.total_samples:,} samples)"
    fields: list[tuple[str, str]] = [("failed", f"{snap.failures:,} failed")]  # most useful first
    if snap.metric:
        fields.append(("metric", snap.metric))
    if snap.tokens and snap.elapsed > 0:
        fields.append(("rate", f"{snap.tokens / snap.elapsed:,.0f} tok/s"))
    fields.append(("elapsed", f"{_clock(snap.elapsed)} elapsed"))
    if 0 < snap.done < snap.total and snap.elapsed > 0:
        fields.append(("eta", f"ETA {_clock(snap.elapsed * (snap.total - snap.done) / snap.done)}"))
    drop_order = ["samples", "rate", "elapsed", "prefix", "eta", "metric", "failed"]
    kept = {"samples", "prefix", *(name for name, _ in fields)}
    task = snap.task

    def build() -> str:
        head = f"{prefix if 'prefix' in kept else ''}{task}: {snap.done:,}/{snap.total:,} requests"
        if "samples" in kept:
            head += f" {samples}"
        return ", ".join([head, *(text for name, text in fields if name in kept)])

    line = build()
    for name in drop_order:
        if width is None or len(line) <= width:
            return line
        kept.discard(name)
        line = build()
    if width is not None and len(line) > width:
        task = _cut(task, max(len(task) - (len(line) - width), 4))
        line = build()
    return line if width is None else line[:width]


def line_width(tr: Any) -> int | None:
    """The longest line that neither wraps nor, rewritten in place, spills:
    pytest's `rewrite` pads a line to the terminal's width less one column."""
    full = getattr(getattr(tr, "_tw", None), "fullwidth", None)
    return full - 1 if isinstance(full, int) and full > 1 else None


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


class TerminalProgress:
    """Live generation progress, per task: requests done / total, samples,
    failures, tokens per second, elapsed and ETA. On a terminal one line that
    updates in place; in a log, a line every `interval` seconds; nothing under
    -q. Written with capture suspended, as pytest's live logging does."""

    def __init__(self, config: pytest.Config, quiet: bool, replay: bool, interval: float) -> None:
        self.tr = config.pluginmanager.get_plugin("terminalreporter")
        self.capman = config.pluginmanager.get_plugin("capturemanager")
        self.enabled = self.tr is not None and not quiet and not replay
        self.tty = bool(self.tr is not None and getattr(self.tr, "isatty", False))
        self.interval = TTY_INTERVAL if self.tty else interval
        self._state: dict[
            str, tuple[float, float, int, int]
        ] = {}  # task -> (start, last shown, req, samples)
        self._metric: dict[str, str] = {}

    def start(self, task: str, requests: int, samples: int) -> None:
        now = time.monotonic()
        self._state[task] = (now, now, requests, samples)

    def update(self, task: str, requests: int, samples: int, failures: int, tokens: int) -> None:
        if not self.enabled or task not in self._state:
            return
        start, last, total, total_samples = self._state[task]
        now = time.monotonic()
        if now - last < self.interval:
            return
        self._state[task] = (start, now, total, total_samples)
        snap = ProgressSnapshot(
            task,
            now - start,
            requests,
            total,
            samples,
            total_samples,
            failures,
            tokens,
            self._metric.get(task, ""),
        )
        self._show(progress_line(snap, self.width()), False)

    def metric(self, task: str, text: str) -> None:
        self._metric[task] = text

    def end(self, task: str) -> None:
        state = self._state.pop(task, None)
        if self.enabled and self.tty and state is not None:
            self._show("", True)

    def width(self) -> int | None:
        return line_width(self.tr) if self.tty else None

    def _show(self, line: str, final: bool) -> None:
        assert self.tr is not None

        def write() -> None:
            if self.tty:
                if final:
                    self.tr.write("\n")
                else:
                    self.tr.rewrite(line, erase=True)
            else:
                self.tr.write_line(line)

        if self.capman is None:
            write()
            return
        with self.capman.global_and_fixture_disabled():
            write()


class FileProgress:
    """A pytest-xdist worker's progress, written where the controller reads it
    (`<output>/.evalreplay-progress/<worker>.json`), at most every `interval`."""

    def __init__(self, directory: Callable[[], Path], worker: str, interval: float) -> None:
        self._directory = directory
        self.worker = worker
        self.interval = interval
        self._start: dict[str, tuple[float, int, int]] = {}
        self._metric: dict[str, str] = {}
        self._last = 0.0

    def _write(self, doc: dict[str, Any]) -> None:
        try:
            folder = own_dir(self._directory() / PROGRESS_DIR)  # never a link
            atomic_write(folder / f"{self.worker}.json", orjson.dumps(doc))
        except (OSError, EvalReplayError):
            pass  # progress is a courtesy: never fail a run over it

    def start(self, task: str, requests: int, samples: int) -> None:
        self._start[task] = (time.monotonic(), requests, samples)

    def update(self, task: str, requests: int, samples: int, failures: int, tokens: int) -> None:
        now = time.monotonic()
        if task not in self._start or now - self._last < self.interval / 2:
            return
        self._last = now
        start, total, total_samples = self._start[task]
        self._write(
            {
                "task": task,
                "requests": requests,
                "total": total,
                "samples": samples,
                "total_samples": total_samples,
                "failures": failures,
                "tokens": tokens,
                "metric": self._metric.get(task, ""),
                "elapsed": now - start,
                "seq": now,
            }
        )

    def metric(self, task: str, text: str) -> None:
        self._metric[task] = text

    def end(self, task: str) -> None:
        self._start.pop(task, None)
        self._write({"task": task, "done": True, "seq": time.monotonic()})


def clear_progress(directory: Path) -> None:
    """An earlier run's progress files go before the workers start: only the
    names workers write (`gw<N>.json`) and the temporaries of a worker killed
    writing one, in the progress folder itself (the output dir refused a link
    at its name; a link in it is removed, never followed)."""
    folder = directory / PROGRESS_DIR
    remove_temporaries(folder, WORKER_FILE.fullmatch)
    try:
        names = [e.name for e in os.scandir(folder) if WORKER_FILE.fullmatch(e.name)]
    except OSError:
        return
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(folder / name)


class ProgressWatcher:
    """The pytest-xdist controller's view of its workers' generation progress:
    a thread reads their progress files every `interval` seconds and writes a
    line per worker that moved."""

    def __init__(self, config: pytest.Config, directory: Path, interval: float) -> None:
        self.tr = config.pluginmanager.get_plugin("terminalreporter")
        self.folder = directory / PROGRESS_DIR
        self.interval = max(interval, 0.2)
        self._stop = threading.Event()
        self._seen: dict[str, float] = {}
        self._thread = threading.Thread(target=self._run, name="evalreplay-progress", daemon=True)

    def width(self) -> int | None:
        return line_width(self.tr) if getattr(self.tr, "isatty", False) else None

    def start(self) -> None:
        if self.tr is not None:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for line in self.poll():
                self.tr.write_line(line)

    def poll(self) -> list[str]:
        lines = []
        try:  # only the workers' own files: anything else in the folder is not ours to read
            paths = sorted(p for p in self.folder.iterdir() if WORKER_FILE.fullmatch(p.name))
        except OSError:
            return lines
        for path in paths:
            try:
                doc = orjson.loads(path.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue
            if not isinstance(doc, dict) or not all(k in doc for k in _PROGRESS_KEYS):
                continue
            seq = doc.get("seq", 0)
            if doc.get("done") or self._seen.get(path.stem) == seq:
                continue
            self._seen[path.stem] = seq
            snap = ProgressSnapshot(
                doc["task"],
                doc["elapsed"],
                doc["requests"],
                doc["total"],
                doc["samples"],
                doc["total_samples"],
                doc["failures"],
                doc["tokens"],
                doc["metric"] if isinstance(doc.get("metric"), str) else "",
            )
            lines.append(progress_line(snap, self.width(), prefix=f"{PREFIX}[{path.stem}] "))
        return lines


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
