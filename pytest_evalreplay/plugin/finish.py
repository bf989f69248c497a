"""The session's end as pytest shows it: the run dir written and the
provider closed before the summary (so what fails there is in its notes),
the summary handed to xdist's controller from a worker, and the terminal,
Markdown and HTML reports printed or written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_evalreplay.report.summary import Summary
    from pytest_evalreplay.run.session import EvalSession
    from pytest_evalreplay.settings import Settings


def finish(ev: EvalSession, summary: Callable[[], Summary], config: pytest.Config) -> None:
    """Write the run dir, close the provider, and fill the summary (a worker
    also puts it in `workeroutput` for its controller to print). `summary`
    builds it on first use: a session that ran no eval, wrote nothing and has
    nothing to say prints no summary and writes no report."""
    from pytest_evalreplay.model import EvalReplayError

    try:
        ev.finish()
    except EvalReplayError as exc:
        ev.notes.append(f"run dir not written: {exc}")
    ev.close_provider()  # before the summary, so a close() that fails is in its notes
    for name, doc in ev.docs.items():
        summary().add_doc(name, doc.seen, doc.doc, doc.extra())
    run_dir = None
    if ev.output_resolved is not None:
        from pytest_evalreplay.storage.files import shown_path

        run_dir = summary().run_dir = str(shown_path(ev.output_resolved))
    for note in ev.notes:
        summary().add_note(note)
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: the controller prints the summary
        workeroutput["evalreplay"] = {
            "docs": {n: [d.seen, d.doc, d.extra()] for n, d in ev.docs.items()},
            "notes": list(ev.notes),
            "run_dir": run_dir,
        }


def report(summary: Summary, settings: Settings, terminalreporter: pytest.TerminalReporter) -> None:
    """The terminal summary, then the Markdown and HTML reports asked for; a
    report that cannot be written is a line saying why, not a traceback."""
    if settings.compare is not None:
        summary.compare_with(settings.compare)
    summary.terminal(terminalreporter)
    if settings.report is not None:
        from pytest_evalreplay.model import EvalReplayError
        from pytest_evalreplay.report.summary import github_step_summary

        try:
            markdown = summary.write_markdown(settings.report)
            where = github_step_summary(markdown)
        except (EvalReplayError, OSError) as exc:
            terminalreporter.write_line(f"evalreplay: report not written: {exc}")
        else:
            if where is not None:
                terminalreporter.write_line(f"evalreplay: report appended to $GITHUB_STEP_SUMMARY ({where})")
    if settings.html is not None:
        write_html(summary, settings, terminalreporter, settings.html)


def write_html(
    summary: Summary, settings: Settings, terminalreporter: pytest.TerminalReporter, path: Path
) -> None:
    """The HTML report of the run dir this session wrote (with the gates'
    verdicts, which the run dir does not keep), or a line saying why not."""
    from pytest_evalreplay.model import EvalReplayError
    from pytest_evalreplay.report.html import write_report

    run_dir = summary.run_dir
    if run_dir is None or not summary.docs:
        terminalreporter.write_line("evalreplay: HTML report not written: this session ran no eval task")
        return
    try:
        size = write_report(path, Path(run_dir), settings.compare, summary.gates, option="--evalreplay-html")
    except (EvalReplayError, OSError) as exc:
        terminalreporter.write_line(f"evalreplay: HTML report not written: {exc}")
    else:
        terminalreporter.write_line(f"evalreplay: HTML report written to {path} ({size:,} bytes)")
