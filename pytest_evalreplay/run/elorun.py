"""An `EloEval` in a session, driven forward stage by stage.

    plan (or replay the recorded plan) -> generate -> judge -> complete

Stage s runs, whole and once per run, when the first item of stage s (or a
gate) asks for its result, after stages 1..s-1 in order: one process of a
pytest-xdist run drives it under the stage's lock, the others then read its
results from the journal. Items only read. Nothing else starts a stage, so a
Ctrl-C, `-x`, `--maxfail` or a provider that raises stops the eval where it
is: no later stage is generated, judged or marked complete.

A stage's plan (the references it judges against, chosen nearest the rating
after the stage before) is recorded before it is judged. A resumed run
replays a recorded plan when its fingerprint (configuration) and the rating
it started from are unchanged, so an interrupted stage replays exactly, and
plans it afresh otherwise. Verdicts follow the same rule as scores: a
function judge is called again on every stage a run drives (it is cheap, and
what it calls may have changed), an LLM judge's verdict is reused only for
the same request asked of the same judge (`elojudge.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_evalreplay.journal.index import JournalIndex
from pytest_evalreplay.journal.rows import RolloutKey
from pytest_evalreplay.journal.stagelog import StageLog, complete_row, planned_row, seed_row
from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.numbers import planning
from pytest_evalreplay.numbers.elo.rating import Ratings
from pytest_evalreplay.numbers.elo.stageplan import (
    choose_seed,
    replan_from,
    replays,
    same_rating,
    shown,
    wait_for_merge,
)
from pytest_evalreplay.numbers.gates import BaselineTask, PairedDrop
from pytest_evalreplay.numbers.metrics import TaskOutcome, item_outcome, task_outcome
from pytest_evalreplay.numbers.planning import Decisions, TaskPlan
from pytest_evalreplay.run.context import RunContext
from pytest_evalreplay.run.elojudge import Judging
from pytest_evalreplay.run.execution import RolloutResult
from pytest_evalreplay.run.rollouts import Rollouts, open_recorder
from pytest_evalreplay.stages import EloEval, stage_configs
from pytest_evalreplay.storage.runschema import task_files
from pytest_evalreplay.values.fingerprint import fingerprint


@dataclass(frozen=True)
class StagePlan:
    references: tuple[str, ...]
    prior_rating: float | None


def draw(ctx: RunContext, eval_: EloEval) -> tuple[int, list[list[str]]]:
    """An EloEval's seed (`stageplan.choose_seed`, asking the journal, then
    the saved run being replayed) and each stage's task ids."""
    s = ctx.settings
    seed = choose_seed(
        eval_.name,
        eval_.seed,
        lambda: (
            None if s.reset else recorded_seed(ctx.output_factory(), eval_.name, ctx.snapshot.get(eval_.name))
        ),
        lambda: (
            saved_seed(s.predictions, eval_.name)
            if s.provider == "replay" and s.predictions is not None
            else None
        ),
        None if s.shard is None else str(s.shard),
        ctx.seed,
    )
    return seed, eval_.draw(seed)


@dataclass
class EloRun(Rollouts):
    eval: EloEval | None = None
    seed: int = 0
    stage_tasks: list[list[str]] = field(default_factory=list)
    fingerprints: list[str] = field(default_factory=list)
    configs: list[dict[str, Any]] = field(default_factory=list)
    replan_from: int = 1  # stages >= this are planned afresh (their recorded plans are not replayed)
    judging: Judging | None = None
    ratings: Ratings | None = None  # reads the recorder's index, which refreshes in place
    plans: dict[int, StagePlan] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)  # stages driven to their end in this run
    incomplete: dict[int, list[RolloutKey]] = field(default_factory=dict)  # stage -> items without a result
    lines: list[str] = field(default_factory=list)
    pending: dict[int, str] = field(
        default_factory=dict
    )  # stage -> what the journal promises, said once it held

    @classmethod
    def register(
        cls,
        ctx: RunContext,
        eval_: EloEval,
        all_keys: Sequence[RolloutKey],
        selected: Sequence[RolloutKey],
        directory: Path,
        drawn: tuple[int, list[list[str]]],
    ) -> EloRun:
        seed, stage_tasks = drawn
        all_keys = tuple(all_keys)
        pool = eval_.pool
        pool_digests = {iid: rq for (_, iid), rq in pool.request_digests().items()}
        requests = {(s, tid): pool_digests[tid] for s, tids in enumerate(stage_tasks, 1) for tid in tids}
        plan = TaskPlan(eval_.name, tuple(all_keys), requests, ctx.provider_digest)
        configs = stage_configs(eval_, seed, pool_digests, ctx.provider_identity)
        fingerprints = [fingerprint(c) for c in configs]
        recorder, index = open_recorder(ctx, eval_.name, plan, len(selected) < len(all_keys), directory)
        waiting: list[RolloutKey] = []
        lines: list[str] = []
        if ctx.settings.shard is not None:  # later stages wait for every shard's verdicts
            selected, waiting, lines = wait_for_merge(
                eval_.name, plan, index, len(stage_tasks), ctx.settings.max_attempts, selected
            )
        log = StageLog.read(index) if index is not None else StageLog()
        ratings = Ratings(
            plan,
            recorder.index,
            stage_tasks,
            eval_.num_samples,
            {name: ref.elo for name, ref in eval_.references.items()},
            seed,
            ctx.settings.max_attempts,
        )
        first_fresh, stage_lines = replan_from(
            eval_.name,
            len(eval_.stages),
            ctx.resuming,
            ctx.settings.resume_stage,
            log,
            fingerprints,
            configs,
            lambda s: ratings.table(upto=s, only=s).num_judgments,
        )
        decisions = _decide(ctx, plan, selected, index, first_fresh)
        judging = Judging(ctx, eval_, directory)
        judging.check_references(stage_tasks)
        run = cls(
            ctx,
            eval_.name,
            pool,
            plan,
            recorder,
            list(selected),
            decisions,
            gate=eval_.gate,
            eval=eval_,
            seed=seed,
            stage_tasks=stage_tasks,
            fingerprints=fingerprints,
            configs=configs,
            replan_from=first_fresh,
            judging=judging,
            ratings=ratings,
            lines=[*(line.text for line in stage_lines if not line.provisional), *lines],
            pending={line.stage: line.text for line in stage_lines if line.provisional and line.stage},
            waiting=waiting,
        )
        run.note_unfinished(index)
        return run

    @property
    def elo(self) -> EloEval:
        assert self.eval is not None
        return self.eval

    def _rating(self) -> Ratings:
        assert self.ratings is not None
        return self.ratings

    def status(self) -> Sequence[str]:
        return [*self.lines, self.unfinished] if self.unfinished else self.lines

    def stage_keys(self, stage: int) -> list[RolloutKey]:
        n = self.elo.num_samples
        return [(stage, tid, r) for tid in self.stage_tasks[stage - 1] for r in range(n)]

    def log(self) -> StageLog:
        return StageLog.read(self.recorder.index)

    def note_unfinished(self, index: JournalIndex | None) -> None:
        """A plain run over an unfinished ELO run (some item without verdicts,
        its candidate already generated, as when judging was killed) says what
        --resume would keep: every generation may be there while no item is done."""
        if index is None or self.ctx.resuming:
            return
        attempts = self.ctx.settings.max_attempts
        if any(item_outcome(self.plan, index, key, attempts).status == "missing" for key in self.selected):
            reused = planning.decide(self.plan, self.selected, index, True, attempts).reuse
            self.unfinished = planning.resumable_line(self.name, len(reused))

    @property
    def chunks_by_stage(self) -> bool:
        return True  # a stage's requests are asked once its plan is recorded, never with an earlier stage's

    # -- items ------------------------------------------------------------------------

    def rescore_reused(self) -> list[RolloutKey]:
        return []  # an ELO stage's reused items run (reported skipped, with their verdicts)

    def result(self, key: RolloutKey) -> RolloutResult:
        """An item's verdicts, read from the journal once its stage has run."""
        self.touched = True
        try:
            self.advance(key[0])
        except EvalReplayError as exc:
            self.pending.clear()  # a stage that could not be driven is not said kept or replayed
            return self.failure(key, str(exc), "judging")
        if key in self.decisions.failed:
            return self.failed_before(key)
        gen = self.candidate(key)
        if gen is None:
            return self.not_generated(key)
        index = self.recorder.index
        generation = self.elo.pool.postprocess(index.generation(gen))
        score = index.score_of(key, gen)
        if score is None or score.error is not None:
            error = (
                score.error
                if score is not None
                else f"stage {key[0]} was not judged; run again with --resume"
            )
            return self.result_of(key, generation=generation, error=error, failure_class="judging")
        return self.result_of(key, generation=generation, scores=dict(score.scores or {}))

    def complete(self) -> TaskOutcome:
        """Drive every stage this session selected items of (a gate), then the numbers."""
        self.touched = True
        if self.selected:
            self.advance(max(key[0] for key in self.selected))
        self.recorder.flush()
        return self.outcome_now()

    # -- the pipeline ---------------------------------------------------------------------

    def advance(self, stage: int) -> None:
        """Stages 1..stage, in order, each run whole once."""
        for s in range(1, stage + 1):
            if s not in self.done:
                self._run_stage(s)

    def _run_stage(self, stage: int) -> None:
        recorder = self.recorder
        unit = f"stage-{stage}"
        with recorder.chunk_locked(unit):
            recorder.flush()  # and read what peers wrote
            record = self.log().stages.get(stage)
            if recorder.done_in_this_run(unit) and record is not None:  # a peer of this run drove it
                self.plans[stage] = StagePlan(tuple(record.references), record.prior_rating)
                self.pending.pop(stage, None)  # the peer says what happened to it
            else:
                self._refuse_when_stopping(stage, "planned")
                plan = self._plan(stage)
                keys = self.stage_keys(stage)
                self.ensure_generated(k for k in keys if k in self.decisions.run)
                self._refuse_when_stopping(stage, "judged")
                reached = self._reached(keys)
                self._judge(plan, reached)
                self._complete(stage)
                if len(reached) == len(keys):
                    recorder.mark_done(unit)
        self.done.add(stage)

    def _refuse_when_stopping(self, stage: int, step: str) -> None:
        if self.ctx.failures_left() == 0:
            raise EvalReplayError(
                f"the session is stopping (-x, --maxfail or an interrupt), so stage {stage} of "
                f"{self.name!r} was not {step}; run again with --resume to go on"
            )

    def _reached(self, keys: Sequence[RolloutKey]) -> list[RolloutKey]:
        """The stage's rollouts pytest will reach: under -x or --maxfail, those
        before the failed generation that stops the session (the rest are
        not judged, so an LLM judge is not asked what nobody will see)."""
        left = self.ctx.failures_left()
        if left is None:
            return list(keys)
        selected = set(self.selected)
        reached: list[RolloutKey] = []
        for key in keys:
            if key in selected and (key in self.decisions.failed or self.candidate(key) is None):
                left -= 1
                if left <= 0:
                    break
            reached.append(key)
        return reached

    def _plan(self, stage: int) -> StagePlan:
        prior: float | None = None
        if stage > 1:
            missing = self.incomplete.get(stage - 1)
            if missing:
                first = f"{missing[0][1]}[s{stage - 1}-r{missing[0][2]}]"
                raise EvalReplayError(
                    f"stage {stage - 1} of {self.name!r} is not complete ({len(missing)} item"
                    f"{'s' if len(missing) != 1 else ''} without a result, e.g. {first}) "
                    f"and stage {stage} needs its rating: run stage {stage - 1} too (select s{stage - 1}, "
                    "or run without -k)"
                )
            prior = self._rating().fit(upto=stage - 1).rating
        total = len(self.elo.stages)
        record = self.log().stages.get(stage)
        settings = self.ctx.settings
        resumes = settings.resume or settings.resume_stage is not None
        fingerprint_, task_ids = self.fingerprints[stage - 1], self.stage_tasks[stage - 1]
        replay = replays(
            record, stage, self.ctx.run_id, self.replan_from, resumes, prior, fingerprint_, task_ids
        )
        promised = self.pending.pop(stage, None)
        if replay == "rating changed" and record is not None:
            self.ctx.note(
                f"{self.name}: stage {stage}/{total} planned afresh (the rating it starts from changed: "
                f"{shown(record.prior_rating)} -> {shown(prior)})"
            )
        elif replay == "replay" and record is not None:
            unknown = [r for r in record.references if r not in self.elo.references]
            if unknown:
                raise EvalReplayError(
                    f"{self.recorder.index.path}:{record.lineno}: stage {stage}'s recorded plan names "
                    f"reference {unknown[0]!r}, which {self.name!r} does not have; run with "
                    f"--resume-stage={stage} to plan the stage again (or fix that line)"
                )
            chosen = StagePlan(tuple(record.references), record.prior_rating)
            self.plans[stage] = chosen
            if promised is not None:  # replayed, as the journal promised (a kept stage: once judged)
                if record.complete:
                    self.pending[stage] = promised
                else:
                    self.ctx.note(promised)
            return chosen
        from pytest_evalreplay.numbers.elo.fit import choose_references

        elos = {name: ref.elo for name, ref in self.elo.references.items()}
        chosen = StagePlan(
            tuple(choose_references(elos, prior, self.elo.stages[stage - 1].references)), prior
        )
        rows = [] if self.log().seed == self.seed else [seed_row(self.seed, self.ctx.run_id)]
        rows.append(
            planned_row(
                stage,
                self.stage_tasks[stage - 1],
                chosen.references,
                prior,
                self.fingerprints[stage - 1],
                self.configs[stage - 1],
                self.ctx.run_id,
            )
        )
        self.recorder.add(rows)
        self.recorder.flush()  # the plan is durable before anything of the stage is judged
        self.plans[stage] = chosen
        return chosen

    def _judge(self, plan: StagePlan, keys: Sequence[RolloutKey]) -> None:
        """Every one of these rollouts that has a generation, judged against the plan's references."""
        assert self.judging is not None
        index = self.recorder.index
        items = [(key, gen) for key in keys if (gen := self.candidate(key)) is not None]
        pool = self.elo.pool
        verdicts = self.judging.judge(
            plan.references, [(key, pool.postprocess(index.generation(gen))) for key, gen in items]
        )
        for key, gen in items:
            v = verdicts[key]
            self.recorder.add(
                self.recorder.score(key, gen.run, v.scores, v.error, v.judgments, v.no_answer, v.unreadable)
            )
        self.recorder.flush()

    def _complete(self, stage: int) -> None:
        """The stage's `complete` record, once every item has a result and one pair was judged."""
        index, settings = self.recorder.index, self.ctx.settings
        missing = [
            key
            for key in self.stage_keys(stage)
            if item_outcome(self.plan, index, key, settings.max_attempts).status == "missing"
        ]
        promised = self.pending.pop(stage, None)
        if missing:
            self.incomplete[stage] = missing
            return
        ratings = self._rating()
        if ratings.table(upto=stage, only=stage).num_judgments == 0:
            self.ctx.note(f"{self.name}: stage {stage} has no judged pair and stays incomplete")
            return
        fit = ratings.fit(upto=stage)
        record = self.log().stages.get(stage)
        if (
            record is not None
            and record.complete
            and record.fingerprint == self.fingerprints[stage - 1]
            and same_rating(record.rating, fit.rating)
        ):
            if promised is not None:
                self.ctx.note(promised)
            return  # kept as recorded: the journal says it already
        if promised is not None:  # kept, and judged again: its verdicts moved the rating
            self.ctx.note(
                f"{self.name}: stage {stage}/{len(self.elo.stages)} judged again: ELO "
                f"{shown(record.rating if record is not None else None)} -> {shown(fit.rating)} "
                "(its verdicts changed)"
            )
        self.recorder.add(
            [complete_row(stage, fit.rating, fit.se, self.fingerprints[stage - 1], self.ctx.run_id)]
        )
        self.recorder.flush()

    # -- the end ------------------------------------------------------------------------------

    def outcome_now(self) -> TaskOutcome:
        base = task_outcome(
            self.plan,
            self.recorder.index,
            self.ctx.settings.max_attempts,
            self.ctx.run_id,
            self.ctx.model(),
        )
        self.outcome = self._rating().with_rating(base, self.log(), self.plans, len(self.elo.stages))
        return self.outcome

    def before_finish(self) -> None:
        stages = self.log().stages
        for stage in sorted(self.pending):  # complete stages this run did not drive stand as recorded
            line = self.pending.pop(stage)
            if (record := stages.get(stage)) is not None and record.complete:
                self.ctx.note(line)
        assert self.judging is not None
        self.judging.write_files()  # no stage is driven at the end

    def paired_drop(self, baseline: BaselineTask) -> PairedDrop | None:
        if not baseline.elo:
            return None
        return self._rating().paired_drop(baseline.elo, len(self.elo.stages))


# -- registration --------------------------------------------------------------------------


def _decide(
    ctx: RunContext,
    plan: TaskPlan,
    selected: Sequence[RolloutKey],
    index: JournalIndex | None,
    replan_from: int,
) -> Decisions:
    """Candidate generations: reused by content in kept and replayed stages
    (and, with --resume, in stages planned afresh); regenerated in stages
    --resume-stage plans afresh."""
    s = ctx.settings
    kept = [key for key in selected if key[0] < replan_from]
    fresh = [key for key in selected if key[0] >= replan_from]
    decisions = planning.decide(plan, kept, index, ctx.resuming and index is not None, s.max_attempts)
    again = planning.decide(
        plan, fresh, index, s.resume and index is not None and s.resume_stage is None, s.max_attempts
    )
    decisions.run.extend(again.run)
    decisions.reuse.update(again.reuse)
    decisions.failed.update(again.failed)
    decisions.prior_attempts.update(again.prior_attempts)
    decisions.changed_request += again.changed_request
    decisions.changed_provider += again.changed_provider
    return decisions


def recorded_seed(directory: Path, name: str, limit: int | None) -> int | None:
    """The seed an earlier run of this eval recorded in the output dir's journal."""
    try:
        return StageLog.read(JournalIndex.read(directory, name, limit)).seed
    except EvalReplayError:
        return None


def saved_seed(predictions: Path, name: str) -> int | None:
    """The seed a saved ELO run (a run dir being replayed) was drawn with."""
    import orjson

    path = task_files(predictions if predictions.is_dir() else predictions.parent, name)["metrics"]
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    seed = (doc.get("elo") or {}).get("seed") if isinstance(doc, dict) else None
    return seed if type(seed) is int else None
