"""The live progress line fits the terminal: on an 80-column terminal an
update rewrites one line in place instead of wrapping onto a new one."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_evalreplay.report.progress import ProgressSnapshot, TerminalProgress, progress_line

BUSY = ProgressSnapshot(
    task="gsm8k_cot_zeroshot_llama",
    elapsed=3725.0,
    done=12_345,
    total=98_765,
    samples=49_380,
    total_samples=395_060,
    failures=1_234,
    tokens=98_765_432,
)


def test_with_room_every_field_is_shown():
    line = progress_line(BUSY)
    assert line == (
        "evalreplay: gsm8k_cot_zeroshot_llama: 12,345/98,765 requests (49,380/395,060 samples), "
        "1,234 failed, 26,514 tok/s, 1:02:05 elapsed, ETA 7:14:36"
    )
    assert len(line) > 80  # what wrapped on an 80-column terminal


@pytest.mark.parametrize("width", [119, 100, 79, 60, 50, 40, 20])
def test_the_line_fits_and_drops_the_least_useful_fields_first(width):
    line = progress_line(BUSY, width)
    assert len(line) <= width, line
    assert "12,345/98,765" in line or width < 40
    if width >= 79:
        assert "1,234 failed" in line and "ETA 7:14:36" in line
        assert "samples" not in line  # the least useful field goes first


def test_drop_order():
    full = progress_line(BUSY)
    order = []
    for width in range(len(full), 30, -1):
        line = progress_line(BUSY, width)
        for field in ("samples", "tok/s", "elapsed", "evalreplay:", "ETA", "failed"):
            if field not in line and field not in order:
                order.append(field)
    assert order == ["samples", "tok/s", "elapsed", "evalreplay:", "ETA", "failed"]


SCORED = dataclasses.replace(BUSY, metric="exact_match=0.625")


def test_the_running_metric_is_shown_after_the_failures():
    line = progress_line(SCORED)
    assert "1,234 failed, exact_match=0.625, 26,514 tok/s" in line


def test_the_running_metric_outlasts_every_field_but_failures_and_requests():
    full = progress_line(SCORED)
    order = []
    for width in range(len(full), 30, -1):
        line = progress_line(SCORED, width)
        for field in ("samples", "tok/s", "elapsed", "evalreplay:", "ETA", "exact_match", "failed"):
            if field not in line and field not in order:
                order.append(field)
    assert order == ["samples", "tok/s", "elapsed", "evalreplay:", "ETA", "exact_match", "failed"]
    assert "exact_match=0.625" in progress_line(dataclasses.replace(SCORED, task="gsm8k"), 79)


class _Writer:
    def __init__(self, width: int) -> None:
        self.fullwidth = width


class _Reporter:
    isatty = True

    def __init__(self, width: int) -> None:
        self._tw = _Writer(width)
        self.lines: list[str] = []

    def rewrite(self, line: str, erase: bool = False) -> None:
        self.lines.append(line)

    def write(self, text: str) -> None:
        self.lines.append(text)

    def write_line(self, line: str) -> None:
        self.lines.append(line)


def _config(tr: Any) -> Any:
    plugins = {"terminalreporter": tr, "capturemanager": None}
    return SimpleNamespace(pluginmanager=SimpleNamespace(get_plugin=plugins.get))


def test_the_terminal_line_fits_an_80_column_terminal(monkeypatch):
    tr = _Reporter(80)
    progress = TerminalProgress(_config(tr), quiet=False, replay=False, interval=0.0)
    progress.interval = 0.0
    progress.start(BUSY.task, BUSY.total, BUSY.total_samples)
    progress.update(BUSY.task, BUSY.done, BUSY.samples, BUSY.failures, BUSY.tokens)
    (line,) = tr.lines
    assert 0 < len(line) < 80, line  # pytest's rewrite pads to width - 1
    assert "12,345/98,765 requests" in line
