"""The evaluation session: a name -> `Run` table and what the plugin's hooks
ask of it. Thin by design: a plain task's work is in `taskrun.py`, an
EloEval's in `elorun.py`, the end and the gates in `finish.py`; what they
share (settings, provider, output dir) is the `RunContext`.

`plugin.py` and `items.py` call in here; pytest's own objects stay there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_evalreplay.journal.rows import RolloutKey
from pytest_evalreplay.model import EvalReplayError, Provider
from pytest_evalreplay.numbers import gates
from pytest_evalreplay.providers import ProviderHost
from pytest_evalreplay.run.context import ProgressSink, ProviderExit, Run, RunContext, WorkerInfo
from pytest_evalreplay.run.execution import RolloutResult
from pytest_evalreplay.run.finish import TaskDoc, finish_runs, judge_gate
from pytest_evalreplay.rundir.writer import SessionLock
from pytest_evalreplay.settings import Settings
from pytest_evalreplay.stages import EloEval
from pytest_evalreplay.task import EvalTask


class EvalSession:
    def __init__(
        self,
        settings: Settings,
        output: Callable[[], Path],
        run_id: str | None,
        host: ProviderHost,
        progress: ProgressSink,
        worker: WorkerInfo | None = None,
        snapshot: Mapping[str, int] | None = None,
        seed: int | None = None,
        rootdir: Path | None = None,
        invocation: tuple[Sequence[str], Path, Path | None] | None = None,
    ) -> None:
        self.ctx = RunContext(settings, host, output, progress, worker=worker, snapshot=dict(snapshot or {}))
        if run_id is not None:
            self.ctx.run_id = run_id
        if seed is not None:
            self.ctx.seed = seed
        self.rootdir = rootdir or Path.cwd()
        self.invocation = invocation  # pytest's arguments, the dir it was started in, its ini file
        self.runs: dict[str, Run] = {}
        self.docs: dict[str, TaskDoc] = {}
        self._lock: SessionLock | None = None
        self._replay: Provider | None = None
        self._baseline: dict[str, gates.BaselineTask] | None = None
        self._draws: dict[str, tuple[int, list[list[str]]]] = {}

    @property
    def settings(self) -> Settings:
        return self.ctx.settings

    @property
    def run_id(self) -> str:
        return self.ctx.run_id

    @property
    def seed(self) -> int:
        return self.ctx.seed

    @property
    def notes(self) -> list[str]:
        return self.ctx.notes

    @property
    def output(self) -> Path:
        return self.ctx.output

    @property
    def output_resolved(self) -> Path | None:
        return self.ctx.output_resolved

    # -- the output dir ------------------------------------------------------------

    def hold_output(self) -> None:
        """Take the output dir for this session (an xdist worker checks that its
        controller holds it instead)."""
        if self._lock is not None:
            return
        lock = SessionLock(self.output, self.run_id)
        if self.ctx.worker is not None:
            lock.claim_for_worker()
            try:
                lock.check_held_by_run()
            except EvalReplayError:
                lock.release()
                raise
        else:
            lock.acquire()
        self._lock = lock

    def release_output(self) -> None:
        if self._lock is not None:
            self._lock.release()  # a worker's: its shared claim only
        self._lock = None

    def replay_provider(self) -> Provider:
        """What the `replay_provider` fixture serves."""
        if self.settings.predictions is None:
            raise EvalReplayError(
                "the replay_provider fixture needs saved generations: pass "
                "--evalreplay-predictions=PATH (or set the ini key evalreplay_predictions)"
            )
        if self.settings.provider == "replay":
            return self.ctx.host.get()
        if self._replay is None:
            from pytest_evalreplay.providers.replay import ReplayProvider

            self._replay = ReplayProvider.from_path(self.settings.predictions)
        return self._replay

    # -- collection --------------------------------------------------------------------

    def elo_draw(self, eval_: EloEval) -> tuple[int, list[list[str]]]:
        """An EloEval's seed and stage task ids, decided once per session at collection."""
        known = self._draws.get(eval_.name)
        if known is None:
            from pytest_evalreplay.run.elorun import draw

            known = self._draws[eval_.name] = draw(self.ctx, eval_)
        return known

    def all_keys(self, obj: EvalTask | EloEval) -> list[RolloutKey]:
        """Every item of a task, in collection order."""
        if isinstance(obj, EloEval):
            _, stage_tasks = self.elo_draw(obj)
            n = obj.num_samples
            return [(s, tid, r) for s, tids in enumerate(stage_tasks, 1) for tid in tids for r in range(n)]
        return obj.item_keys()

    def register(
        self, tasks: Sequence[tuple[EvalTask | EloEval, Sequence[RolloutKey]]], collect_only: bool
    ) -> None:
        """A Run per task: planned on its full key list, its selected keys
        sorted into reuse, run and failed-before."""
        if not tasks:
            return
        if not collect_only:
            self.hold_output()
        _check_names([obj for obj, _ in tasks])
        stage = self.settings.resume_stage
        if stage is not None and not any(isinstance(obj, EloEval) for obj, _ in tasks):
            raise EvalReplayError(
                f"--resume-stage{'=' + str(stage) if stage else ''}: no multi-stage EloEval is selected "
                "(--resume-stage resumes an EloEval's stages); for plain tasks use --resume"
            )
        if self.settings.provider is None and self.ctx.resuming and not collect_only:
            self.ctx.adopt_provider(journal_provider(self.output, [obj.name for obj, _ in tasks], self.ctx))
        for obj, selected in tasks:
            directory = self.ctx.output_factory() if collect_only else self.output
            all_keys = self.all_keys(obj)
            run: Run
            if isinstance(obj, EloEval):
                from pytest_evalreplay.run.elorun import EloRun

                run = EloRun.register(self.ctx, obj, all_keys, selected, directory, self.elo_draw(obj))
            else:
                from pytest_evalreplay.run.taskrun import TaskRun

                run = TaskRun.register(self.ctx, obj, all_keys, selected, directory)
            run.chunk(self._batch_size())
            self.runs[obj.name] = run
        shard = self.settings.shard
        if shard is not None and not collect_only:
            from pytest_evalreplay.run.taskrun import TaskRun
            from pytest_evalreplay.rundir.sharddir import claim, suite_identity, task_config

            identity = self.ctx.provider_identity
            configs = {
                name: task_config(
                    run.plan,
                    identity,
                    getattr(run, "fingerprints", ()),
                    run.merge_spec() if isinstance(run, TaskRun) else "an EloEval is rated by the suite",
                )
                for name, run in self.runs.items()
            }
            suite = None
            if self.invocation is not None:
                args, start, inipath = self.invocation
                suite = suite_identity(args, start, self.rootdir, inipath)
            s = self.settings
            finish = [
                f"--evalreplay-{name.replace('_', '-')}"
                for name in ("report", "html", "compare", "update_baseline")
                if getattr(s, name)
            ]
            claim(self.output, shard, configs, suite, s.max_attempts, finish)

    def _batch_size(self) -> int | None:
        size = self.settings.batch_size
        host = self.ctx.host
        if size is None and host.built:
            size = getattr(host.get(), "batch_size", None)
            if size is not None and (type(size) is not int or size < 1):
                raise EvalReplayError(
                    f"the provider's batch_size must be a positive int or None, got {size!r} "
                    f"(provider kind {self.settings.provider!r})"
                )
        return size

    def prepare_provider(self) -> None:
        """Build the provider now when something will be generated: a bad
        setting is then one usage error before the first item, not a failure
        of every item; a fully reused session builds nothing."""
        if any(run.decisions.run for run in self.runs.values()):
            self.ctx.host.get()
            if self.settings.batch_size is None:
                size = self._batch_size()
                for run in self.runs.values():
                    run.chunk(size)

    def rescore_reused(self) -> dict[str, list[RolloutKey]]:
        """Rescore every reused rollout with the current scorer (serial --resume,
        at collection); per task, the keys that need not run (a failed
        rescoring stays selected, to report its failure)."""
        return {name: run.rescore_reused() for name, run in self.runs.items()}

    def hold_back(self) -> dict[str, list[RolloutKey]]:
        """--evalreplay-no-generate: each task's items that need a generation,
        taken out of this session's work (they stay missing; no provider is built)."""
        held: dict[str, list[RolloutKey]] = {}
        for name, run in self.runs.items():
            if run.decisions.run:
                held[name], run.decisions.run = list(run.decisions.run), []
                run.chunk(None)
        return held

    def status(self) -> list[str]:
        return [line for run in self.runs.values() for line in run.status()]

    # -- running ---------------------------------------------------------------------------

    def result_for(self, task: str, key: RolloutKey) -> RolloutResult:
        return self.runs[task].result(key)

    def is_reused(self, task: str, key: RolloutKey) -> bool:
        return self.runs[task].is_reused(key)

    def baseline(self) -> dict[str, gates.BaselineTask]:
        if self._baseline is None:
            from pytest_evalreplay.rundir import baseline

            path = self.settings.baseline
            self._baseline = baseline.read(path) if path is not None else {}
        return self._baseline

    def gate_outcome(self, task: EvalTask | EloEval) -> gates.GateOutcome:
        run = self.runs[task.name]
        outcome = run.complete()
        return judge_gate(self.ctx, run, outcome, self.baseline().get(task.name))

    # -- the end ------------------------------------------------------------------------------

    def finish(self) -> None:
        self.docs = finish_runs(self.ctx, self.runs, self.rootdir)

    def close_provider(self) -> None:
        host = self.ctx.host
        host.close()
        for note in host.notes:
            self.ctx.note(note)

    def close(self) -> None:
        """The session's end: the provider closed, the output dir released, and
        every run's per-item state (journal indexes, decisions, results)
        dropped, so pytest's last garbage collection, which runs after this,
        does not walk it."""
        self.close_provider()
        self.release_output()
        self.runs.clear()
        self.ctx.journals.clear()


def journal_provider(directory: Path, names: Sequence[str], ctx: RunContext) -> dict[str, Any]:
    """The provider identity that made the generations these tasks' journals
    hold, when it is one; else the session needs a provider chosen."""
    from pytest_evalreplay.journal.index import JournalIndex
    from pytest_evalreplay.providers import NO_PROVIDER

    found: dict[str, dict[str, Any]] = {}
    for name in names:
        index = JournalIndex.read(directory, name, ctx.snapshot.get(name))
        for refs in index.gens.values():
            for ref in refs:
                found.setdefault(ref.provider, index.providers.get(ref.provider, {}))
    if len(found) != 1:
        why = (
            "the journals hold no generation to resume"
            if not found
            else f"the journals hold generations of {len(found)} providers"
        )
        raise EvalReplayError(f"{NO_PROVIDER} ({why})")
    return next(iter(found.values()))


def _check_names(tasks: Sequence[Any]) -> None:
    """Task names name run dir files: an LLM-judged EloEval's judge files must
    not be another task's."""
    from pytest_evalreplay.judges import LlmJudge
    from pytest_evalreplay.run.elojudge import judge_files_name

    names = {obj.name for obj in tasks}
    for obj in tasks:
        if isinstance(obj, EloEval) and isinstance(obj.judge, LlmJudge):
            clash = judge_files_name(obj.name)
            if clash in names:
                raise EvalReplayError(
                    f"the task {clash!r} would share its journal and run dir files with the LLM judge "
                    f"of the EloEval {obj.name!r} ({clash}-journal.jsonl): rename one of them"
                )


__all__ = ["EvalSession", "ProgressSink", "ProviderExit", "TaskDoc", "WorkerInfo"]
