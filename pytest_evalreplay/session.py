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

import random
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_evalreplay import gates, planning
from pytest_evalreplay.execution import Done, Failed, RoundEnd, generate_events, score_generation
from pytest_evalreplay.journal import GenRef, JournalIndex, RequestKey, RolloutKey, ScoreRef, digest
from pytest_evalreplay.metrics import TaskOutcome, item_name, task_outcome
from pytest_evalreplay.model import EvalReplayError, Generation, Provider, Request, RolloutResult
from pytest_evalreplay.options import Settings
from pytest_evalreplay.planning import Decisions, TaskPlan
from pytest_evalreplay.providers import ProviderHost
from pytest_evalreplay.recorder import TaskRecorder
from pytest_evalreplay.rundir import SessionLock, prepare_output_dir, refuse_self_replay, write_manifest
from pytest_evalreplay.stages import EloEval
from pytest_evalreplay.task import EvalTask

if TYPE_CHECKING:
    from pytest_evalreplay.elorun import EloDriver

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
    """One task's part of the session. For an `EloEval`, `task` is its pool
    (what the candidate answers) and `elo` drives its stages."""

    name: str
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
    gate: Any = None
    elo: EloDriver | None = None


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
        seed: int | None = None,
        rootdir: Path | None = None,
    ) -> None:
        self.settings = settings
        self.rootdir = rootdir or Path.cwd()
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
        self._draws: dict[str, tuple[int, list[list[str]]]] = {}
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**31)

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

    def elo_draw(self, eval_: EloEval) -> tuple[int, list[list[str]]]:
        """An EloEval's seed and each stage's task ids, decided once per session
        at collection: its own seed; else the one its journal recorded (so a
        resumed run, and every xdist worker, collects the same items); else
        the seed of the saved run being replayed; else this run's own seed."""
        known = self._draws.get(eval_.name)
        if known is None:
            from pytest_evalreplay.elorun import recorded_seed, saved_seed

            seed = eval_.seed
            if seed is None and not self.settings.reset:
                seed = recorded_seed(self._output_factory(), eval_.name, self.snapshot.get(eval_.name))
            if seed is None and self.settings.provider == "replay" and self.settings.predictions is not None:
                seed = saved_seed(self.settings.predictions, eval_.name)
            if seed is None:
                seed = self.seed
            known = (seed, eval_.draw(seed))
            self._draws[eval_.name] = known
        return known

    def all_keys(self, obj: EvalTask | EloEval) -> list[RolloutKey]:
        """Every item of a task, in collection order."""
        if isinstance(obj, EloEval):
            _, stage_tasks = self.elo_draw(obj)
            n = obj.num_samples
            return [(s, tid, r) for s, tids in enumerate(stage_tasks, 1) for tid in tids for r in range(n)]
        return obj.item_keys()

    def register(
        self,
        tasks: Sequence[tuple[EvalTask | EloEval, Sequence[RolloutKey], Sequence[RolloutKey]]],
        collect_only: bool,
    ) -> None:
        """Plan each task (its full key list, the requests rendered now) and
        sort its selected keys into reuse, run and failed-before."""
        if not tasks:
            return
        if not collect_only:
            self.hold_output()
        pv = self.provider_digest
        for obj, all_keys, selected in tasks:
            directory = self._output_factory() if collect_only else self.output
            if isinstance(obj, EloEval):
                self._register_elo(obj, all_keys, selected, directory)
                continue
            task = obj
            plan = TaskPlan(task.name, tuple(all_keys), task.request_digests(), pv)
            narrowed = len(selected) < len(all_keys)
            reset = self.settings.reset or (not self.resuming and not narrowed)
            recorder = TaskRecorder(directory, task.name, self.run_id, reset, self.snapshot.get(task.name))
            index = None if reset else self._read(recorder, plan)
            decisions = planning.decide(
                plan, selected, index, self.resuming and not reset, self.settings.max_attempts
            )
            run = TaskRun(
                name=task.name,
                task=task,
                plan=plan,
                recorder=recorder,
                selected=list(selected),
                decisions=decisions,
                instance_order=[inst["id"] for inst in task.instances],
                gate=task.gate,
            )
            self._chunk(run)
            self.runs[task.name] = run

    @property
    def resuming(self) -> bool:
        return self.settings.resume or self.settings.resume_stage is not None

    def _read(self, recorder: TaskRecorder, plan: TaskPlan) -> JournalIndex:
        index = recorder.read_snapshot()
        if index.torn is not None:
            self.notes.append(f"{index.path}:{index.torn}: ignored a torn last line (a run died mid-write)")
        self.notes.extend(planning.foreign_rows(plan, index))
        return index

    def _register_elo(
        self, eval_: EloEval, all_keys: Sequence[RolloutKey], selected: Sequence[RolloutKey], directory: Path
    ) -> None:
        from pytest_evalreplay.elorun import (
            EloDriver,
            check_kept_stages,
            stage_of_first_incomplete,
        )
        from pytest_evalreplay.fingerprint import describe_change, fingerprint
        from pytest_evalreplay.stages import StageLog, stage_configs

        pool = eval_.pool
        seed, stage_tasks = self.elo_draw(eval_)
        pool_digests = {iid: rq for (_, iid), rq in pool.request_digests().items()}
        requests = {(s, tid): pool_digests[tid] for s, tids in enumerate(stage_tasks, 1) for tid in tids}
        plan = TaskPlan(eval_.name, tuple(all_keys), requests, self.provider_digest)
        configs = stage_configs(eval_, seed, pool_digests, self.provider_identity)
        fingerprints = [fingerprint(c) for c in configs]
        narrowed = len(selected) < len(all_keys)
        reset = self.settings.reset or (not self.resuming and not narrowed)
        recorder = TaskRecorder(directory, eval_.name, self.run_id, reset, self.snapshot.get(eval_.name))
        index = None if reset else self._read(recorder, plan)
        log = StageLog.read(index) if index is not None else StageLog()
        stages = len(eval_.stages)
        replan_from = stages + 1 if self.resuming else 1
        if self.settings.resume_stage is not None:
            first = self.settings.resume_stage or min(stage_of_first_incomplete(log, fingerprints), stages)
            if first > stages:
                raise EvalReplayError(f"--resume-stage={first}: {eval_.name!r} has only {stages} stages")
            check_kept_stages(eval_.name, log, fingerprints, configs, first)
            replan_from = first
        for stage in range(1, stages + 1):
            record = log.stages.get(stage)
            if record is not None and record.fingerprint != fingerprints[stage - 1] and self.resuming:
                self.notes.append(
                    f"{eval_.name}: stage {stage} starts fresh "
                    f"({describe_change(record.config, configs[stage - 1])})"
                )
                replan_from = min(replan_from, stage)
                break
        kept = [key for key in selected if key[0] < replan_from]
        fresh = [key for key in selected if key[0] >= replan_from]
        decisions = planning.decide(
            plan, kept, index, self.resuming and not reset, self.settings.max_attempts
        )
        again = planning.decide(
            plan,
            fresh,
            index,
            self.settings.resume and not reset and self.settings.resume_stage is None,
            self.settings.max_attempts,
        )
        decisions.run.extend(again.run)
        decisions.reuse.update(again.reuse)
        decisions.failed.update(again.failed)
        decisions.prior_attempts.update(again.prior_attempts)
        run = TaskRun(
            name=eval_.name,
            task=pool,
            plan=plan,
            recorder=recorder,
            selected=list(selected),
            decisions=decisions,
            instance_order=[inst["id"] for inst in pool.instances],
            gate=eval_.gate,
        )
        driver = EloDriver(
            session=self,
            eval=eval_,
            seed=seed,
            stage_tasks=stage_tasks,
            configs=configs,
            fingerprints=fingerprints,
            replan_from=replan_from,
        )
        from pytest_evalreplay.judges import LlmJudge

        if isinstance(eval_.judge, LlmJudge):
            driver.judge_recorder = TaskRecorder(
                directory, f"{eval_.name}-judge", self.run_id, reset, self.snapshot.get(f"{eval_.name}-judge")
            )
            if not reset:
                driver.judge_recorder.read_snapshot()
        run.elo = driver
        self._chunk(run)
        self.runs[eval_.name] = run

    def _chunk(self, run: TaskRun) -> None:
        size = self.settings.batch_size
        if size is None and self.host.built:
            size = getattr(self.host.get(), "batch_size", None)
            if size is not None and (type(size) is not int or size < 1):
                raise EvalReplayError(
                    f"the provider's batch_size must be a positive int or None, got {size!r} "
                    f"(provider kind {self.settings.provider!r})"
                )
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
            if not run.decisions.reuse or run.elo is not None:
                continue  # an ELO stage's reused items run (reported skipped): judging needs its plan
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
        if run.elo is not None and key in run.decisions.run:
            run.elo.plan(key[0])  # recorded before the stage's first generation
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
        if run.elo is not None:
            return run.elo.judge(key, raw, of)
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

    def _kept_scores(self, run: TaskRun, key: RolloutKey, gen: GenRef) -> ScoreRef | None:
        """The saved scores of a generation, when --evalreplay-reuse-scores keeps
        them rather than scoring it again."""
        if not self.settings.reuse_scores:
            return None
        saved = run.recorder.index.score_of(key, gen)
        return saved if saved is not None and saved.error is None and saved.scores is not None else None

    def _score_reused(self, run: TaskRun, key: RolloutKey) -> RolloutResult:
        gen = run.decisions.reuse[key]
        index = run.recorder.index
        saved = self._kept_scores(run, key, gen)
        if saved is not None and saved.scores is not None:
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
        gen = self.own_gen(run, key)
        if gen is None and self.own_failure(run, key) is None:
            self.generate_chunk(run, run.chunk_of[(key[0], key[1])])
            gen = self.own_gen(run, key)
        index = run.recorder.index
        if gen is None:
            fail = self.own_failure(run, key)
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

    def own_gen(self, run: TaskRun, key: RolloutKey) -> Any:
        """This run's generation of `key` (not an earlier run's: a run without
        --resume regenerates what it selected)."""
        gen = run.recorder.index.latest_gen(key, run.plan.request_of(key), self.provider_digest)
        return gen if gen is not None and gen.run == self.run_id else None

    def own_failure(self, run: TaskRun, key: RolloutKey) -> Any:
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
        for rk in chunk:
            missing = tuple(
                r
                for r in run.rollouts_of[rk]
                if self.own_gen(run, (*rk, r)) is None and self.own_failure(run, (*rk, r)) is None
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

    def generate_chunk(self, run: TaskRun, number: int) -> None:
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
        if run.elo is not None:
            run.elo.complete_all()
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
        return self.own_failure(run, key) is not None

    def _rescore_unselected(self, run: TaskRun) -> None:
        """Score, with the current scorer, the generations the journal holds for
        items this session did not select (a narrowed run; rollouts a killed run
        generated but never scored), so the run dir is what one clean run of the
        current configuration writes. Under xdist each worker takes its share;
        the last worker to finish writes the run dir with every share done."""
        selected = set(run.selected)
        index = run.recorder.index
        share = self.worker
        for n, key in enumerate(run.plan.keys):
            if key in selected or (share is not None and n % share.count != share.index % share.count):
                continue
            gen, _ = index.standing(key, run.plan.request_of(key), self.provider_digest)
            if gen is not None and self._kept_scores(run, key, gen) is None:
                self._score(run, key, index.generation(gen), gen.run)

    def outcome(self, run: TaskRun) -> TaskOutcome:
        """The task's numbers from its journal (the caller has flushed; under the lock at the end)."""
        run.recorder.flush()
        outcome = task_outcome(
            run.plan, run.recorder.index, self.settings.max_attempts, self.run_id, self.host.model()
        )
        if run.elo is not None:
            outcome = run.elo.with_rating(outcome)
        run.outcome = outcome
        return outcome

    def gate_outcome(self, task: EvalTask | EloEval) -> gates.GateOutcome:
        run = self.runs[task.name]
        gate = run.gate
        assert gate is not None
        outcome = self.complete(task.name)
        baseline = self.baseline().get(task.name)
        paired = None
        if run.elo is not None and gate.max_drop is not None and baseline is not None and baseline.elo:
            paired = run.elo.paired_drop(baseline.elo)
        return gates.evaluate(
            task=task.name,
            gate=gate,
            metrics=outcome.metrics,
            scores=gates.metric_scores(outcome.instance_scores, gate.metric),
            num_items=outcome.num_items - outcome.num_missing,
            num_failed=outcome.num_failed,
            budget=self.settings.failure_budget,
            baseline=baseline,
            missing=outcome.num_missing,
            paired=paired,
            compared=self.settings.compare is not None,
        )

    # -- the end -----------------------------------------------------------------

    def finish(self) -> None:
        """Write each touched task's run dir files from its journal (under the
        task lock, so the last process of a run to finish writes the fullest
        view), the manifest, and the baseline when asked."""
        entries: dict[str, gates.BaselineTask] = {}
        source = self._source() if self.settings.update_baseline else None  # one git call, not one per task
        for name, run in self.runs.items():
            if not run.touched:
                continue
            recorder = run.recorder
            if run.elo is not None:
                try:
                    run.elo.complete_all()
                except EvalReplayError as exc:
                    self.notes.append(f"{name}: {exc}")
                run.elo.write_judge_files()
                self.notes.extend(n for n in dict.fromkeys(run.elo.notes) if n not in self.notes)
            if run.elo is None:
                self._rescore_unselected(run)
            recorder.flush()
            with recorder.locked():
                recorder.refresh()
                outcome = task_outcome(
                    run.plan, recorder.index, self.settings.max_attempts, self.run_id, self.host.model()
                )
                if run.elo is not None:
                    outcome = run.elo.with_rating(outcome)
                recorder.write_run_dir(
                    outcome, self.run_id, run.instance_order, run.task.num_samples, run.task.postprocess
                )
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
                entries[name] = gates.baseline_entry(
                    run.gate,
                    outcome.metrics,
                    outcome.instance_scores,
                    outcome.extra.get("elo"),
                    source,
                )
        if entries and self.settings.baseline is not None:
            from pytest_evalreplay import baseline

            try:
                baseline.update(self.settings.baseline, entries)
            except EvalReplayError as exc:
                self.notes.append(f"baseline not updated: {exc}")
            else:
                self.notes.append(
                    f"baseline {self.settings.baseline} updated for: {', '.join(sorted(entries))}"
                )
        if self.docs and self._output is not None:
            from filelock import FileLock

            with FileLock(str(self.output / ".manifest.lock")):
                write_manifest(self.output, self.host.model(), self.provider_identity, list(self.docs))

    def _source(self) -> dict[str, Any]:
        """Where a baseline written now comes from: model, run, date and, in a git
        work tree, the commit."""
        import datetime as dt
        import subprocess

        commit = None
        try:
            out = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                cwd=self.rootdir,
                capture_output=True,
                text=True,
                timeout=10,
            )
            if out.returncode == 0:
                commit = out.stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            pass
        return {
            "model": self.host.model(),
            "run": self.run_id,
            "date": dt.date.today().isoformat(),
            "commit": commit,
        }

    def close_provider(self) -> None:
        self.host.close()
        self.notes.extend(n for n in self.host.notes if n not in self.notes)

    def close(self) -> None:
        self.close_provider()
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
