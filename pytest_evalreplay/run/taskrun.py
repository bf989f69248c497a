"""A plain `EvalTask` in a session: reuse what the journal holds (rescored by
the current scorer), generate the rest chunk by chunk, score where the item
runs (so pytest-xdist spreads scoring), and write the run dir at the end."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_evalreplay.journal.index import GenRef, ScoreRef
from pytest_evalreplay.journal.rows import RolloutKey
from pytest_evalreplay.model import Generation, Provider
from pytest_evalreplay.numbers import planning
from pytest_evalreplay.numbers.gates import BaselineTask, PairedDrop
from pytest_evalreplay.numbers.metrics import TaskOutcome, task_outcome
from pytest_evalreplay.numbers.planning import TaskPlan
from pytest_evalreplay.rubric import Graded
from pytest_evalreplay.run.context import RunContext
from pytest_evalreplay.run.execution import RolloutResult, score_generation
from pytest_evalreplay.run.grader import Grading
from pytest_evalreplay.run.rollouts import Rollouts, open_recorder
from pytest_evalreplay.task import EvalTask

ARRIVAL_BUDGET = 0.001  # seconds of scoring an answer on arrival may cost, on average


@dataclass
class TaskRun(Rollouts):
    results: dict[RolloutKey, RolloutResult] = field(default_factory=dict)  # computed, not yet reported
    resolved: set[RolloutKey] = field(default_factory=set)  # scored or failed by this process
    running: tuple[str, float, int] | None = None  # the first metric: name, sum, count so far
    on_arrival: set[RolloutKey] = field(default_factory=set)  # scored as the answer arrived
    arrival_cost: tuple[float, int] | None = (0.0, 0)  # seconds and answers scored so; None: stopped
    grading: Grading | None = None  # the judge of a scorers.graded(...) task
    graded: set[RolloutKey] = field(default_factory=set)  # rollouts whose grades were asked for

    @classmethod
    def register(
        cls,
        ctx: RunContext,
        task: EvalTask,
        all_keys: Sequence[RolloutKey],
        selected: Sequence[RolloutKey],
        directory: Path,
    ) -> TaskRun:
        """Plan the task (its full key list, the requests rendered now) and sort
        its selected keys into reuse, run and failed-before."""
        plan = TaskPlan(
            task.name, tuple(all_keys), task.request_digests(), ctx.provider_digest, task.sample_metrics
        )
        recorder, index = open_recorder(ctx, task.name, plan, len(selected) < len(all_keys), directory)
        decisions = planning.decide(
            plan, selected, index, ctx.resuming and index is not None, ctx.settings.max_attempts
        )
        if task.agent is not None:
            # An agent runs again at a resume: its recorded turns answer it
            # while it asks what it asked before, so an edited agent is seen.
            decisions.run = [key for key in selected if key not in decisions.failed]
            decisions.reuse.clear()
        task.keep_rendered({iid for _, iid, _ in decisions.run})
        run = cls(ctx, task.name, task, plan, recorder, list(selected), decisions, gate=task.gate)
        if task.agent is not None:
            run.episodes  # noqa: B018  its turns journal is read now: a bad line is refused up front
        if isinstance(task.scorer, Graded):
            run.grading = Grading(ctx, task, task.scorer, directory)
        run.note_unfinished(index)
        return run

    def status(self) -> Sequence[str]:
        return [self.unfinished] if self.unfinished else []

    # -- results -------------------------------------------------------------------

    def result(self, key: RolloutKey) -> RolloutResult:
        """An item's result: reused and rescored, failed before, or generated
        (its chunk, by whichever process of the run gets there first) and scored."""
        self.touched = True
        result = self.results.pop(key, None)
        if result is not None:
            return result
        if key in self.decisions.reuse:
            return self._score_reused(key)
        if key in self.decisions.failed:
            self.resolved.add(key)
            return self.failed_before(key)
        gen = self.own_gen(key)
        chunk = self.chunk_of[(key[0], key[1])]
        if gen is None and self.own_failure(key) is None:
            self.generate_chunk(chunk)
            gen = self.own_gen(key)
        if gen is None:
            self.resolved.add(key)
            return self.not_generated(key)
        if key in self.on_arrival:
            return self._scored_on_arrival(key, gen)
        if self.grading is not None and key not in self.graded:  # the chunk's grades in one batch
            mine = [(*rk, r) for rk in self.chunks[chunk] for r in self.rollouts_of[rk]]
            self._grade([(k, g) for k in mine if (g := self.own_gen(k)) is not None])
        return self._score(key, self.recorder.index.generation(gen), gen.run)

    def _grade(self, items: Sequence[tuple[RolloutKey, GenRef]]) -> None:
        """Ask a graded task's judge about these rollouts' answers, in one batch."""
        todo = [(key, gen) for key, gen in items if key not in self.graded]
        if self.grading is None or not todo:
            return
        index = self.recorder.index
        self.grading.ask([(key, self.task.postprocess(index.generation(gen)).text) for key, gen in todo])
        self.graded.update(key for key, _ in todo)

    def on_answer(self, provider: Provider) -> Callable[[RolloutKey, Generation], None] | None:
        """One process, a provider that streams, a scorer that has cost under
        `ARRIVAL_BUDGET` an answer: score each answer as it arrives, so the
        progress line shows the metric so far. A batch provider's answers
        all wait in memory until written, and answers that arrive while a slow
        scorer runs wait in the provider's queue: those are scored where their
        items run (spread over workers under pytest-xdist), as is everything
        under xdist, and a graded task's (its judge is asked a chunk at a time)."""
        call = "generate_stream" if self.task.choices is None else "loglikelihood_stream"
        streams = callable(getattr(provider, call, None))
        eager = streams and self.ctx.worker is None and self.arrival_cost is not None and self.grading is None
        return self._answered if eager else None

    def _answered(self, key: RolloutKey, generation: Generation) -> None:
        if self.arrival_cost is None:
            return
        start = time.perf_counter()
        self._score(key, generation, self.ctx.run_id)
        self.on_arrival.add(key)
        spent, count = self.arrival_cost
        spent, count = spent + time.perf_counter() - start, count + 1
        self.arrival_cost = (spent, count) if spent <= ARRIVAL_BUDGET * count else None

    def _scored_on_arrival(self, key: RolloutKey, gen: GenRef) -> RolloutResult:
        """The item's result from the scores written when its answer arrived."""
        index = self.recorder.index
        saved = index.score_of(key, gen)
        if saved is None or saved.run != self.ctx.run_id:
            return self._score(key, index.generation(gen), gen.run)
        return self._saved_result(key, gen, saved)

    def _saved_result(self, key: RolloutKey, gen: GenRef, saved: ScoreRef) -> RolloutResult:
        """An item's result from scores the journal holds (no scorer called)."""
        self.resolved.add(key)
        return self.result_of(
            key,
            generation=self.task.postprocess(self.recorder.index.generation(gen)),
            scores=dict(saved.scores or {}),
            error=saved.error,
            failure_class="scoring" if saved.error else None,
        )

    def _score(self, key: RolloutKey, raw: Generation, of: str) -> RolloutResult:
        task = self.task
        generation = task.postprocess(raw)
        if self.grading is not None:
            if key not in self.graded:
                self.grading.ask([(key, generation.text)])
                self.graded.add(key)
            grades, error = self.grading.scores(key, generation.text)
            scores = None
            if grades is not None:
                scores, error = score_generation(task, task.instance(key[1]), generation, grades)
        else:
            scores, error = score_generation(task, task.instance(key[1]), generation)
        self.recorder.add(self.recorder.score(key, of, scores, error))
        self.resolved.add(key)
        self._tally(scores)
        return self.result_of(
            key,
            generation=generation,
            scores=scores or {},
            error=error,
            failure_class="scoring" if error else None,
        )

    def _kept_scores(self, key: RolloutKey, gen: GenRef) -> ScoreRef | None:
        """The saved scores of a generation, when --evalreplay-reuse-scores keeps
        them rather than scoring it again."""
        if not self.ctx.settings.reuse_scores:
            return None
        saved = self.recorder.index.score_of(key, gen)
        return saved if saved is not None and saved.error is None and saved.scores is not None else None

    def _score_reused(self, key: RolloutKey) -> RolloutResult:
        gen = self.decisions.reuse[key]
        index = self.recorder.index
        saved = self._kept_scores(key, gen)
        if saved is not None:
            self._tally(saved.scores)
            return self._saved_result(key, gen, saved)
        return self._score(key, index.generation(gen), gen.run)

    def _replay_now(self) -> None:
        """Under replay, answer every rollout to run from the saved run at
        once (its chunks, through the one loop into the journal) and handle
        what it answered as --resume handles what the journal holds: reused,
        rescored, deselected. What it could not answer (no saved prompt, a
        sample count that differs) stays to run, to report its failure."""
        if self.ctx.settings.provider != "replay" or self.task.agent is not None:
            return
        self.ensure_generated(self.decisions.run)
        run: list[RolloutKey] = []
        for key in self.decisions.run:
            gen = self.own_gen(key)
            if gen is None:
                run.append(key)
            else:
                self.decisions.reuse[key] = gen
                self.replayed.add(key)
        self.decisions.run = run

    def _tally(self, scores: Mapping[str, float] | None) -> None:
        """The running value of the task's first metric, for the progress line."""
        if not scores:
            return
        name, total, count = self.running or (next(iter(scores)), 0.0, 0)
        if name not in scores:
            return
        self.running = (name, total + float(scores[name]), count + 1)
        self.ctx.progress.metric(self.name, f"{name}={self.running[1] / self.running[2]:.3f}")

    def rescore_reused(self) -> list[RolloutKey]:
        self._replay_now()
        if self.grading is not None and not self.ctx.settings.reuse_scores:
            self._grade(list(self.decisions.reuse.items()))
        done = [key for key in self.decisions.reuse if self._score_reused(key).ok]
        self.recorder.flush()
        self.touched = True
        return done

    # -- the end ---------------------------------------------------------------------

    def complete(self) -> TaskOutcome:
        """Every selected item's result in the journal (computing here what no
        process of the run has yet), then the task's numbers."""
        self.touched = True
        self.recorder.flush()
        for key in self.selected:
            if key in self.resolved or key in self.results or self._resolved_elsewhere(key):
                continue
            self.results[key] = self.result(key)
        self.recorder.flush()
        return self.outcome_now()

    def _resolved_elsewhere(self, key: RolloutKey) -> bool:
        """Another process of this run has scored (or failed) this key."""
        gen = self.own_gen(key)
        if gen is not None:
            score = self.recorder.index.score_of(key, gen)
            if score is not None and score.run == self.ctx.run_id:
                return True
        return self.own_failure(key) is not None

    def outcome_now(self) -> TaskOutcome:
        s = self.ctx.settings
        from_journal = self.episodes.from_journal(self.plan.keys) if self.task.agent is not None else ()
        self.outcome = task_outcome(
            self.plan,
            self.recorder.index,
            s.max_attempts,
            self.ctx.run_id,
            self.ctx.model(),
            self._answer,
            from_journal,
        )
        lm_eval = getattr(self.task, "aggregate_outcome", None)  # an lm-eval task's own aggregation
        if lm_eval is not None:
            self.outcome = lm_eval(self.outcome)
        return self.outcome

    def _answer(self, key: RolloutKey, gen: GenRef) -> Hashable:
        """A scored generation's answer, for maj@k's vote (as scoring saw it)."""
        text = self.task.postprocess(self.recorder.index.generation(gen)).text
        return self.task.answer(text, self.task.instance(key[1]))

    def before_finish(self) -> None:
        """Score, with the current scorer, the generations the journal holds for
        items this session did not select (a narrowed run; rollouts a killed run
        generated but never scored), so the run dir is what one clean run of the
        current configuration writes. Under xdist each worker takes its share;
        the last worker to finish writes the run dir with every share done. A
        shard rescores its own slice only (the merge joins the slices)."""
        selected = set(self.selected)
        index = self.recorder.index
        share = self.ctx.worker
        shard = self.ctx.settings.shard
        todo: list[tuple[RolloutKey, GenRef]] = []
        for n, key in enumerate(self.plan.keys):
            if key in selected or (share is not None and n % share.count != share.index % share.count):
                continue
            if shard is not None and not shard.owns(self.name, key):
                continue
            gen, _ = index.standing(key, self.plan.request_of(key), self.plan.provider)
            if gen is not None and self._kept_scores(key, gen) is None:
                todo.append((key, gen))
        self._grade(todo)
        for key, gen in todo:
            self._score(key, index.generation(gen), gen.run)
        if self.grading is not None:
            self.grading.write_files()

    def merge_spec(self) -> dict[str, Any] | str:
        """What the shard marker records for the merge to write this task's run
        dir from the merged journal alone (`rundir/direct.py`), or why only a
        run of the suite can: a gate, an agent's transcripts, a judge, maj@k's
        answers or a task class of its own need the task's code."""
        task = self.task
        if type(task) is not EvalTask:
            return f"{type(task).__name__} is not a plain EvalTask"
        if task.gate is not None:
            return "its gate is judged by the suite"
        if task.agent is not None:
            return "an agent task's transcripts are written by the suite"
        if self.grading is not None:
            return "a scorers.graded task's judge files are written by the suite"
        if any(m.kind != "pass" for m in self.plan.sample_metrics):
            return "maj@k reads each answer through the task's scorer"
        order = self.instance_order
        if list(self.plan.keys) != [(1, iid, r) for iid in order for r in range(task.num_samples)]:
            return "its items are not one per instance and rollout"
        return {
            "order": [[iid, self.plan.requests[(1, iid)]] for iid in order],
            "num_samples": task.num_samples,
            "strip_reasoning": task.strip_reasoning,
            "pass": [[m.k, m.score] for m in self.plan.sample_metrics],
        }

    def paired_drop(self, baseline: BaselineTask) -> PairedDrop | None:
        return None  # the gate pairs the instance scores
