"""The evaluation session: what each task runs, reuses and reports, wired to
the provider (`providers.ProviderHost`), the journal and run dir
(`recorder.TaskRecorder`), and the one computation of numbers
(`metrics.task_outcome`).

`plugin.py` calls in here from its hooks; pytest's own objects stay there.
The unit of generation is a chunk of a task's requests: the first item (or
gate) of a run to need a chunk generates all of it under the chunk's lock,
streaming results into the journal in groups; any other process of the run
(pytest-xdist workers) waits for that lock and then reads the chunk's rows
from the journal. Scoring happens where an item runs, so xdist spreads it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_evalreplay import gates, planning
from pytest_evalreplay.execution import Done, Failed, RoundEnd, generate_events, score_generation
from pytest_evalreplay.journal import JournalIndex, RequestKey, RolloutKey, digest
from pytest_evalreplay.metrics import TaskOutcome, item_name, task_outcome
from pytest_evalreplay.model import EvalReplayError, Generation, Provider, Request, RolloutResult
from pytest_evalreplay.options import Settings
from pytest_evalreplay.planning import Decisions, TaskPlan
from pytest_evalreplay.providers import ProviderHost
from pytest_evalreplay.recorder import TaskRecorder
from pytest_evalreplay.rundir import SessionLock, prepare_output_dir, refuse_self_replay, write_manifest
from pytest_evalreplay.task import EvalTask

Notify = Callable[[str], None]


class ProgressSink:
    """Where live generation progress goes (report.py implements it)."""

    def start(self, task: str, requests: int, samples: int) -> None: ...

    def update(self, task: str, requests: int, samples: int, failures: int, tokens: int) -> None: ...

    def end(self, task: str) -> None: ...


@dataclass(frozen=True)
class WorkerInfo:
    """This process's place in a pytest-xdist run (None outside xdist)."""

    index: int
    count: int


@dataclass
class TaskRun:
    """One task's part of the session."""

    task: EvalTask
    plan: TaskPlan
    recorder: TaskRecorder
    selected: list[RolloutKey]
    decisions: Decisions
    instance_order: list[str]
    chunks: list[list[RequestKey]] = field(default_factory=list)
    chunk_of: dict[RequestKey, int] = field(default_factory=dict)
    rollouts_of: dict[RequestKey, tuple[int, ...]] = field(default_factory=dict)
    results: dict[RolloutKey, RolloutResult] = field(default_factory=dict)  # computed here, not yet reported
    resolved: set[RolloutKey] = field(default_factory=set)  # scored or failed by this process
    touched: bool = False  # this process ran something of the task: it finalizes it
    outcome: TaskOutcome | None = None

    @property
    def name(self) -> str:
        return self.task.name


@dataclass(frozen=True)
class TaskDoc:
    """A task's final numbers as shipped to the summary (and from xdist
    workers to the controller): `doc` is its metrics.json, `seen` how much
    journal the computation read (the fullest view wins)."""

    doc: dict[str, Any]
    instance_scores: dict[str, dict[str, float]]
    seen: int
    changed_request: int = 0
    changed_provider: int = 0
    failed_before: int = 0


class EvalSession:
    def __init__(
        self,
        settings: Settings,
        output: Callable[[], Path],
        run_id: str | None,
        host: ProviderHost,
        notify: Notify,
        progress: ProgressSink,
        worker: WorkerInfo | None = None,
        snapshot: Mapping[str, int] | None = None,
    ) -> None:
        self.settings = settings
        self._output_factory = output
        self._output: Path | None = None
        self.run_id = run_id or uuid.uuid4().hex
        self.host = host
        self.notify = notify
        self.progress = progress
        self.worker = worker
        self.snapshot = dict(snapshot or {})
        self.runs: dict[str, TaskRun] = {}
        self.notes: list[str] = []
        self.docs: dict[str, TaskDoc] = {}
        self._lock: SessionLock | None = None
        self._replay: Provider | None = None
        self._baseline: dict[str, gates.BaselineTask] | None = None
        self._pv: str | None = None
        self._identity: dict[str, Any] | None = None

    # -- the output dir ------------------------------------------------------

    @property
    def output(self) -> Path:
        """The run dir, resolved on first use so a session without evals writes nothing."""
        if self._output is None:
            out = self._output_factory()
            if self.settings.predictions is not None and self.settings.provider == "replay":
                refuse_self_replay(self.settings.predictions, out)
            prepare_output_dir(out)
            self._output = out
        return self._output

    def hold_output(self) -> None:
        """Take the output dir for this session (an xdist worker checks that its
        controller holds it instead)."""
        if self._lock is not None:
            return
        lock = SessionLock(self.output, self.run_id)
        if self.worker is not None:
            lock.check_held_by_run()
        else:
            lock.acquire()
        self._lock = lock

    def release_output(self) -> None:
        if self._lock is not None and self.worker is None:
            self._lock.release()
        self._lock = None

    # -- the provider --------------------------------------------------------

    @property
    def provider_digest(self) -> str:
        if self._pv is None:
            self._identity = self.host.identity()
            self._pv = digest(self._identity)
        return self._pv

    @property
    def provider_identity(self) -> dict[str, Any]:
        _ = self.provider_digest
        assert self._identity is not None
        return self._identity

    def replay_provider(self) -> Provider:
        """What the `replay_provider` fixture serves."""
        if self.settings.predictions is None:
            raise EvalReplayError(
                "the replay_provider fixture needs saved generations: pass "
                "--evalreplay-predictions=PATH (or set the ini key evalreplay_predictions)"
            )
        if self.settings.provider == "replay":
            return self.host.get()
        if self._replay is None:
            from pytest_evalreplay.providers.replay import ReplayProvider

            self._replay = ReplayProvider.from_path(self.settings.predictions)
        return self._replay

    # -- collection ------------------------------------------------------------

    def register(
        self,
        tasks: Sequence[tuple[EvalTask, Sequence[RolloutKey], Sequence[RolloutKey]]],
        collect_only: bool,
    ) -> None:
        """Plan each task (its full key list, the requests rendered now) and
        sort its selected keys into reuse, run and failed-before."""
        if not tasks:
            return
        if not collect_only:
            self.hold_output()
        pv = self.provider_digest
        for task, all_keys, selected in tasks:
            plan = TaskPlan(task.name, tuple(all_keys), task.request_digests(), pv)
            narrowed = len(selected) < len(all_keys)
            reset = self.settings.reset or (not self.settings.resume and not narrowed)
            recorder = TaskRecorder(
                self._output_factory() if collect_only else self.output,
                task.name,
                self.run_id,
                reset=reset,
                limit=self.snapshot.get(task.name),
            )
            index: JournalIndex | None = None
            if not reset:
                index = recorder.read_snapshot()
                if index.torn is not None:
                    self.notes.append(
                        f"{index.path}:{index.torn}: ignored a torn last line (a run died mid-write)"
                    )
                self.notes.extend(planning.foreign_rows(plan, index))
            decisions = planning.decide(
                plan, selected, index, self.settings.resume and not reset, self.settings.max_attempts
            )
            run = TaskRun(
                task=task,
                plan=plan,
                recorder=recorder,
                selected=list(selected),
                decisions=decisions,
                instance_order=[inst["id"] for inst in task.instances],
            )
            self._chunk(run)
            self.runs[task.name] = run

    def _chunk(self, run: TaskRun) -> None:
        size = self.settings.batch_size
        if size is None and self.host.built:
            size = getattr(self.host.get(), "batch_size", None)
        run.chunks = planning.chunks(run.decisions.run, size)
        run.chunk_of = {rk: n for n, chunk in enumerate(run.chunks) for rk in chunk}
        wanted: dict[RequestKey, list[int]] = {}
        for stage, iid, rollout in run.decisions.run:
            wanted.setdefault((stage, iid), []).append(rollout)
        run.rollouts_of = {rk: tuple(sorted(rs)) for rk, rs in wanted.items()}

    def needs_provider(self) -> bool:
        return any(run.decisions.run for run in self.runs.values())

    def prepare_provider(self) -> None:
        """Build the provider now when something will be generated: a bad
        setting is then one usage error before the first item, not a failure
        of every item; a fully reused session builds nothing."""
        if self.needs_provider():
            self.host.get()
            if self.settings.batch_size is None:
                for run in self.runs.values():
                    self._chunk(run)

    def rescore_reused(self) -> dict[str, list[RolloutKey]]:
        """Score every reused rollout again with the current scorer (serial
        runs, at collection); return per task the keys whose rescoring failed
        (those stay selected, to report their failure)."""
        failed: dict[str, list[RolloutKey]] = {}
        for run in self.runs.values():
            if not run.decisions.reuse:
                continue
            for key in run.decisions.reuse:
                result = self._score_reused(run, key)
                if not result.ok:
                    failed.setdefault(run.name, []).append(key)
            run.recorder.flush()
            run.touched = True
        return failed

    # -- running ---------------------------------------------------------------

    def result_for(self, task: str, key: RolloutKey) -> RolloutResult:
        """An item's result: reused and rescored, failed before, or generated
        (its chunk, by whichever process of the run gets there first) and scored."""
        run = self.runs[task]
        run.touched = True
        result = run.results.pop(key, None)
        if result is not None:
            return result
        if key in run.decisions.reuse:
            return self._score_reused(run, key)
        if key in run.decisions.failed:
            return self._failed_before(run, key)
        return self._score_run(run, key)

    def is_reused(self, task: str, key: RolloutKey) -> bool:
        return key in self.runs[task].decisions.reuse

    def _failed_before(self, run: TaskRun, key: RolloutKey) -> RolloutResult:
        failure = run.decisions.failed[key].failure
        if failure.failure_class == "retryable":
            again = "raise --evalreplay-max-attempts, or run without --resume"
        else:
            again = "run without --resume (or with --evalreplay-reset) to try it again"
        run.resolved.add(key)
        return RolloutResult(
            task=run.name,
            stage=key[0],
            instance_id=key[1],
            rollout=key[2],
            error=f"failed for good in an earlier run (attempt {failure.attempt}, {failure.failure_class}): "
            f"{failure.message}; {again}",
            failure_class=failure.failure_class,
        )

    def _score(self, run: TaskRun, key: RolloutKey, raw: Generation, of: str) -> RolloutResult:
        task = run.task
        generation = task.postprocess(raw)
        scores, error = score_generation(task, task.instance(key[1]), generation)
        run.recorder.add(run.recorder.score(key, of, scores, error))
        run.resolved.add(key)
        return RolloutResult(
            task=run.name,
            stage=key[0],
            instance_id=key[1],
            rollout=key[2],
            generation=generation,
            scores=scores or {},
            error=error,
            failure_class="scoring" if error else None,
        )

    def _score_reused(self, run: TaskRun, key: RolloutKey) -> RolloutResult:
        gen = run.decisions.reuse[key]
        index = run.recorder.index
        if self.settings.reuse_scores:
            saved = index.score_of(key, gen)
            if saved is not None and saved.error is None and saved.scores is not None:
                run.resolved.add(key)
                generation = run.task.postprocess(index.generation(gen))
                return RolloutResult(
                    task=run.name,
                    stage=key[0],
                    instance_id=key[1],
                    rollout=key[2],
                    generation=generation,
                    scores=dict(saved.scores),
                )
        return self._score(run, key, index.generation(gen), gen.run)

    def _score_run(self, run: TaskRun, key: RolloutKey) -> RolloutResult:
        rq = run.plan.request_of(key)
        index = run.recorder.index
        gen = self._own_gen(index, key, rq)
        if gen is None and self._own_failure(run, key) is None:
            self._generate_chunk(run, run.chunk_of[(key[0], key[1])])
            index = run.recorder.index
            gen = self._own_gen(index, key, rq)
        if gen is None:
            fail = self._own_failure(run, key)
            run.resolved.add(key)
            message = fail.failure.message if fail else "no result was recorded for this rollout"
            cls = fail.failure.failure_class if fail else "retryable"
            return RolloutResult(
                task=run.name,
                stage=key[0],
                instance_id=key[1],
                rollout=key[2],
                error=message,
                failure_class=cls,
            )
        return self._score(run, key, index.generation(gen), gen.run)

    def _own_gen(self, index: JournalIndex, key: RolloutKey, rq: str) -> Any:
        """This run's generation of `key` (not an earlier run's: a run without
        --resume regenerates what it selected)."""
        gen = index.latest_gen(key, rq, self.provider_digest)
        return gen if gen is not None and gen.run == self.run_id else None

    def _own_failure(self, run: TaskRun, key: RolloutKey) -> Any:
        fail = run.recorder.index.latest_fail(key, run.plan.request_of(key), self.provider_digest)
        if fail is None or fail.run != self.run_id:
            return None
        gen = run.recorder.index.latest_gen(key, run.plan.request_of(key), self.provider_digest)
        if gen is not None and gen.seq > fail.seq:
            return None
        return fail if planning.is_final(fail.failure, self.settings.max_attempts) else None

    def _unresolved(self, run: TaskRun, chunk: Iterable[RequestKey]) -> dict[RequestKey, tuple[int, ...]]:
        """The rollouts of a chunk this run has neither generated nor failed for good."""
        out: dict[RequestKey, tuple[int, ...]] = {}
        index = run.recorder.index
        for rk in chunk:
            missing = tuple(
                r
                for r in run.rollouts_of[rk]
                if self._own_gen(index, (*rk, r), run.plan.requests[rk]) is None
                and self._own_failure(run, (*rk, r)) is None
            )
            if missing:
                out[rk] = missing
        return out

    def _prior_attempts(
        self, run: TaskRun, todo: Mapping[RequestKey, tuple[int, ...]]
    ) -> dict[RequestKey, int]:
        """Attempts already made at each request (this run's; with --resume, earlier runs' too)."""
        out: dict[RequestKey, int] = {}
        index = run.recorder.index
        for rk, rollouts in todo.items():
            n = 0
            for r in rollouts:
                fail = index.latest_fail((*rk, r), run.plan.requests[rk], self.provider_digest)
                if fail is not None and (fail.run == self.run_id or self.settings.resume):
                    n = max(n, fail.failure.attempt)
            if n:
                out[rk] = n
        return out

    def _generate_chunk(self, run: TaskRun, number: int) -> None:
        recorder = run.recorder
        with recorder.chunk_locked(number):
            recorder.flush()  # commit our own rows and read what peers wrote
            todo = self._unresolved(run, run.chunks[number])
            if not todo:
                return
            task = run.task
            requests = [
                task.request(task.instance(iid), stage=stage, rollouts=rollouts)
                for (stage, iid), rollouts in todo.items()
            ]
            self._stream_into_journal(run, requests, self._prior_attempts(run, todo))

    def _stream_into_journal(
        self, run: TaskRun, requests: list[Request], prior: Mapping[RequestKey, int]
    ) -> None:
        recorder = run.recorder
        pv = self.provider_digest
        provider = self.host.get()
        recorder.add(recorder.provider_rows(pv, self.provider_identity))
        samples = sum(len(r.rollouts) for r in requests)
        self.progress.start(run.name, len(requests), samples)
        done_requests = done_samples = failures = tokens = 0
        try:
            events = generate_events(
                provider, requests, self.settings.max_attempts, prior, self.settings.timeout
            )
            for event in events:
                if isinstance(event, Done):
                    req = event.request
                    rq = run.plan.requests[(req.stage, req.instance_id)]
                    rows = recorder.request_rows(rq, planning.request_content(req))
                    for rollout, gen in zip(req.rollouts, event.generations, strict=True):
                        rows.append(recorder.gen((req.stage, req.instance_id, rollout), rq, pv, gen))
                        tokens += gen.completion_tokens or 0
                    recorder.add(rows)
                    done_requests += 1
                    done_samples += len(req.rollouts)
                elif isinstance(event, Failed):
                    req = event.request
                    rq = run.plan.requests[(req.stage, req.instance_id)]
                    recorder.add(recorder.request_rows(rq, planning.request_content(req)))
                    recorder.add([recorder.fail(event.failure, rq, pv)])
                    if event.failure.final:
                        failures += 1
                        done_requests += 1
                elif isinstance(event, RoundEnd):
                    recorder.flush()  # failed attempts are durable before any retry
                    continue
                self.progress.update(run.name, done_requests, done_samples, failures, tokens)
        except SystemExit as exc:
            # A provider that exits stops the session like Ctrl-C would: what was
            # committed stays, the rest runs again on --resume.
            recorder.flush()
            raise ProviderExit(
                f"the provider raised SystemExit({exc.code!r}); stopping the session"
            ) from None
        finally:
            self.progress.end(run.name)
        recorder.flush()

    # -- gates -------------------------------------------------------------------

    def baseline(self) -> dict[str, gates.BaselineTask]:
        if self._baseline is None:
            from pytest_evalreplay import baseline

            path = self.settings.baseline
            self._baseline = baseline.read(path) if path is not None else {}
        return self._baseline

    def complete(self, task: str) -> TaskOutcome:
        """Make sure every selected item of the task has its result in the
        journal (computing here what no process has yet), then its numbers."""
        run = self.runs[task]
        run.touched = True
        run.recorder.flush()
        for key in run.selected:
            if key in run.resolved or key in run.results:
                continue
            if self._resolved_elsewhere(run, key):
                continue
            run.results[key] = self.result_for(task, key)
        return self.outcome(run)

    def _resolved_elsewhere(self, run: TaskRun, key: RolloutKey) -> bool:
        """Another process of this run has scored (or failed) this key."""
        index = run.recorder.index
        rq = run.plan.request_of(key)
        gen = index.latest_gen(key, rq, self.provider_digest)
        if gen is not None:
            score = index.score_of(key, gen)
            if score is not None and score.run == self.run_id:
                return True
        return self._own_failure(run, key) is not None

    def outcome(self, run: TaskRun) -> TaskOutcome:
        run.recorder.flush()
        outcome = task_outcome(
            run.plan, run.recorder.index, self.settings.max_attempts, self.run_id, self.host.model()
        )
        run.outcome = outcome
        return outcome

    def gate_outcome(self, task: EvalTask) -> gates.GateOutcome:
        assert task.gate is not None
        outcome = self.complete(task.name)
        return gates.evaluate(
            task=task.name,
            gate=task.gate,
            metrics=outcome.metrics,
            scores=gates.metric_scores(outcome.instance_scores, task.gate.metric),
            num_items=outcome.num_items - outcome.num_missing,
            num_failed=outcome.num_failed,
            budget=self.settings.failure_budget,
            baseline=self.baseline().get(task.name),
            missing=outcome.num_missing,
        )

    # -- the end -----------------------------------------------------------------

    def finish(self) -> None:
        """Write each touched task's run dir files from its journal (under the
        task lock, so the last process of a run to finish writes the fullest
        view), the manifest, and the baseline when asked."""
        entries: dict[str, gates.BaselineTask] = {}
        for name, run in self.runs.items():
            if not run.touched:
                continue
            recorder = run.recorder
            recorder.flush()
            with recorder.locked():
                recorder.refresh()
                outcome = task_outcome(
                    run.plan, recorder.index, self.settings.max_attempts, self.run_id, self.host.model()
                )
                recorder.write_run_dir(outcome, self.run_id, run.instance_order, run.task.num_samples)
            run.outcome = outcome
            self.docs[name] = TaskDoc(
                doc=outcome.to_doc(self.run_id),
                instance_scores=outcome.instance_scores,
                seen=recorder.index.offset,
                changed_request=run.decisions.changed_request,
                changed_provider=run.decisions.changed_provider,
                failed_before=len(run.decisions.failed),
            )
            if self.settings.update_baseline:
                entries[name] = gates.baseline_entry(run.task.gate, outcome.metrics, outcome.instance_scores)
        if entries and self.settings.baseline is not None:
            from pytest_evalreplay import baseline

            baseline.update(self.settings.baseline, entries)
            self.notes.append(f"baseline {self.settings.baseline} updated for: {', '.join(sorted(entries))}")
        if self.docs and self._output is not None:
            from filelock import FileLock

            with FileLock(str(self.output / ".manifest.lock")):
                write_manifest(self.output, self.host.model(), self.provider_identity, list(self.docs))

    def close(self) -> None:
        self.host.close()
        self.notes.extend(self.host.notes)
        self.release_output()


class ProviderExit(Exception):
    """The provider raised SystemExit: the session stops (see `_stream_into_journal`)."""


def describe_reuse(run: TaskRun) -> str | None:
    d = run.decisions
    parts = []
    if d.reuse:
        parts.append(f"{len(d.reuse)} reused")
    if d.changed_request:
        parts.append(f"{d.changed_request} regenerated because their request changed")
    if d.changed_provider:
        parts.append(f"{d.changed_provider} regenerated because the provider configuration changed")
    if d.failed:
        parts.append(f"{len(d.failed)} failed for good before")
    return f"{run.name}: " + ", ".join(parts) if parts else None


__all__ = ["EvalSession", "ProgressSink", "ProviderExit", "TaskDoc", "TaskRun", "WorkerInfo", "item_name"]
