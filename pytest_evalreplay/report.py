"""Reporting: the terminal summary, the Markdown report and progress lines.

The summary is built from test reports alone (their `user_properties`), so it
reads the same in one process and on the pytest-xdist controller.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_evalreplay.model import RolloutResult, aggregate


@dataclass
class TaskTally:
    instances: set[str] = field(default_factory=set)
    passed: int = 0
    failed: int = 0
    reused: int = 0
    results: list[RolloutResult] = field(default_factory=list)

    @property
    def items(self) -> int:
        return self.passed + self.failed + self.reused

    @property
    def metrics(self) -> dict[str, float]:
        return aggregate(self.results)[0]


@dataclass
class Summary:
    tasks: dict[str, TaskTally] = field(default_factory=dict)
    gates: dict[str, tuple[bool, str]] = field(default_factory=dict)  # task -> (passed, verdict)

    def add(self, report: pytest.TestReport) -> None:
        props: Mapping[str, Any] = dict(report.user_properties)
        gated = props.get("evalreplay.gate")
        if gated is not None:
            if report.when == "call" or report.failed:
                text = props.get("gate.summary") or f"FAIL {report.longreprtext.strip()}"
                self.gates[str(gated)] = (report.passed, str(text))
            return
        task = props.get("evalreplay.task")
        if task is None:
            return
        reused = bool(props.get("evalreplay.reused")) and report.when == "setup" and report.skipped
        if report.when != "call" and not report.failed and not reused:
            return
        tally = self.tasks.setdefault(str(task), TaskTally())
        tally.instances.add(str(props["evalreplay.instance"]))
        if report.failed:
            tally.failed += 1
            return
        if reused:
            tally.reused += 1
        else:
            tally.passed += 1
        scores = {k.removeprefix("score."): float(v) for k, v in props.items() if k.startswith("score.")}
        tally.results.append(
            RolloutResult(
                task=str(task),
                stage=int(props["evalreplay.stage"]),
                instance_id=str(props["evalreplay.instance"]),
                rollout=int(props["evalreplay.rollout"]),
                scores=scores,
            )
        )

    def rows(self) -> list[tuple[str, int, int, int, int, str]]:
        out = []
        for name, t in sorted(self.tasks.items()):
            metrics = ", ".join(f"{k}={v:.4f}" for k, v in t.metrics.items()) or "-"
            out.append((name, len(t.instances), t.items, t.failed, t.reused, metrics))
        return out

    def terminal(self, tr: pytest.TerminalReporter, notes: list[str]) -> None:
        if not self.tasks and not self.gates and not notes:
            return
        tr.write_sep("=", "evalreplay summary")
        for name, instances, items, failed, reused, metrics in self.rows():
            tr.write_line(
                f"{name}: {instances} instances, {items} items, {failed} failed, {reused} reused | {metrics}"
            )
        for name, (_, verdict) in sorted(self.gates.items()):
            tr.write_line(f"gate {name}: {verdict}")
        for note in notes:
            tr.write_line(f"note: {note}")

    def markdown(self, notes: list[str]) -> str:
        lines = [
            "# evalreplay summary",
            "",
            "| task | instances | items | failed | reused | metrics |",
            "|---|---:|---:|---:|---:|---|",
        ]
        lines += [f"| {n} | {i} | {it} | {f} | {r} | {m} |" for n, i, it, f, r, m in self.rows()]
        if self.gates:
            lines += ["", "| gate | verdict | details |", "|---|---|---|"]
            for name, (passed, verdict) in sorted(self.gates.items()):
                details = verdict.split(" ", 1)[1].replace("\n", "<br>") if " " in verdict else verdict
                lines.append(f"| {name} | {'pass' if passed else '**FAIL**'} | {details} |")
        if notes:
            lines += ["", *[f"- {note}" for note in notes]]
        return "\n".join(lines) + "\n"

    def write_markdown(self, path: Path, notes: list[str]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.markdown(notes), encoding="utf-8")


def progress_printer(config: pytest.Config, quiet: bool) -> Callable[[str, int, int, int, float], None]:
    """A per-batch progress line: requests done / total and tokens per second.

    Batches run inside an item, where output is captured: the line is written
    with capture suspended, as pytest's own live logging does."""
    tr = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")

    def show(task: str, done: int, total: int, tokens: int, seconds: float) -> None:
        if tr is None or quiet:
            return
        rate = f", {tokens / seconds:,.0f} tok/s" if tokens and seconds > 0 else ""
        line = f"evalreplay: {task}: {done}/{total} requests generated in {seconds:.1f}s{rate}"
        if capman is None:
            tr.write_line(line)
            return
        with capman.global_and_fixture_disabled():
            tr.write_line(line)

    return show
