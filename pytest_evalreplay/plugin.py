"""The pytest hooks of pytest-evalreplay. Thin by design: each hook hands
over to the module that owns the work (options, items, session, report)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_evalreplay import hookspecs, options, providers
from pytest_evalreplay.items import SESSION_KEY, TaskCollector
from pytest_evalreplay.model import EvalReplayError, Provider
from pytest_evalreplay.report import Summary, progress_printer
from pytest_evalreplay.session import EvalSession
from pytest_evalreplay.task import EvalTask


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def _output_dir(config: pytest.Config, settings: options.Settings) -> Path:
    if settings.output is not None:
        return settings.output
    cache = getattr(config, "cache", None)
    if cache is None:
        raise EvalReplayError(
            "pytest's cache is disabled (-p no:cacheprovider): pass --evalreplay-output=DIR "
            "(ini evalreplay_output) for the run dir and journal"
        )
    return Path(cache.mkdir("evalreplay"))


def _make_provider(config: pytest.Config, settings: options.Settings, kind: str) -> Provider:
    made = config.hook.pytest_evalreplay_make_provider(config=config, kind=kind)
    return made if made is not None else providers.make_builtin(kind, settings)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "evalreplay: an item of an LLM evaluation (pytest-evalreplay)")
    settings = options.resolve(config)
    tr = config.pluginmanager.get_plugin("terminalreporter")
    workerinput = getattr(config, "workerinput", {})
    session = EvalSession(
        settings=settings,
        output=lambda: _output_dir(config, settings),
        run_id=workerinput.get("evalreplay_run_id"),
        make_provider=lambda kind: _make_provider(config, settings, kind),
        notify=(lambda line: tr.write_line(line)) if tr is not None else (lambda line: None),
        progress=progress_printer(config, settings.quiet),
    )
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(EvalReplayPlugin(session), "evalreplay-session")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist: every worker of one run shares the controller's run id."""
    node.workerinput["evalreplay_run_id"] = node.config.stash[SESSION_KEY].run_id


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist: schedule each task's items to one worker (see distributed.py)."""
    from pytest_evalreplay.distributed import make_scheduler

    return make_scheduler(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> Any:
    if isinstance(obj, EvalTask):
        return TaskCollector.from_parent(collector, name=obj.name, task=obj)
    return None


class EvalReplayPlugin:
    """The hooks that need the session's state, registered per pytest session."""

    def __init__(self, session: EvalSession) -> None:
        self.session = session
        self.summary = Summary()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        try:
            if not session.config.option.collectonly:
                self.session.prepare_provider(session.items)
            self.session.register(session.items)
        except EvalReplayError as exc:
            raise pytest.UsageError(str(exc)) from None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.summary.add(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        try:
            self.session.finish()
        except EvalReplayError as exc:
            self.session.notes.append(f"run dir not written: {exc}")
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:  # a pytest-xdist worker: notes go to the controller
            workeroutput["evalreplay_notes"] = list(self.session.notes)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """pytest-xdist controller: gather the workers' notes for the summary."""
        for note in getattr(node, "workeroutput", {}).get("evalreplay_notes", []):
            if note not in self.session.notes:
                self.session.notes.append(note)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        self.summary.terminal(terminalreporter, self.session.notes)
        if self.session.settings.report is not None:
            self.summary.write_markdown(self.session.settings.report, self.session.notes)


@pytest.fixture(scope="session")
def replay_provider(pytestconfig: pytest.Config) -> Provider:
    """The replay provider over --evalreplay-predictions, for hand-written tests."""
    try:
        return pytestconfig.stash[SESSION_KEY].replay_provider()
    except EvalReplayError as exc:
        raise pytest.UsageError(str(exc)) from None
