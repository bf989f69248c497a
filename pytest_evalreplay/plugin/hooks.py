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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_evalreplay.plugin import hookspecs, options

if TYPE_CHECKING:
    from pytest_evalreplay.report.summary import Summary
    from pytest_evalreplay.run.selection import Entry
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
        self._deselected_all = False
        self._deselected = 0  # reused items deselected (the rest of the reused run, reported skipped)
        self._unplanned = 0  # tasks collected by --collect-only with no provider chosen
        self._shard_lines: list[str] = []
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
        from pytest_evalreplay.plugin.items import SESSION_KEY
        from pytest_evalreplay.providers import ProviderHost
        from pytest_evalreplay.report.progress import FileProgress, TerminalProgress
        from pytest_evalreplay.run.context import WorkerInfo
        from pytest_evalreplay.run.session import EvalSession

        config, settings = self.config, self.settings
        workerinput = getattr(config, "workerinput", None)
        worker = None
        if workerinput is not None:
            worker = WorkerInfo(
                int(workerinput.get("workerid", "gw0")[2:] or 0), workerinput.get("workercount", 1)
            )
        session = EvalSession(
            settings=settings,
            output=lambda: output_dir(config, settings),
            run_id=(workerinput or {}).get("evalreplay_run_id"),
            host=ProviderHost(
                settings, lambda kind: config.hook.pytest_evalreplay_make_provider(config=config, kind=kind)
            ),
            progress=(
                FileProgress(lambda: session.output, workerinput["workerid"], settings.progress_interval)
                if workerinput is not None
                else TerminalProgress(
                    config, settings.quiet, settings.provider == "replay", settings.progress_interval
                )
            ),
            worker=worker,
            snapshot=(workerinput or {}).get("evalreplay_snapshot"),
            seed=(workerinput or {}).get("evalreplay_seed"),
            rootdir=Path(config.rootpath),
            invocation=(config.invocation_params.args, Path(config.invocation_params.dir), config.inipath),
        )
        config.stash[SESSION_KEY] = session
        return session

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
        self._plan(session, session.config, session.items)
        if self.active:
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

    def _plan(self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Gather the eval items, plan their tasks, and apply the selection
        (`run/selection.py` decides what is deselected and the order)."""
        if "pytest_evalreplay.plugin.items" not in sys.modules:
            return  # no eval item can exist before its module is imported (pytest_pycollect_makeitem)
        from pytest_evalreplay.plugin.items import TaskItem
        from pytest_evalreplay.run import selection

        eval_items = [item for item in items if isinstance(item, TaskItem)]
        if not eval_items:
            return
        tasks: dict[str, tuple[Any, list[tuple[int, str, int]]]] = {}
        for item in eval_items:
            entry = tasks.setdefault(item.task.name, (item.task, []))
            if entry[0] is not item.task:
                raise pytest.UsageError(
                    f"two different tasks are named {item.task.name!r} ({item.nodeid}); task names must "
                    "be unique in a session (they name run dir files)"
                )
            if (key := _entry(item).key) is not None:
                entry[1].append(key)
        opts = selection.Options(
            resume=self.settings.resume,
            report_reused=self.settings.report_reused,
            no_generate=self.settings.no_generate,
            collect_only=bool(config.option.collectonly),
            serial=not hasattr(config, "workerinput"),
            replay=self.settings.provider == "replay",
        )
        shard = self.settings.shard
        if shard is not None:  # every shard collects every item; the others' are deselected
            entries = [_entry(i) for i in items]
            self._shard_lines = selection.shard_lines(shard, entries)
            self._drop(config, items, [items[n] for n in selection.not_this_shard(shard, entries)])
            for name, (_, keys) in tasks.items():
                keys[:] = selection.owned(shard, name, keys)
        if opts.collect_only and self.settings.provider is None:
            self._unplanned = len(tasks)  # reuse is by provider: without one there is nothing to plan
            return
        from pytest_evalreplay.model import EvalReplayError

        try:
            self.session.register(list(tasks.values()), collect_only=opts.collect_only)
            done = self.session.rescore_reused() if opts.rescores_reused else {}
        except EvalReplayError as exc:
            raise pytest.UsageError(str(exc)) from None
        reused = (
            {(name, key) for name, keys in done.items() for key in keys} if opts.deselects_reused else set()
        )
        held = self.session.hold_back() if opts.holds_back else {}
        waiting = {(run.name, key) for run in self.session.runs.values() for key in run.waiting}
        chosen = selection.select([_entry(i) for i in items], held, waiting, reused)
        planned = list(items)
        for group in chosen.drops:
            self._drop(config, items, [planned[n] for n in group])
        if chosen.reused:
            self._deselected = chosen.reused
        self._shard_lines += chosen.lines
        items[:] = [planned[n] for n in chosen.order]

    def _drop(self, config: pytest.Config, items: list[pytest.Item], dropped: list[pytest.Item]) -> None:
        """Deselect `dropped` (pytest's own way: -k, --lf and the terminal count them)."""
        if dropped:
            self._deselected_all = len(dropped) == len(items)
            config.hook.pytest_deselected(items=dropped)
            ids = {id(i) for i in dropped}
            items[:] = [i for i in items if id(i) not in ids]

    def pytest_report_collectionfinish(self, config: pytest.Config) -> list[str] | None:
        return self.collection_lines()

    def collection_lines(self) -> list[str] | None:
        """What the collection line says; an xdist worker hands it to its
        controller (which collects nothing: see distributed.py)."""
        if not self._unplanned and (not self.active or not self.session.runs):
            return None
        from pytest_evalreplay.report.summary import plural

        if self._unplanned:
            return [
                f"evalreplay: {plural(self._unplanned, 'task')}, not planned: no provider chosen "
                "(what would run or be reused depends on it)"
            ]
        runs = self.session.runs.values()
        run = sum(len(r.decisions.run) for r in runs)
        reused = sum(len(r.decisions.reuse) for r in runs)
        replayed = sum(len(r.replayed) for r in runs)
        failed = sum(len(r.decisions.failed) for r in runs)
        parts = [plural(len(self.session.runs), "task"), f"{run:,} to run"]
        if reused:
            gone = self._deselected
            if gone >= reused:
                how = "deselected"
            elif gone == 0:
                how = "reported skipped"
            else:  # an EloEval's reused items beside a task's
                how = f"{gone:,} deselected, {reused - gone:,} reported skipped"
            if reused > replayed:
                parts.append(f"{reused - replayed:,} reused from the journal ({how})")
            if replayed:
                parts.append(f"{replayed:,} replayed from the saved run ({how})")
        if failed:
            parts.append(f"{failed:,} failed for good before")
        status = [*self._shard_lines, *self.session.status()]
        return ["evalreplay: " + ", ".join(parts), *(f"evalreplay: {line}" for line in status)]

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
        if self._deselected_all and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
            session.exitstatus = pytest.ExitCode.OK  # everything was reused: nothing had to run
        from pytest_evalreplay.model import EvalReplayError

        ev = self.session
        try:
            ev.finish()
        except EvalReplayError as exc:
            ev.notes.append(f"run dir not written: {exc}")
        ev.close_provider()  # before the summary, so a close() that fails is in its notes
        for name, doc in ev.docs.items():
            self.summary.add_doc(name, doc.seen, doc.doc, doc.extra())
        if ev.output_resolved is not None:
            from pytest_evalreplay.storage.files import shown_path

            self.summary.run_dir = str(shown_path(ev.output_resolved))
        for note in ev.notes:
            self.summary.add_note(note)
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:  # a pytest-xdist worker: the controller prints the summary
            workeroutput["evalreplay"] = {
                "docs": {n: [d.seen, d.doc, d.extra()] for n, d in ev.docs.items()},
                "notes": list(ev.notes),
                "run_dir": self.summary.run_dir,
            }

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self._summary is None:
            return
        if self.settings.compare is not None:
            self.summary.compare_with(self.settings.compare)
        self.summary.terminal(terminalreporter)
        if self.settings.report is not None:
            from pytest_evalreplay.model import EvalReplayError
            from pytest_evalreplay.report.summary import github_step_summary

            try:
                markdown = self.summary.write_markdown(self.settings.report)
                where = github_step_summary(markdown)
            except (EvalReplayError, OSError) as exc:
                terminalreporter.write_line(f"evalreplay: report not written: {exc}")
            else:
                if where is not None:
                    terminalreporter.write_line(
                        f"evalreplay: report appended to $GITHUB_STEP_SUMMARY ({where})"
                    )
        if self.settings.html is not None:
            self._write_html(terminalreporter, self.settings.html)

    def _write_html(self, terminalreporter: pytest.TerminalReporter, path: Path) -> None:
        """The HTML report of the run dir this session wrote (with the gates'
        verdicts, which the run dir does not keep), or a line saying why not."""
        from pytest_evalreplay.model import EvalReplayError
        from pytest_evalreplay.report.html import write_report

        run_dir = self.summary.run_dir
        if run_dir is None or not self.summary.docs:
            terminalreporter.write_line("evalreplay: HTML report not written: this session ran no eval task")
            return
        try:
            size = write_report(
                path, Path(run_dir), self.settings.compare, self.summary.gates, option="--evalreplay-html"
            )
        except (EvalReplayError, OSError) as exc:
            terminalreporter.write_line(f"evalreplay: HTML report not written: {exc}")
        else:
            terminalreporter.write_line(f"evalreplay: HTML report written to {path} ({size:,} bytes)")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._gc_thresholds is not None:
            gc.set_threshold(*self._gc_thresholds)
        if self._session is not None:
            self._session.close()


def failures_left(session: pytest.Session) -> int | None:
    """How many more failed items pytest takes before it stops (0: stopping
    now; None: no --maxfail/-x)."""
    if session.shouldstop or session.shouldfail:
        return 0
    maxfail = session.config.option.maxfail
    return max(0, maxfail - session.testsfailed) if maxfail else None


def _entry(item: pytest.Item) -> Entry:
    """An item as the selection sees it (`run/selection.py`)."""
    from pytest_evalreplay.plugin.items import GateItem, RolloutItem
    from pytest_evalreplay.run.selection import Entry

    if isinstance(item, RolloutItem):
        return Entry(item.task.name, item.key)
    if isinstance(item, GateItem):
        return Entry(item.task.name, gate=True)
    return Entry()


def output_dir(config: pytest.Config, settings: Settings) -> Path:
    from pytest_evalreplay.model import EvalReplayError

    if settings.output is not None:
        return settings.output
    cache = getattr(config, "cache", None)
    if cache is None:
        raise EvalReplayError(
            "pytest's cache is disabled (-p no:cacheprovider): pass --evalreplay-output=DIR "
            "(ini evalreplay_output) for the run dir and journal"
        )
    return Path(cache.mkdir("evalreplay"))


@pytest.fixture(scope="session")
def replay_provider(pytestconfig: pytest.Config) -> Any:
    """The replay provider over --evalreplay-predictions, for hand-written tests."""
    from pytest_evalreplay.model import EvalReplayError

    plugin = pytestconfig.pluginmanager.get_plugin(_PLUGIN_NAME)
    try:
        return plugin.session.replay_provider()
    except EvalReplayError as exc:
        raise pytest.UsageError(str(exc)) from None
