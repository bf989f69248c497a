"""A task's rollouts in one session: its journal, what it decided for each
selected item, and generating what is to run.

The unit of generation is a chunk of a task's requests: the first item (or
stage) of a run to need a chunk generates all of it under the chunk's lock;
any other process of the run (pytest-xdist workers) waits for that lock and
then reads the chunk's rows from the journal. `TaskRun` (scoring) and
`EloRun` (judging, stage by stage) build on this.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_evalreplay.journal import transcripts
from pytest_evalreplay.journal.index import FailRef, GenRef, JournalIndex
from pytest_evalreplay.journal.recorder import TaskRecorder
from pytest_evalreplay.journal.rows import RolloutKey
from pytest_evalreplay.model import Generation, Provider, RequestKey
from pytest_evalreplay.numbers import planning, sources
from pytest_evalreplay.numbers.metrics import TaskOutcome
from pytest_evalreplay.numbers.planning import Decisions, TaskPlan
from pytest_evalreplay.run.context import RunContext
from pytest_evalreplay.run.execution import RolloutResult
from pytest_evalreplay.run.generation import stream_into_journal
from pytest_evalreplay.rundir import writer as rundir
from pytest_evalreplay.task import EvalTask

if TYPE_CHECKING:  # imported where an agent task runs: a session without one never loads it
    from pytest_evalreplay.run.episodes import EpisodeRunner


def open_recorder(
    ctx: RunContext, name: str, plan: TaskPlan, narrowed: bool, directory: Path
) -> tuple[TaskRecorder, JournalIndex | None]:
    """The task's recorder, and its journal as the session found it (None
    when `--evalreplay-reset` starts it afresh). No other run discards a
    result: one without --resume reuses nothing (`planning.decide`) and
    appends its generations after the older ones, compacting the journal
    once before its first write (`journal.compaction`)."""
    recorder = ctx.open_journal(directory, name)
    if ctx.settings.reset:
        return recorder, None
    index = recorder.index
    if index.torn is not None:
        ctx.note(f"{index.path}:{index.torn}: ignored a torn last line (a run died mid-write)")
    if ctx.resuming or narrowed:  # a full run without --resume reads no old row
        for line in planning.foreign_rows(plan, index):
            ctx.note(line)
    return recorder, index


@dataclass
class Rollouts(ABC):
    """What a run generates: `task` renders the requests (an EloEval's pool)."""

    ctx: RunContext
    name: str
    task: EvalTask
    plan: TaskPlan
    recorder: TaskRecorder
    selected: list[RolloutKey]
    decisions: Decisions
    gate: Any = None
    chunks: list[list[RequestKey]] = field(default_factory=list)
    chunk_of: dict[RequestKey, int] = field(default_factory=dict)
    rollouts_of: dict[RequestKey, tuple[int, ...]] = field(default_factory=dict)
    touched: bool = False  # this process ran something of the task: it writes the run dir
    unfinished: str | None = None  # a plain run's note that --resume would reuse results
    waiting: list[RolloutKey] = field(default_factory=list)  # a shard's items that wait for a merge
    outcome: TaskOutcome | None = None
    replayed: set[RolloutKey] = field(default_factory=set)  # reused keys the saved run answered now
    _episodes: EpisodeRunner | None = None

    @property
    def episodes(self) -> EpisodeRunner:
        """An agent task's episode runner (its turns journal), made on first use."""
        if self._episodes is None:
            from pytest_evalreplay.run.episodes import EpisodeRunner

            self._episodes = EpisodeRunner(self.ctx, self.name, self.task, self.plan, self.recorder)
        return self._episodes

    def note_unfinished(self, index: JournalIndex | None) -> None:
        """A plain run over an output dir that holds an unfinished run says what --resume would keep."""
        if index is not None and not self.ctx.resuming:
            count = planning.resumable(self.plan, self.selected, index, self.ctx.settings.max_attempts)
            self.unfinished = planning.resumable_line(self.name, count)

    @property
    def instance_order(self) -> list[str]:
        return [inst["id"] for inst in self.task.instances]

    def chunk(self, batch_size: int | None) -> None:
        self.chunks = planning.chunks(self.decisions.run, batch_size, self.chunks_by_stage)
        self.chunk_of = {rk: n for n, chunk in enumerate(self.chunks) for rk in chunk}
        wanted: dict[RequestKey, list[int]] = {}
        for stage, iid, rollout in self.decisions.run:
            wanted.setdefault((stage, iid), []).append(rollout)
        shared: dict[tuple[int, ...], tuple[int, ...]] = {}  # one tuple per distinct set: most are (0,)
        self.rollouts_of = {rk: shared.setdefault(t := tuple(sorted(rs)), t) for rk, rs in wanted.items()}

    @property
    def chunks_by_stage(self) -> bool:
        """Whether no chunk may hold two stages' requests (an ELO run's)."""
        return False

    def is_reused(self, key: RolloutKey) -> bool:
        return key in self.decisions.reuse

    # -- what this run made ------------------------------------------------------

    def own(self, key: RolloutKey) -> sources.Answer:
        """Where `key`'s answer stands among this run's own journal rows (an
        earlier chunk's, an xdist peer's): what it generated, what failed for
        good, or nothing yet."""
        mode = sources.Mode(self.ctx.run_id, False, False, self.ctx.settings.max_attempts)
        index, rq, pv = self.recorder.index, self.plan.request_of(key), self.plan.provider
        return sources.answer_source(mode, index.latest_gen(key, rq, pv), index.latest_fail(key, rq, pv))

    def own_gen(self, key: RolloutKey) -> GenRef | None:
        """This run's generation of `key` (a run without --resume regenerates what it selected)."""
        return self.own(key).gen

    def own_failure(self, key: RolloutKey) -> FailRef | None:
        """This run's final failure of `key`, unless a later generation of this run overrides it."""
        answer = self.own(key)
        return answer.fail if answer.source is sources.Source.FAILED else None

    def candidate(self, key: RolloutKey) -> GenRef | None:
        """The generation an item's result stands on: reused, or this run's;
        for an item this session did not select, whatever the journal holds."""
        ref = self.decisions.reuse.get(key) or self.own_gen(key)
        if ref is None and key not in self.decisions.run:
            ref, _ = self.recorder.index.standing(key, self.plan.request_of(key), self.plan.provider)
        return ref

    # -- generating ----------------------------------------------------------------

    def ensure_generated(self, keys: Iterable[RolloutKey]) -> None:
        """Generate the chunks holding these keys that this run has not resolved yet."""
        for number in sorted({self.chunk_of[(k[0], k[1])] for k in keys if (k[0], k[1]) in self.chunk_of}):
            self.generate_chunk(number)

    def generate_chunk(self, number: int) -> None:
        recorder = self.recorder
        with recorder.chunk_locked(number):
            recorder.flush()  # commit our own rows and read what peers wrote
            todo = self._unresolved(self.chunks[number])
            if not todo:
                return
            task = self.task
            if task.agent is not None:
                self.episodes.run([(*rk, r) for rk, rollouts in todo.items() for r in rollouts])
                return
            requests = [
                task.request(task.instance(iid), stage=stage, rollouts=rollouts)
                for (stage, iid), rollouts in todo.items()
            ]
            if task.name != self.name:
                # An EloEval's pool: the answers are the eval's, and replay serves them so.
                requests = [dataclasses.replace(r, task=self.name) for r in requests]
            provider = self.ctx.host.get()
            stream_into_journal(
                recorder,
                provider,
                (self.ctx.provider_digest, self.ctx.provider_identity),
                requests,
                self.ctx.settings,
                digest_of=lambda r: self.plan.requests[(r.stage, r.instance_id)],
                prior=self._prior_attempts(todo),
                progress=self.ctx.progress,
                name=self.name,
                on_answer=self.on_answer(provider),
            )

    def on_answer(self, provider: Provider) -> Callable[[RolloutKey, Generation], None] | None:
        """What sees each answer the moment its row is written: nothing here
        (a plain task may score it; an ELO stage judges its answers together)."""
        return None

    def _unresolved(self, chunk: Iterable[RequestKey]) -> dict[RequestKey, tuple[int, ...]]:
        """The rollouts of a chunk this run has neither generated nor failed for good."""
        out: dict[RequestKey, tuple[int, ...]] = {}
        for rk in chunk:
            missing = tuple(
                r
                for r in self.rollouts_of[rk]
                if self.own_gen((*rk, r)) is None and self.own_failure((*rk, r)) is None
            )
            if missing:
                out[rk] = missing
        return out

    def _prior_attempts(self, todo: Mapping[RequestKey, tuple[int, ...]]) -> dict[RequestKey, int]:
        """Attempts already made at each request (this run's; with --resume, earlier runs' too)."""
        out: dict[RequestKey, int] = {}
        index = self.recorder.index
        for rk, rollouts in todo.items():
            n = 0
            for r in rollouts:
                fail = index.latest_fail((*rk, r), self.plan.requests[rk], self.plan.provider)
                if fail is not None and (fail.run == self.ctx.run_id or self.ctx.settings.resume):
                    n = max(n, fail.failure.attempt)
            if n:
                out[rk] = n
        return out

    # -- results that are failures -------------------------------------------------

    def failed_before(self, key: RolloutKey) -> RolloutResult:
        failure = self.decisions.failed[key].failure
        if failure.failure_class == "retryable":
            again = "raise --evalreplay-max-attempts, or run without --resume"
        else:
            again = "run without --resume (or with --evalreplay-reset) to try it again"
        return self.failure(
            key,
            f"failed for good in an earlier run (attempt {failure.attempt}, {failure.failure_class}): "
            f"{failure.message}; {again}",
            failure.failure_class,
        )

    def not_generated(self, key: RolloutKey) -> RolloutResult:
        """The result of an item this run tried to generate and could not."""
        fail = self.own_failure(key)
        if fail is None:
            return self.failure(key, "no result was recorded for this rollout", "retryable")
        return self.failure(key, fail.failure.message, fail.failure.failure_class)

    def failure(self, key: RolloutKey, message: str | None, failure_class: str | None) -> RolloutResult:
        return self.result_of(key, error=message, failure_class=failure_class)

    def result_of(self, key: RolloutKey, **fields: Any) -> RolloutResult:
        return RolloutResult(task=self.name, stage=key[0], instance_id=key[1], rollout=key[2], **fields)

    # -- the end ---------------------------------------------------------------------------

    @abstractmethod
    def outcome_now(self) -> TaskOutcome:
        """The task's numbers from its journal as it stands (the caller has flushed)."""

    @abstractmethod
    def before_finish(self) -> None:
        """What the run writes to its journal before the run dir is written."""

    def finish(self) -> TaskOutcome:
        """The run dir files from the journal, under the task lock, so the last
        process of a run to finish writes the fullest view; nothing new runs."""
        recorder = self.recorder
        try:
            self.before_finish()
        finally:
            recorder.flush()  # the scores computed so far are kept, also when a file could not be written
        with recorder.locked():
            recorder.refresh()
            outcome = self.outcome_now()
            if self.ctx.settings.provider == "replay":  # what this run wrote came from the saved run
                outcome = self.outcome = dataclasses.replace(outcome, replayed=True)
            rundir.write_task(
                recorder.directory,
                outcome,
                self.ctx.run_id,
                recorder.index,
                self.instance_order,
                self.task.num_samples,
                postprocess=self.task.postprocess if self.task.rewrites_generations else None,
                doc_of=getattr(self.task, "saved_doc", None),  # an lm-eval task's documents
            )
            if self.task.agent is not None:
                keys = [item.key for item in outcome.items if item.status != "missing"]
                transcripts.write(recorder.directory, self.name, self.episodes.transcript_rows(keys))
        return outcome
