"""The pytest hooks of pytest-evalreplay. Thin by design: each hook hands
over to the module that owns the work (options, items, session, report).

Nothing heavy is imported or registered until a session uses the plugin: a
plain pytest run in an environment where it is installed imports this
module, the hook specs and the option table, checks that no option is given,
and looks up two modules per collected module attribute. The settings, the
data model (`EvalReplayError` included: imported where it is caught) and
xdist's hooks (only under -n/--dist) wait for a session that needs them.
"""

from __future__ import annotations

import gc
import sys
from typing import TYPE_CHECKING, Any

import pytest

from pytest_evalreplay.plugin import hookspecs, options

if TYPE_CHECKING:
    from pytest_evalreplay.plugin.collection import Planned
    from pytest_evalreplay.report.summary import Summary
    from pytest_evalreplay.run.session import EvalSession
    from pytest_evalreplay.settings import Settings

_PLUGIN_NAME = "evalreplay-session"
GC_OLD_FACTOR = 10  # an eval session's full garbage collections: this many times rarer (evals_collected)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "evalreplay: an item of an LLM evaluation (pytest-evalreplay)")
    settings = options.resolve(config) if options.in_play(config) else None  # else when evals show up
    if settings is not None and settings.provider == "vllm" and _xdist_workers(config):
        raise pytest.UsageError(
            "-n/--numprocesses with --evalreplay-provider=vllm would load the model in every xdist worker: "
            "run in one process, or serve the model (python -m vllm.entrypoints.openai.api_server ...) and "
            "use --evalreplay-provider=openai with -n (see docs/providers.md, 'Past one machine')"
        )
    plugin = EvalReplayPlugin(config, settings)
    config.pluginmanager.register(plugin, _PLUGIN_NAME)
    if _distributed(config):
        from pytest_evalreplay.plugin.distributed import XdistHooks

        config.pluginmanager.register(XdistHooks(plugin), "evalreplay-xdist")


@pytest.hookimpl(hookwrapper=True)
def pytest_cmdline_main(config: pytest.Config) -> Any:
    """Before xdist's own: whether the user chose a --dist mode (distributed.py)."""
    if _distributed(config) or getattr(config.option, "numprocesses", None):
        from pytest_evalreplay.plugin.distributed import note_dist_choice

        note_dist_choice(config)
    yield


def _distributed(config: pytest.Config) -> bool:
    """A session of xdist's: a controller with a --dist mode (-n sets one) or a worker."""
    if not config.pluginmanager.hasplugin("xdist"):
        return False
    return getattr(config.option, "dist", "no") != "no" or hasattr(config, "workerinput")


def _xdist_workers(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> Any:
    task_module = sys.modules.get("pytest_evalreplay.task")
    if task_module is None:
        return None  # no EvalTask (nor EloEval) can exist before its module is imported
    stages_module = sys.modules.get("pytest_evalreplay.stages")
    is_elo = stages_module is not None and isinstance(obj, stages_module.EloEval)
    if not is_elo and not isinstance(obj, task_module.EvalTask):
        return None
    from pytest_evalreplay.plugin.items import collect_eval

    return collect_eval(collector, obj, is_elo)


class EvalReplayPlugin:
    """The hooks that need state, registered per pytest session. The session
    machinery (journal, provider, run dir) is built when eval items show up."""

    def __init__(self, config: pytest.Config, settings: Settings | None) -> None:
        self.config = config
        self._settings = settings  # None: no option given, resolved if evals are collected
        self._session: EvalSession | None = None
        self._summary: Summary | None = None
        self._finished: list[pytest.Item] = []
        self._planned: Planned | None = None  # what the collection decided (plugin/collection.py)
        self._gc_thresholds: tuple[int, int, int] | None = None  # before evals_collected, restored at the end

    def evals_collected(self) -> None:
        """The first eval task met at collection: full garbage collections a
        tenth as often. Every item, task and journal reference lives until the
        session ends, and each full collection walks them all again (at 20k
        items, 13 of them took 1.8 s of CPU; 3 take 0.8 s, bare pytest's cost)."""
        if self._gc_thresholds is None:
            self._gc_thresholds = gc.get_threshold()
            young, middle, old = self._gc_thresholds
            gc.set_threshold(young, middle, old * GC_OLD_FACTOR)

    # -- lazily built parts ------------------------------------------------------

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = options.resolve(self.config)
        return self._settings

    @property
    def in_play(self) -> bool:
        """Whether an evalreplay option or ini key is set (without resolving them)."""
        return self._settings is not None and self._settings.in_play

    @property
    def session(self) -> EvalSession:
        if self._session is None:
            self._session = self._make_session()
        return self._session

    @property
    def summary(self) -> Summary:
        if self._summary is None:
            from pytest_evalreplay.report.summary import Summary

            self._summary = Summary()
        return self._summary

    def _make_session(self) -> EvalSession:
        from pytest_evalreplay.plugin.wiring import make_session

        return make_session(self.config, self.settings)

    @property
    def active(self) -> bool:
        return self._session is not None

    # -- status where pytest users look ------------------------------------------

    def pytest_report_header(self, config: pytest.Config) -> list[str] | None:
        if not self.in_play:
            return None
        s = self.settings
        parts = [f"provider: {s.provider or 'none'}"]
        if s.model:
            parts.append(f"model: {s.model}")
        if s.predictions is not None:
            parts.append(f"predictions: {s.predictions}")
        parts.append(f"output: {s.output or 'pytest cache (.pytest_cache/d/evalreplay)'}")
        if s.shard is not None:
            parts.append(f"shard: {s.shard}")
        if s.reset:
            mode = "reset"
        elif s.resume_stage is not None:
            first = f"stage {s.resume_stage}" if s.resume_stage else "the first incomplete stage"
            mode = f"resume from {first}"
        else:
            mode = "resume" if s.resume else "fresh for what is selected"
        parts.append(f"mode: {mode}")
        if s.provider == "openai":
            from pytest_evalreplay.providers import openai

            parts.append(openai.describe(s))
        return ["evalreplay: " + ", ".join(parts)]

    # -- collection --------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Plan the tasks on the final selection: after every plugin's
        `pytest_collection_modifyitems` (-k, -m, --lf, --sw, pytest-randomly
        and wrappers included), before the terminal counts what was collected
        and before an xdist worker reports its collection."""
        if "pytest_evalreplay.plugin.items" in sys.modules:  # else no eval item exists (makeitem)
            from pytest_evalreplay.plugin.collection import Planned, plan

            self._planned = Planned()
            plan(self._planned, session.config, session.items, self.settings, lambda: self.session)
        if self.active:
            from pytest_evalreplay.plugin.wiring import failures_left

            self.session.ctx.failures_left = lambda: failures_left(session)
        if self.active and not session.config.option.collectonly:
            from pytest_evalreplay.model import EvalReplayError

            try:
                self.session.prepare_provider()  # its batch size may re-chunk
            except EvalReplayError as exc:
                raise pytest.UsageError(str(exc)) from None
        workerinput = getattr(session.config, "workerinput", None)
        if self.active and workerinput is not None:
            from pytest_evalreplay.plugin.distributed import item_groups, send_collection

            groups = item_groups(session.items, self.session.runs, int(workerinput.get("workercount", 1)))
            send_collection(self.session.output, workerinput, self.collection_lines(), groups)

    def pytest_report_collectionfinish(self, config: pytest.Config) -> list[str] | None:
        return self.collection_lines()

    def collection_lines(self) -> list[str] | None:
        """What the collection line says (an xdist worker hands it to its controller)."""
        if self._planned is None:
            return None
        from pytest_evalreplay.plugin.collection import collection_lines

        return collection_lines(self._planned, self._session)

    # -- reports and the end -----------------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if any(k == "evalreplay.gate" for k, _ in report.user_properties):
            self.summary.add_report(report)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        """After its last report took a copy, an eval item drops its properties:
        items hold keys, not data, for the rest of a long session."""
        if self.active and item.user_properties and item.get_closest_marker("evalreplay") is not None:
            self._finished.append(item)
        while len(self._finished) > 1:
            self._finished.pop(0).user_properties.clear()

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self.active:
            return
        nothing_left = self._planned is not None and self._planned.deselected_all
        if nothing_left and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
            session.exitstatus = pytest.ExitCode.OK  # everything was reused: nothing had to run
        from pytest_evalreplay.plugin.finish import finish

        finish(self.session, lambda: self.summary, session.config)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self._summary is None:
            return
        from pytest_evalreplay.plugin.finish import report

        report(self.summary, self.settings, terminalreporter)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._gc_thresholds is not None:
            gc.set_threshold(*self._gc_thresholds)
        if self._session is not None:
            self._session.close()


@pytest.fixture(scope="session")
def replay_provider(pytestconfig: pytest.Config) -> Any:
    """The replay provider over --evalreplay-predictions, for hand-written tests."""
    from pytest_evalreplay.model import EvalReplayError

    plugin = pytestconfig.pluginmanager.get_plugin(_PLUGIN_NAME)
    try:
        return plugin.session.replay_provider()
    except EvalReplayError as exc:
        raise pytest.UsageError(str(exc)) from None
