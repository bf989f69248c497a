"""Running an `EloEval` in a session: stage plans, judging, and the rating.

The candidate's generations go through the session like any task's (chunks,
streaming, the journal); this module adds what is particular to a
multi-stage pairwise eval:

- each stage's plan (its references, chosen from the rating after the stage
  before) is recorded before its first judgment and reused as recorded when
  the run is resumed, so an interrupted stage replays exactly;
- each rollout is judged against each reference of its stage: by a function,
  or by an LLM judge whose requests for a whole stage go to the judge's
  provider in one batch and are journaled in `<name>-judge-journal.jsonl`
  (so `--resume` never asks the judge again, and the run dir's
  `<name>-judge-*.jsonl` let a replay judge without a model);
- a stage is marked complete once every item of it has a result and at least
  one judgment succeeded; the rating is fitted cumulatively after each stage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_evalreplay import planning
from pytest_evalreplay.execution import Done, Failed, RoundEnd, generate_events
from pytest_evalreplay.journal import GenRef, RolloutKey, ScoreRef, digest
from pytest_evalreplay.judges import LlmJudge, check_verdict, mean, task_text
from pytest_evalreplay.metrics import ItemOutcome, TaskOutcome, Tokens, item_outcome
from pytest_evalreplay.model import EvalReplayError, Generation, Request, RolloutResult
from pytest_evalreplay.recorder import TaskRecorder
from pytest_evalreplay.stages import EloEval, StageLog, complete_row, planned_row, seed_row

if TYPE_CHECKING:
    from pytest_evalreplay.elo import EloFit, JudgmentTable
    from pytest_evalreplay.session import EvalSession, TaskRun


@dataclass(frozen=True)
class StagePlan:
    references: tuple[str, ...]
    prior_rating: float | None


@dataclass
class EloDriver:
    """One EloEval's stages in one session (one process)."""

    session: EvalSession
    eval: EloEval
    seed: int
    stage_tasks: list[list[str]]
    configs: list[dict[str, Any]]
    fingerprints: list[str]
    replan_from: int  # stages >= this are planned afresh (their recorded plans are not reused)
    plans: dict[int, StagePlan] = field(default_factory=dict)
    judge_recorder: TaskRecorder | None = None
    _judge_pv: str | None = None
    _judge_identity: dict[str, Any] | None = None
    _judge_provider: Any = None
    _judged_stages: set[int] = field(default_factory=set)
    replayed: dict[int, bool] = field(default_factory=dict)  # stage -> its plan is an earlier run's, replayed
    _references: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.eval.name

    @property
    def run(self) -> TaskRun:
        return self.session.runs[self.name]

    def stage_keys(self, stage: int) -> list[RolloutKey]:
        n = self.eval.num_samples
        return [(stage, tid, r) for tid in self.stage_tasks[stage - 1] for r in range(n)]

    # -- plans -------------------------------------------------------------------------

    def log(self) -> StageLog:
        return StageLog.read(self.run.recorder.index)

    def plan(self, stage: int) -> StagePlan:
        """The stage's plan: as recorded (by this run, or an earlier one being
        resumed with the same fingerprint), or made now from the rating after
        the stage before, and recorded before anything of it is judged."""
        known = self.plans.get(stage)
        if known is not None:
            return known
        recorder = self.run.recorder
        with recorder.locked():
            recorder.refresh()
            recorded = self._usable_record(stage)
        self.replayed[stage] = recorded is not None and self._record_run(stage) != self.session.run_id
        if recorded is None:
            prior: float | None = None
            if stage > 1:
                self.complete_stage(stage - 1)
                prior = self.fit(upto=stage - 1).rating
            from pytest_evalreplay.elo import choose_references

            elos = {name: ref.elo for name, ref in self.eval.references.items()}
            k = self.eval.stages[stage - 1].references
            chosen = StagePlan(tuple(choose_references(elos, prior, k)), prior)
            recorder.flush()
            with recorder.locked():
                recorder.refresh()
                recorded = self._usable_record(stage, own_only=True)
                if recorded is None:
                    from pytest_evalreplay import journal

                    rows = [] if self.log().seed == self.seed else [seed_row(self.seed, self.session.run_id)]
                    journal.append(
                        recorder.directory,
                        self.name,
                        [
                            *rows,
                            planned_row(
                                stage,
                                self.stage_tasks[stage - 1],
                                chosen.references,
                                prior,
                                self.fingerprints[stage - 1],
                                self.configs[stage - 1],
                                self.session.run_id,
                            ),
                        ],
                    )
                    recorder.refresh()
                    recorded = chosen
        self.plans[stage] = recorded
        return recorded

    def _record_run(self, stage: int) -> str | None:
        record = self.log().stages.get(stage)
        return None if record is None else record.run

    def _usable_record(self, stage: int, own_only: bool = False) -> StagePlan | None:
        record = self.log().stages.get(stage)
        if record is None or record.fingerprint != self.fingerprints[stage - 1]:
            return None
        if record.task_ids != self.stage_tasks[stage - 1]:
            return None
        own = record.run == self.session.run_id
        if not own and (own_only or stage >= self.replan_from or not self._resuming(stage)):
            return None
        return StagePlan(tuple(record.references), record.prior_rating)

    def _resuming(self, stage: int) -> bool:
        s = self.session.settings
        return s.resume or (s.resume_stage is not None and stage < self.replan_from)

    # -- references and judges -----------------------------------------------------------

    def reference_answer(self, reference: str, task_id: str) -> str | None:
        """A reference's saved answer to a pool task (None: it has none)."""
        provider = self._references.get(reference)
        if provider is None:
            from pytest_evalreplay.providers.replay import ReplayProvider

            path = self.eval.references[reference].predictions
            try:
                provider = ReplayProvider.from_path(path)
            except EvalReplayError as exc:
                raise EvalReplayError(f"reference {reference!r}: {exc}") from None
            self._references[reference] = provider
        pool = self.eval.pool
        generation = provider.first_sample(pool.request(pool.instance(task_id)))
        if generation is None:
            return None
        return pool.postprocess(generation).text

    def judge_provider(self) -> tuple[Any, str, dict[str, Any]]:
        """The LLM judge's provider, its digest and identity (built once)."""
        if self._judge_provider is None:
            judge = self.eval.judge
            assert isinstance(judge, LlmJudge)
            settings = self.session.settings
            if settings.provider == "replay" and settings.predictions is not None:
                from pytest_evalreplay.providers import path_signature
                from pytest_evalreplay.providers.replay import ReplayProvider

                source = settings.predictions
                path = source / f"{self.name}-judge-predictions.jsonl" if source.is_dir() else source
                if not path.is_file():
                    raise EvalReplayError(
                        f"{path}: the saved run has no judge verdicts for {self.name!r}, so an LLM-judged "
                        "ELO run cannot be replayed without a model; replay a run dir written by the plugin"
                    )
                provider: Any = ReplayProvider.from_path(path)
                identity = {"kind": "replay", "predictions": str(path), "files": path_signature(path)}
            elif judge.provider is None:
                provider = self.session.host.get()
                identity = dict(self.session.provider_identity)
            elif isinstance(judge.provider, str):
                from pytest_evalreplay.providers import ProviderHost

                overrides: dict[str, Any] = {"provider": judge.provider}
                if judge.model is not None:
                    overrides["model"] = judge.model
                if judge.base_url is not None:
                    overrides["base_urls"] = (judge.base_url,)
                host = ProviderHost(dataclasses.replace(settings, **overrides), self.session.host.from_hook)
                identity = host.identity()
                provider = host.get()
            else:
                provider = judge.provider
                identity = {
                    "kind": getattr(provider, "kind", None),
                    "model": getattr(provider, "model", None),
                }
            self._judge_provider = provider
            self._judge_identity = identity
            self._judge_pv = digest(identity)
        assert self._judge_pv is not None and self._judge_identity is not None
        return self._judge_provider, self._judge_pv, self._judge_identity

    def _judge_request(
        self, key: RolloutKey, reference: str, trial: int, candidate: str, ref_text: str
    ) -> Request:
        judge = self.eval.judge
        assert isinstance(judge, LlmJudge)
        stage, tid, rollout = key
        pool = self.eval.pool
        task = task_text(pool.render(pool.instance(tid)))
        return Request(
            task=f"{self.name}-judge",
            instance_id=f"{tid}|r{rollout}|{reference}|t{trial}",
            context=judge.prompt(task, candidate, ref_text, trial),
            system_prompt=judge.system_prompt,
            num_samples=1,
            sampling=dict(judge.sampling),
            stage=stage,
            rollouts=(0,),
        )

    def _ask_llm_judge(self, stage: int, plan: StagePlan, items: list[tuple[RolloutKey, Generation]]) -> None:
        """Ask the LLM judge, in one batch, for every trial of these rollouts that
        its journal does not hold yet (the caller holds the stage's judging lock)."""
        recorder = self.judge_recorder
        assert recorder is not None
        provider, pv, identity = self.judge_provider()
        judge = self.eval.judge
        assert isinstance(judge, LlmJudge)
        recorder.flush()
        requests: list[Request] = []
        for key, generation in items:
            for reference in plan.references:
                ref_text = self.reference_answer(reference, key[1])
                if ref_text is None:
                    continue
                for trial in range(judge.trials):
                    request = self._judge_request(key, reference, trial, generation.text, ref_text)
                    jkey = (stage, request.instance_id, 0)
                    rq = planning.request_digest(request)
                    if recorder.index.latest_gen(jkey, rq, pv) is None and not self._judge_failed(
                        jkey, rq, pv
                    ):
                        requests.append(request)
        if not requests:
            return
        recorder.add(recorder.provider_rows(pv, identity))
        events = generate_events(
            provider, requests, self.session.settings.max_attempts, None, self.session.settings.timeout
        )
        for event in events:
            if isinstance(event, RoundEnd):
                recorder.flush()
                continue
            req = event.request
            rq = planning.request_digest(req)
            rows = recorder.request_rows(rq, planning.request_content(req))
            jkey = (req.stage, req.instance_id, 0)
            if isinstance(event, Done):
                rows.append(recorder.gen(jkey, rq, pv, event.generations[0]))
            elif isinstance(event, Failed):
                rows.append(recorder.fail(event.failure, rq, pv))
            recorder.add(rows)
        recorder.flush()

    def _judge_failed(self, jkey: RolloutKey, rq: str, pv: str) -> bool:
        recorder = self.judge_recorder
        assert recorder is not None
        fail = recorder.index.latest_fail(jkey, rq, pv)
        return (
            fail is not None
            and fail.run == self.session.run_id
            and planning.is_final(fail.failure, self.session.settings.max_attempts)
        )

    def _candidate_ref(self, key: RolloutKey) -> GenRef | None:
        """The candidate's generation a key's result stands on: reused, or this run's."""
        run = self.run
        ref = run.decisions.reuse.get(key) or self.session.own_gen(run, key)
        if ref is None and key not in run.decisions.run:
            ref = run.recorder.index.latest_gen(key, run.plan.request_of(key), self.session.provider_digest)
        return ref

    def _llm_trials(self, key: RolloutKey, reference: str, candidate: str, ref_text: str) -> list[float]:
        recorder = self.judge_recorder
        assert recorder is not None
        judge = self.eval.judge
        assert isinstance(judge, LlmJudge)
        _, pv, _ = self.judge_provider()
        scores: list[float] = []
        for trial in range(judge.trials):
            request = self._judge_request(key, reference, trial, candidate, ref_text)
            jkey = (key[0], request.instance_id, 0)
            rq = planning.request_digest(request)
            gen = recorder.index.latest_gen(jkey, rq, pv)
            if gen is None:
                fail = recorder.index.latest_fail(jkey, rq, pv)
                why = fail.failure.message if fail is not None else "no verdict was recorded"
                raise EvalReplayError(f"the judge failed on {reference!r} (trial {trial}): {why}")
            score, _label = judge.score(recorder.index.generation(gen).text, trial)
            scores.append(score)
        return scores

    def kept(self, stage: int) -> bool:
        """A stage this session keeps as the journal has it: resumed, complete,
        its fingerprint unchanged. Its judgments are reused, never asked again."""
        if not self._resuming(stage) or stage >= self.replan_from:
            return False
        record = self.log().stages.get(stage)
        return record is not None and record.complete and record.fingerprint == self.fingerprints[stage - 1]

    def _valid_verdicts(self, key: RolloutKey, gen: GenRef, plan: StagePlan) -> ScoreRef | None:
        """The journal's verdicts of a generation, if they stand for the stage's
        plan: judged by this run, or by the earlier run whose plan this run
        replays (same fingerprint: same judge, references and tasks)."""
        score = self.run.recorder.index.score_of(key, gen)
        if score is None:
            return None
        if score.run == self.session.run_id:
            return score
        replayed = self.replayed.get(key[0], False)
        judged = set(score.judgments or ()) | set(score.no_answer)
        if (
            replayed
            and score.error is None
            and score.judgments is not None
            and judged == set(plan.references)
        ):
            return score
        return None

    def judge_stage(self, stage: int) -> None:
        """Judge every rollout of the stage that has a generation and no valid
        verdicts yet, in one batch, under the stage's judging lock: one process
        of a run judges a stage, the others read its verdicts from the journal."""
        if stage in self._judged_stages:
            return
        run = self.run
        plan = self.plan(stage)
        for key in self.stage_keys(stage):  # the stage's candidate generations first, each chunk once
            if key in run.decisions.run and self.session.own_gen(run, key) is None:
                chunk = run.chunk_of.get((key[0], key[1]))
                if chunk is not None and self.session.own_failure(run, key) is None:
                    self.session.generate_chunk(run, chunk)
        recorder = run.recorder
        with recorder.chunk_locked(f"judge-s{stage}"):
            recorder.flush()
            todo = []
            for key in self.stage_keys(stage):
                gen = self._candidate_ref(key)
                if gen is not None and self._valid_verdicts(key, gen, plan) is None:
                    todo.append((key, gen))
            if todo and isinstance(self.eval.judge, LlmJudge):
                self._ask_llm_judge(stage, plan, [(key, self._generation(gen)) for key, gen in todo])
            for key, gen in todo:
                recorder.add(self._verdict_rows(key, gen, plan))
            recorder.flush()
        self._judged_stages.add(stage)

    def _generation(self, gen: GenRef) -> Generation:
        return self.eval.pool.postprocess(self.run.recorder.index.generation(gen))

    def _verdict_rows(self, key: RolloutKey, gen: GenRef, plan: StagePlan) -> list[dict[str, Any]]:
        """Judge one rollout against each reference of its plan: its score row."""
        _, tid, _ = key
        candidate = self._generation(gen).text
        judgments: dict[str, list[float]] = {}
        no_answer: list[str] = []
        error: str | None = None
        try:
            instance = self.eval.pool.instance(tid)
            for reference in plan.references:
                ref_text = self.reference_answer(reference, tid)
                if ref_text is None:
                    no_answer.append(reference)
                elif isinstance(self.eval.judge, LlmJudge):
                    judgments[reference] = self._llm_trials(key, reference, candidate, ref_text)
                else:
                    judgments[reference] = [self._call_judge(instance, candidate, ref_text, reference)]
        except EvalReplayError as exc:
            error = str(exc)
        scores = {ref: mean(v) for ref, v in judgments.items()}
        ok = error is None
        return self.run.recorder.score(
            key, gen.run, scores if ok else None, error, judgments if ok else None, no_answer
        )

    def _call_judge(self, instance: dict[str, Any], candidate: str, ref_text: str, reference: str) -> float:
        try:
            value = self.eval.judge(instance, candidate, ref_text)  # type: ignore[operator]
        except Exception as exc:
            raise EvalReplayError(
                f"the judge raised {type(exc).__name__} judging against {reference!r}: {exc}"
            ) from None
        try:
            return check_verdict(value)
        except ValueError as exc:
            raise EvalReplayError(f"judging against {reference!r}: {exc}") from None

    def judge(self, key: RolloutKey, raw: Generation, of: str) -> RolloutResult:
        """An item's verdicts: its stage judged (once, by whichever process of
        the run gets there first), read back from the journal."""
        run = self.run
        stage, tid, rollout = key
        base = {"task": self.name, "stage": stage, "instance_id": tid, "rollout": rollout}
        generation = self.eval.pool.postprocess(raw)
        run.resolved.add(key)
        try:
            plan = self.plan(stage)
            self.judge_stage(stage)
        except EvalReplayError as exc:
            return RolloutResult(**base, generation=generation, error=str(exc), failure_class="judging")
        gen = self._candidate_ref(key)
        score = self._valid_verdicts(key, gen, plan) if gen is not None else None
        if score is None:
            error = "no verdicts were recorded for this rollout; run again with --resume"
            return RolloutResult(**base, generation=generation, error=error, failure_class="judging")
        if score.error is not None:
            return RolloutResult(**base, generation=generation, error=score.error, failure_class="judging")
        return RolloutResult(**base, generation=generation, scores=dict(score.scores or {}))

    # -- stages --------------------------------------------------------------------------

    def complete_stage(self, stage: int) -> None:
        """Every item of the stage has its result (computing here what this
        process can, and what the journal lacks of unselected items is an
        error); then the stage's `complete` record, once it has a judgment."""
        run = self.run
        self.plan(stage)
        selected = set(run.selected)
        missing: list[RolloutKey] = []
        for key in self.stage_keys(stage):
            if key in run.resolved or key in run.results:
                continue
            if key in selected:
                run.results[key] = self.session.result_for(self.name, key)
                continue
            outcome = item_outcome(run.plan, run.recorder.index, key, self.session.settings.max_attempts)
            if outcome.status == "missing":
                missing.append(key)
        if missing:
            raise EvalReplayError(
                f"stage {stage} of {self.name!r} is not complete ({len(missing)} item"
                f"{'s' if len(missing) != 1 else ''} without a result, "
                f"e.g. {missing[0][1]}[s{stage}-r{missing[0][2]}]) and stage {stage + 1} needs its rating: "
                f"run stage {stage} too (select s{stage}, or run without -k)"
            )
        self.mark_complete(stage)

    def mark_complete(self, stage: int) -> None:
        run = self.run
        recorder = run.recorder
        recorder.flush()
        fit = self.fit(upto=stage)
        judged = self.table(upto=stage, only=stage).num_judgments
        if judged == 0:
            self.notes.append(f"{self.name}: stage {stage} has no judged pair and stays incomplete")
            return
        with recorder.locked():
            recorder.refresh()
            record = self.log().stages.get(stage)
            if record is None or record.complete or record.fingerprint != self.fingerprints[stage - 1]:
                return
            from pytest_evalreplay import journal

            journal.append(
                recorder.directory,
                self.name,
                [complete_row(stage, fit.rating, fit.se, self.fingerprints[stage - 1], self.session.run_id)],
            )
            recorder.refresh()

    def stages_with_items(self) -> list[int]:
        stages = {key[0] for key in self.run.selected}
        return sorted(stages)

    def complete_all(self) -> None:
        """Each stage this session selected items of, in order (at the end, or for a gate)."""
        for stage in self.stages_with_items():
            self.complete_stage(stage)

    # -- the rating --------------------------------------------------------------------------

    def judged_rows(self, upto: int, only: int | None = None) -> list[tuple[str, str, float, int]]:
        run = self.run
        index = run.recorder.index
        rows: list[tuple[str, str, float, int]] = []
        for stage in range(1, upto + 1):
            if only is not None and stage != only:
                continue
            for key in self.stage_keys(stage):
                outcome = item_outcome(run.plan, index, key, self.session.settings.max_attempts)
                if outcome.status != "ok" or outcome.gen is None:
                    continue
                score = index.score_of(key, outcome.gen)
                if score is None or not score.judgments:
                    continue
                for reference, values in score.judgments.items():
                    rows.extend((key[1], reference, v, stage) for v in values)
        return rows

    def table(self, upto: int, only: int | None = None) -> JudgmentTable:
        from pytest_evalreplay.elo import tabulate

        elos = {name: ref.elo for name, ref in self.eval.references.items()}
        return tabulate(self.judged_rows(upto, only), elos)

    def fit(self, upto: int, n_boot: int = 0) -> EloFit:
        from pytest_evalreplay.elo import fit_elo

        return fit_elo(self.table(upto), n_boot=n_boot, seed=self.seed)

    def outcome(self, base: TaskOutcome) -> dict[str, Any]:
        """The contract's `elo` block for metrics.json, and the per-stage table."""
        from pytest_evalreplay.elo import fit_to_json, table_to_json

        last = len(self.eval.stages)
        final = self.fit(upto=last, n_boot=1000)
        log = self.log()
        stages = []
        for stage in range(1, last + 1):
            record = log.stages.get(stage)
            plan = self.plans.get(stage) or (
                StagePlan(tuple(record.references), record.prior_rating) if record is not None else None
            )
            cumulative = self.fit(upto=stage)
            table = self.table(upto=stage, only=stage)
            counts = {"wins": 0, "ties": 0, "losses": 0}
            for c in table.reference_counts():
                counts["wins"] += c.wins
                counts["ties"] += c.ties
                counts["losses"] += c.losses
            no_answer = sum(
                len(s.no_answer)
                for key in self.stage_keys(stage)
                for s in [self._score_ref(key)]
                if s is not None
            )
            stages.append(
                {
                    "stage": stage,
                    "references": list(plan.references) if plan else [],
                    "task_ids": list(self.stage_tasks[stage - 1]),
                    "prior_rating": plan.prior_rating if plan else None,
                    "rating": fit_to_json(cumulative)["rating"],
                    "se": fit_to_json(cumulative)["se"],
                    "ci95": fit_to_json(cumulative)["ci95"],
                    "judged": table.num_judgments,
                    **counts,
                    "no_answer": no_answer,
                    "complete": bool(record is not None and record.complete),
                }
            )
        block = fit_to_json(final)
        block.update({"seed": self.seed, "stages": stages, "table": table_to_json(self.table(upto=last))})
        return block

    def with_rating(self, base: TaskOutcome) -> TaskOutcome:
        """The task's outcome with the rating as its metric (`elo`) and the elo block."""
        block = self.outcome(base)
        metrics = {"elo": block["rating"]} if block["rating"] is not None else {}
        lo, hi = block["ci95"]
        intervals = {"elo": (lo, hi)} if lo is not None and hi is not None else {}
        return dataclasses.replace(
            base, metrics=metrics, intervals=intervals, instance_scores={}, extra={"elo": block}
        )

    def paired_drop(self, baseline: Mapping[str, Any]) -> Any:
        """The rating's drop below a baseline's, paired over the tasks both judged.

        Gate("elo", max_drop=...) reads it.
        """
        from pytest_evalreplay.elo import compare_ratings, table_from_json
        from pytest_evalreplay.gates import PairedDrop

        base = table_from_json(baseline.get("table"), "the baseline's elo table")
        cmp = compare_ratings(self.table(upto=len(self.eval.stages)), base, seed=self.seed)
        return PairedDrop(
            n=cmp.num_tasks, drop=cmp.drop if cmp.drop is not None else float("nan"), p_value=cmp.p_value
        )

    def _score_ref(self, key: RolloutKey) -> Any:
        run = self.run
        outcome = item_outcome(run.plan, run.recorder.index, key, self.session.settings.max_attempts)
        if outcome.gen is None:
            return None
        return run.recorder.index.score_of(key, outcome.gen)

    # -- the run dir ---------------------------------------------------------------------

    def write_judge_files(self) -> None:
        """`<name>-judge-requests.jsonl` and `-predictions.jsonl`: the verdicts the
        current judgments stand on (the caller holds nothing; this takes the judge lock)."""
        recorder = self.judge_recorder
        if recorder is None:
            return
        recorder.flush()
        with recorder.locked():
            recorder.refresh()
            index = recorder.index
            items: list[ItemOutcome] = []
            for key, refs in index.gens.items():
                if refs:
                    items.append(ItemOutcome(key, "ok", gen=refs[-1], scores={}))
            pvs = {item.gen.provider for item in items if item.gen is not None}
            models = {index.providers.get(pv, {}).get("model") for pv in pvs}
            outcome = TaskOutcome(
                task=f"{self.name}-judge",
                model=models.pop() if len(models) == 1 else None,
                metrics={},
                intervals={},
                instance_scores={},
                items=tuple(sorted(items, key=lambda i: (i.key[0], i.key[1]))),
                num_instances=len(items),
                generated=0,
                reused=0,
                tokens_generated=Tokens(),
                tokens_reused=Tokens(),
            )
            from pytest_evalreplay import rundir

            rundir.write_task(recorder.directory, outcome, self.session.run_id, index, [], 1, metrics=False)


def recorded_seed(directory: Path, name: str, limit: int | None) -> int | None:
    """The seed an earlier run of this eval recorded in the output dir's journal."""
    from pytest_evalreplay.journal import JournalIndex

    try:
        index = JournalIndex.read(directory, name, limit)
        return StageLog.read(index).seed
    except EvalReplayError:
        return None


def saved_seed(predictions: Path, name: str) -> int | None:
    """The seed a saved ELO run (a run dir being replayed) was drawn with."""
    import orjson

    path = (
        predictions / f"{name}-metrics.json"
        if predictions.is_dir()
        else predictions.with_name(f"{name}-metrics.json")
    )
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    seed = (doc.get("elo") or {}).get("seed") if isinstance(doc, dict) else None
    return seed if type(seed) is int else None


def stage_of_first_incomplete(log: StageLog, fingerprints: Sequence[str]) -> int:
    for stage in range(1, len(fingerprints) + 1):
        record = log.stages.get(stage)
        if record is None or not record.complete or record.fingerprint != fingerprints[stage - 1]:
            return stage
    return len(fingerprints) + 1


def check_kept_stages(
    name: str, log: StageLog, fingerprints: Sequence[str], configs: Sequence[Mapping[str, Any]], upto: int
) -> None:
    """--resume-stage=N: stages 1..N-1 must be complete in the journal, with their fingerprints valid."""
    from pytest_evalreplay.fingerprint import describe_change

    for stage in range(1, upto):
        record = log.stages.get(stage)
        if record is None:
            why = "it was never planned"
        elif record.fingerprint != fingerprints[stage - 1]:
            why = f"its configuration changed ({describe_change(record.config, configs[stage - 1])})"
        elif not record.complete:
            why = "it is not complete"
        else:
            continue
        raise EvalReplayError(
            f"--resume-stage={upto}: {name!r} cannot keep stage {stage}: {why}; "
            f"use --resume-stage={stage} (or --resume) to run it again"
        )
