"""Reporting: the terminal summary, the Markdown report and live progress.

The summary prints each task's `TaskDoc` (its metrics.json, computed once by
`metrics.task_outcome`; on the pytest-xdist controller, shipped from the
workers), so the terminal, the Markdown report, metrics.json and the gates
show the same numbers.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from pytest_evalreplay.files import atomic_write
from pytest_evalreplay.model import EvalReplayError

PROGRESS_INTERVAL = 15.0  # seconds between progress lines in a non-terminal log
TTY_INTERVAL = 0.25
PROGRESS_DIR = ".evalreplay-progress"


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def _metric_text(doc: Mapping[str, Any]) -> str:
    metrics: Mapping[str, float] = doc.get("metrics") or {}
    cis: Mapping[str, Sequence[float]] = doc.get("ci95") or {}
    parts = []
    for name, value in metrics.items():
        ci = cis.get(name)
        parts.append(f"{name}={value:.4f}" + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else ""))
    return ", ".join(parts) or "no scores"


def _tokens_text(doc: Mapping[str, Any]) -> str | None:
    tokens = (doc.get("session") or {}).get("tokens") or {}
    parts = []
    for kind in ("generated", "reused"):
        t = tokens.get(kind) or {}
        if t.get("prompt") or t.get("completion"):
            parts.append(f"{t.get('prompt', 0):,} prompt + {t.get('completion', 0):,} completion {kind}")
    return "tokens: " + "; ".join(parts) if parts else None


def task_line(doc: Mapping[str, Any], extra: Mapping[str, int] | None = None) -> str:
    """One task's summary line (plurals right, nothing that is not there)."""
    items, failed, missing = doc.get("num_items", 0), doc.get("num_failed", 0), doc.get("num_missing", 0)
    counts = [plural(doc.get("num_instances", 0), "instance"), plural(items, "item"), f"{failed:,} failed"]
    if missing:
        counts.append(f"{missing:,} missing")
    session = doc.get("session") or {}
    done = [f"{session.get('generated', 0):,} generated", f"{session.get('reused', 0):,} reused"]
    extra = extra or {}
    if extra.get("changed_request"):
        done.append(f"{extra['changed_request']:,} regenerated (request changed)")
    if extra.get("changed_provider"):
        done.append(f"{extra['changed_provider']:,} regenerated (provider changed)")
    line = f"{doc['task']}: {', '.join(counts)} | {', '.join(done)} | {_metric_text(doc)}"
    tokens = _tokens_text(doc)
    return line + (f" | {tokens}" if tokens else "")


def _num(value: Any, fmt: str = ".0f") -> str:
    return "-" if value is None else format(value, fmt)


def stage_rows(doc: Mapping[str, Any]) -> list[list[str]]:
    """An ELO eval's per-stage table: references, tasks, judged pairs,
    wins/ties/losses, rating +- SE (cumulative over the stages so far), interval."""
    rows = []
    for st in (doc.get("elo") or {}).get("stages", []):
        lo, hi = (st.get("ci95") or [None, None])[:2]
        rows.append(
            [
                str(st["stage"]) + ("" if st.get("complete") else " (incomplete)"),
                ", ".join(st.get("references", [])) or "-",
                str(len(st.get("task_ids", []))),
                str(st.get("judged", 0))
                + (f" ({st['no_answer']} without a reference answer)" if st.get("no_answer") else ""),
                f"{st.get('wins', 0)}/{st.get('ties', 0)}/{st.get('losses', 0)}",
                f"{_num(st.get('rating'))} +- {_num(st.get('se'))}",
                f"[{_num(lo)}, {_num(hi)}]",
            ]
        )
    return rows


STAGE_HEADER = ["stage", "references", "tasks", "judged pairs", "W/T/L", "rating +- SE", "95% interval"]


def elo_lines(doc: Mapping[str, Any]) -> list[str]:
    elo = doc.get("elo")
    if not elo:
        return []
    rows = stage_rows(doc)
    widths = [max(len(r[i]) for r in [STAGE_HEADER, *rows]) for i in range(len(STAGE_HEADER))]
    out = ["  " + "  ".join(h.ljust(w) for h, w in zip(STAGE_HEADER, widths, strict=True))]
    out += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    final = f"  rating {_num(elo.get('rating'))}"
    if elo.get("se") is not None:
        final += f" +- {_num(elo.get('se'))}"
    lo, hi = (elo.get("ci95") or [None, None])[:2]
    final += f", 95% interval [{_num(lo)}, {_num(hi)}] ({elo.get('interval')}), seed {elo.get('seed')}"
    out.append(final)
    if elo.get("note"):
        out.append(f"  note: {elo['note']}")
    return out


@dataclass
class Summary:
    """What the summary and the report show, gathered as the session goes."""

    docs: dict[str, tuple[int, dict[str, Any], dict[str, int]]] = field(default_factory=dict)
    gates: dict[str, tuple[bool, str]] = field(default_factory=dict)  # task -> (passed, verdict)
    notes: list[str] = field(default_factory=list)
    run_dir: str | None = None
    comparison: tuple[list[str], str] | None = None  # terminal lines, Markdown

    def compare_with(self, saved: Path, top: int = 20) -> None:
        """Compare this run's tasks (as its run dir holds them) with a saved run dir."""
        from pytest_evalreplay.compare import (
            RunSnapshot,
            compare_runs,
            load_run_dir,
            render_markdown,
            render_text,
        )

        if not self.docs or self.run_dir is None:
            return
        try:
            base, new = load_run_dir(saved), load_run_dir(Path(self.run_dir))
        except EvalReplayError as exc:
            self.add_note(f"comparison with {saved} not made: {exc}")
            return
        names = set(self.docs)
        cmp = compare_runs(
            RunSnapshot(base.label, {t: v for t, v in base.tasks.items() if t in names}, base.model),
            RunSnapshot("this run", {t: v for t, v in new.tasks.items() if t in names}, new.model),
        )
        self.comparison = (render_text(cmp, top=top), render_markdown(cmp))

    def add_doc(self, task: str, seen: int, doc: dict[str, Any], extra: dict[str, int]) -> None:
        """Keep the fullest view of a task (xdist workers each send theirs)."""
        known = self.docs.get(task)
        if known is None or seen >= known[0]:
            self.docs[task] = (seen, doc, extra)

    def add_note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    def add_report(self, report: pytest.TestReport) -> None:
        props: Mapping[str, Any] = dict(report.user_properties)
        gated = props.get("evalreplay.gate")
        if gated is None or not (report.when == "call" or report.failed):
            return
        text = props.get("gate.summary") or f"FAIL {report.longreprtext.strip()}"
        self.gates[str(gated)] = (report.passed, str(text))

    def lines(self) -> list[str]:
        out = [f"run dir: {self.run_dir}"] if self.run_dir and self.docs else []
        for _, (_, doc, extra) in sorted(self.docs.items()):
            out.append(task_line(doc, extra))
            out.extend(elo_lines(doc))
        out += [f"gate {name}: {verdict}" for name, (_, verdict) in sorted(self.gates.items())]
        if self.comparison is not None:
            out += self.comparison[0]
        out += [f"note: {note}" for note in self.notes]
        return out

    def terminal(self, tr: pytest.TerminalReporter) -> None:
        lines = self.lines()
        if not lines:
            return
        tr.write_sep("=", "evalreplay summary")
        for line in lines:
            tr.write_line(line)

    def markdown(self) -> str:
        lines = ["# evalreplay summary", ""]
        if self.run_dir:
            lines += [f"Run dir: `{self.run_dir}`", ""]
        lines += [
            "| task | items | failed | missing | generated | reused | metrics |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for _, (_, d, _) in sorted(self.docs.items()):
            lines.append(
                f"| {d['task']} | {d.get('num_items', 0)} | {d.get('num_failed', 0)} "
                f"| {d.get('num_missing', 0)} "
                f"| {d.get('session', {}).get('generated', 0)} | {d.get('session', {}).get('reused', 0)} "
                f"| {_metric_text(d)} |"
            )
        for _, (_, d, _) in sorted(self.docs.items()):
            rows = stage_rows(d)
            if rows:
                lines += ["", f"## {d['task']}: stages", "", "| " + " | ".join(STAGE_HEADER) + " |"]
                lines.append("|" + "---|" * len(STAGE_HEADER))
                lines += ["| " + " | ".join(r) + " |" for r in rows]
        if self.gates:
            lines += ["", "| gate | verdict | details |", "|---|---|---|"]
            for name, (passed, verdict) in sorted(self.gates.items()):
                details = verdict.split(" ", 1)[1] if " " in verdict else verdict
                details = details.replace("|", "\\|").replace("\n", "<br>")
                lines.append(f"| {name} | {'pass' if passed else '**FAIL**'} | {details} |")
        if self.comparison is not None:
            lines += ["", self.comparison[1].rstrip()]
        if self.notes:
            lines += ["", *[f"- {note}" for note in self.notes]]
        return "\n".join(lines) + "\n"

    def write_markdown(self, path: Path) -> str:
        if path.is_dir():
            raise EvalReplayError(f"--evalreplay-report {path} is a directory; name a file such as report.md")
        markdown = self.markdown()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise EvalReplayError(
                f"--evalreplay-report {path}: cannot create its folder ({exc.strerror})"
            ) from None
        atomic_write(path, markdown.encode())
        return markdown


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
        self._show(
            self._line(task, now - start, requests, total, samples, total_samples, failures, tokens), False
        )

    def end(self, task: str) -> None:
        state = self._state.pop(task, None)
        if self.enabled and self.tty and state is not None:
            self._show("", True)

    @staticmethod
    def _line(
        task: str,
        elapsed: float,
        done: int,
        total: int,
        samples: int,
        total_samples: int,
        failures: int,
        tokens: int,
    ) -> str:
        rate = f", {tokens / elapsed:,.0f} tok/s" if tokens and elapsed > 0 else ""
        eta = ""
        if 0 < done < total and elapsed > 0:
            eta = f", ETA {_clock(elapsed * (total - done) / done)}"
        return (
            f"evalreplay: {task}: {done:,}/{total:,} requests ({samples:,}/{total_samples:,} samples), "
            f"{failures:,} failed{rate}, {_clock(elapsed)} elapsed{eta}"
        )

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
        self._last = 0.0

    def _write(self, doc: dict[str, Any]) -> None:
        try:
            folder = self._directory() / PROGRESS_DIR
            folder.mkdir(exist_ok=True)
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
                "elapsed": now - start,
                "seq": now,
            }
        )

    def end(self, task: str) -> None:
        self._start.pop(task, None)
        self._write({"task": task, "done": True, "seq": time.monotonic()})


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
        try:
            paths = sorted(self.folder.glob("*.json"))
        except OSError:
            return lines
        for path in paths:
            try:
                doc = orjson.loads(path.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue
            seq = doc.get("seq", 0)
            if doc.get("done") or self._seen.get(path.stem) == seq:
                continue
            self._seen[path.stem] = seq
            line = TerminalProgress._line(
                doc["task"],
                doc["elapsed"],
                doc["requests"],
                doc["total"],
                doc["samples"],
                doc["total_samples"],
                doc["failures"],
                doc["tokens"],
            )
            lines.append(line.replace("evalreplay: ", f"evalreplay: [{path.stem}] ", 1))
        return lines


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def github_step_summary(markdown: str) -> Path | None:
    """Append the report to $GITHUB_STEP_SUMMARY when GitHub Actions sets it."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    path = Path(target)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(markdown)
    return path
