"""Judging an EloEval's rollouts against references: by a function, called
every time (it is cheap, and its helpers may have changed), or by an LLM
judge whose verdicts are journaled in `<name>-judge-journal.jsonl` and reused
only for the same request (candidate, reference, prompt) asked of the same
judge provider identity. A reply the judge's pattern cannot read is a failed
attempt, asked again under the attempt cap and then a judging failure
(`judges.llm(unreadable="tie")` keeps it as a tie); either way it is counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_evalreplay.formats import load
from pytest_evalreplay.formats.saved import SavedIndex
from pytest_evalreplay.formats.saves import first_answer
from pytest_evalreplay.journal.recorder import TaskRecorder
from pytest_evalreplay.journal.rows import RolloutKey
from pytest_evalreplay.judges import LlmJudge, check_verdict, mean, task_text
from pytest_evalreplay.model import (
    EvalReplayError,
    Generation,
    GenerationError,
    PromptKey,
    Request,
    digest,
    request_digest,
)
from pytest_evalreplay.numbers import sources
from pytest_evalreplay.numbers.metrics import ItemOutcome, TaskOutcome
from pytest_evalreplay.run.context import RunContext
from pytest_evalreplay.run.generation import stream_into_journal
from pytest_evalreplay.stages import EloEval
from pytest_evalreplay.storage.runschema import JUDGE_SUFFIX, task_files

UNREADABLE_PREFIX = "unreadable verdict: "


class UnreadableVerdict(EvalReplayError):
    """A judging failure because the judge's reply could not be read (counted)."""


def judge_files_name(eval_name: str) -> str:
    """The task name of an LLM judge's journal and run dir files."""
    return eval_name + JUDGE_SUFFIX


@dataclass(frozen=True)
class Verdicts:
    """One rollout judged against its stage's references."""

    scores: dict[str, float] | None  # mean verdict per reference (None: a judging failure)
    judgments: dict[str, list[float]] | None
    no_answer: list[str]
    error: str | None = None
    unreadable: int = 0  # judge replies that could not be read


class _ReadableOnly:
    """The judge's provider, with a reply its pattern cannot read turned into a
    retryable failure: asked again under the attempt cap, then a failure."""

    def __init__(self, inner: Any, readable: Callable[[str], bool]) -> None:
        self._inner = inner
        self._readable = readable

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name == "generate_stream" and callable(value):

            def stream(requests: list[Request]) -> Any:
                for index, result in value(requests):
                    yield index, self._check(result)

            return stream
        return value

    def generate(self, requests: list[Request]) -> Any:
        results = self._inner.generate(requests)
        return [self._check(r) for r in results] if isinstance(results, list) else results

    def _check(self, result: Any) -> Any:
        """Only a well-formed reply is read: a bad one (text None) is left to
        `execution.check_result`, which fails it naming what is wrong, as it
        does a candidate provider's."""
        if isinstance(result, list) and result and isinstance(result[0], Generation):
            text = result[0].text
            if result[0].problem() is None and not self._readable(text):
                return GenerationError(f"{UNREADABLE_PREFIX}{text[:80]!r}", retryable=True)
        return result


def judge_provider(
    ctx: RunContext, judge: LlmJudge, name: str, readable: Callable[[str], bool] | None
) -> tuple[Any, str, dict[str, Any]]:
    """An LLM judge's provider, its digest and identity: the saved verdicts of
    `<name>` when the session replays (--evalreplay-predictions), else the
    judge's provider (the session's own when it names none). `readable`: a
    reply it says no to is a retryable failure, then a judging failure."""
    settings = ctx.settings
    if settings.provider == "replay" and settings.predictions is not None:
        from pytest_evalreplay.providers.replay import ReplayProvider
        from pytest_evalreplay.values.fingerprint import path_signature

        source = settings.predictions
        path = task_files(source, name)["predictions"] if source.is_dir() else source
        if not path.is_file():
            owner = name.removesuffix(JUDGE_SUFFIX)
            raise EvalReplayError(
                f"{path}: the saved run has no judge verdicts for {owner!r}, so its LLM judge cannot be "
                "replayed without a model; replay a run dir written by the plugin"
            )
        provider: Any = ReplayProvider.from_path(path)
        identity = {"kind": "replay", "predictions": str(path), "files": path_signature(path)}
    elif judge.provider is None:
        provider, identity = ctx.host.get(), dict(ctx.provider_identity)
    elif isinstance(judge.provider, str):
        from pytest_evalreplay.providers import ProviderHost

        overrides: dict[str, Any] = {"provider": judge.provider}
        if judge.model is not None:
            overrides["model"] = judge.model
        if judge.base_url is not None:
            overrides["base_urls"] = (judge.base_url,)
        host = ProviderHost(dataclasses.replace(settings, **overrides), ctx.host.from_hook)
        identity = host.identity()
        provider = host.get()
    else:
        provider = judge.provider
        identity = {"kind": getattr(provider, "kind", None), "model": getattr(provider, "model", None)}
    if readable is not None:
        provider = _ReadableOnly(provider, readable)
    return provider, digest(identity), identity


def write_judge_files(recorder: TaskRecorder, run: str) -> None:
    """`<name>-judge-requests.jsonl` and `-predictions.jsonl`: the judge's
    replies, so a replay judges without a model (takes the judge's lock)."""
    recorder.flush()
    with recorder.locked():
        recorder.refresh()
        index = recorder.index
        items = [ItemOutcome(key, "ok", gen=refs[-1], scores={}) for key, refs in index.gens.items() if refs]
        models = {index.providers.get(i.gen.provider, {}).get("model") for i in items if i.gen is not None}
        outcome = TaskOutcome(
            task=recorder.task,
            model=models.pop() if len(models) == 1 else None,
            metrics={},
            intervals={},
            instance_scores={},
            items=tuple(sorted(items, key=lambda i: (i.key[0], i.key[1]))),
            num_instances=len(items),
            generated=0,
            reused=0,
        )
        from pytest_evalreplay.rundir import writer as rundir

        rundir.write_task(recorder.directory, outcome, run, index, [], 1, metrics=False)


@dataclass
class Judging:
    """An EloEval's judge and references in one session (one process)."""

    ctx: RunContext
    eval: EloEval
    directory: Path
    recorder: TaskRecorder | None = None  # the LLM judge's journal
    _references: dict[str, SavedIndex] = field(default_factory=dict)  # each reference's saved run
    # Each (reference, task)'s answer, read once: collection's check reads every
    # one the stages will judge with, so a stage decodes no saved row again.
    _answers: dict[tuple[str, str], str | None] = field(default_factory=dict)
    _prompts: dict[str, tuple[PromptKey, int]] = field(default_factory=dict)  # a task's (prompt, stage)
    _provider: tuple[Any, str, dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.eval.judge, LlmJudge):
            self.recorder = self.ctx.open_journal(self.directory, judge_files_name(self.eval.name))

    @property
    def llm(self) -> LlmJudge | None:
        judge = self.eval.judge
        return judge if isinstance(judge, LlmJudge) else None

    # -- references ----------------------------------------------------------------

    def reference_answer(self, reference: str, task_id: str) -> str | None:
        """A reference's saved answer to a pool task (None: it has none), read
        by the saved-run readers replay serves by (`formats.saves`), once a session."""
        if (reference, task_id) in self._answers:
            return self._answers[(reference, task_id)]
        index = self._references.get(reference)
        if index is None:
            try:
                index = load(self.eval.references[reference].predictions)
            except EvalReplayError as exc:
                # The readers' fix names the replay option; a reference's file is set in its Reference.
                fix = f"Reference(predictions=...) of {reference!r} in EloEval {self.eval.name!r}"
                message = str(exc).replace("--evalreplay-predictions", fix)
                raise EvalReplayError(f"reference {reference!r}: {message}") from None
            self._references[reference] = index
        prompt = self._prompts.get(task_id)
        if prompt is None:  # one request per task: every reference answered the same prompt
            request = self.eval.pool.request(self.eval.pool.instance(task_id))
            prompt = self._prompts[task_id] = (request.prompt_key, request.stage)
        generation = first_answer(index, *prompt)
        answer = None if generation is None else self.eval.pool.postprocess(generation).text
        self._answers[(reference, task_id)] = answer
        return answer

    def check_references(self, stage_tasks: Sequence[Sequence[str]]) -> None:
        """Every reference read at collection, with an answer to every drawn
        task: a bad file is one error before anything is generated, not a
        failure of every item once its candidate is."""
        for reference, ref in self.eval.references.items():
            for stage, task_ids in enumerate(stage_tasks, 1):
                for tid in task_ids:
                    if self.reference_answer(reference, tid) is None:
                        raise EvalReplayError(
                            f"reference {reference!r} ({ref.predictions}) has no saved answer to task "
                            f"{tid!r}, which stage {stage} of EloEval {self.eval.name!r} drew: save the "
                            "reference's answers to every pool task, or take that task out of the pool"
                        )

    # -- judging ---------------------------------------------------------------------

    def judge(
        self, references: Sequence[str], items: Sequence[tuple[RolloutKey, Generation]]
    ) -> dict[RolloutKey, Verdicts]:
        """Each rollout's verdicts against each reference (an LLM judge is asked,
        in one batch, only for the trials its journal does not hold)."""
        # Each (reference, task) once: a task's rollouts share their references' answers.
        pairs = dict.fromkeys((ref, key[1]) for key, _ in items for ref in references)
        answers = {pair: self.reference_answer(*pair) for pair in pairs}
        if self.llm is not None:
            self._ask(references, items, answers)
        return {key: self._verdicts(key, gen.text, references, answers) for key, gen in items}

    def _verdicts(
        self,
        key: RolloutKey,
        candidate: str,
        references: Sequence[str],
        answers: dict[tuple[str, str], str | None],
    ) -> Verdicts:
        judgments: dict[str, list[float]] = {}
        no_answer: list[str] = []
        unreadable = 0
        try:
            instance = self.eval.pool.instance(key[1])
            for reference in references:
                ref_text = answers[(reference, key[1])]
                if ref_text is None:
                    no_answer.append(reference)
                elif self.llm is not None:
                    values, lost = self._llm_trials(key, reference, candidate, ref_text)
                    unreadable += lost
                    judgments[reference] = values
                else:
                    judgments[reference] = [self._call(instance, candidate, ref_text, reference)]
        except EvalReplayError as exc:
            lost = unreadable + isinstance(exc, UnreadableVerdict)
            return Verdicts(None, None, no_answer, str(exc), lost)
        return Verdicts({r: mean(v) for r, v in judgments.items()}, judgments, no_answer, None, unreadable)

    def _call(self, instance: dict[str, Any], candidate: str, ref_text: str, reference: str) -> float:
        try:
            value = self.eval.judge(instance, candidate, ref_text)  # type: ignore[operator]
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit and kin fail the item, as a scorer's do
            raise EvalReplayError(
                f"the judge raised {type(exc).__name__} judging against {reference!r}: {exc}"
            ) from None
        try:
            return check_verdict(value)
        except ValueError as exc:
            raise EvalReplayError(f"judging against {reference!r}: {exc}") from None

    # -- the LLM judge -----------------------------------------------------------------

    def provider(self) -> tuple[Any, str, dict[str, Any]]:
        """The LLM judge's provider, its digest and identity (built once)."""
        if self._provider is None:
            judge = self.llm
            assert judge is not None
            readable = (lambda text: judge.verdict(text, 0).readable) if judge.unreadable == "fail" else None
            self._provider = judge_provider(self.ctx, judge, judge_files_name(self.eval.name), readable)
        return self._provider

    def _request(self, key: RolloutKey, reference: str, trial: int, candidate: str, ref_text: str) -> Request:
        judge = self.llm
        assert judge is not None
        stage, tid, rollout = key
        pool = self.eval.pool
        return Request(
            task=judge_files_name(self.eval.name),
            instance_id=f"{tid}|r{rollout}|{reference}|t{trial}",
            context=judge.prompt(task_text(pool.render(pool.instance(tid))), candidate, ref_text, trial),
            system_prompt=judge.system_prompt,
            num_samples=1,
            sampling=dict(judge.sampling),
            stage=stage,
            rollouts=(0,),
        )

    def _ask(
        self,
        references: Sequence[str],
        items: Sequence[tuple[RolloutKey, Generation]],
        answers: dict[tuple[str, str], str | None],
    ) -> None:
        judge, recorder = self.llm, self.recorder
        assert judge is not None and recorder is not None
        provider, pv, identity = self.provider()
        recorder.flush()
        requests: list[Request] = []
        for key, generation in items:
            for reference in references:
                ref_text = answers[(reference, key[1])]
                if ref_text is None:
                    continue
                for trial in range(judge.trials):
                    request = self._request(key, reference, trial, generation.text, ref_text)
                    jkey = (key[0], request.instance_id, 0)
                    rq = request_digest(request)
                    gen, fail = recorder.index.standing(jkey, rq, pv)
                    if gen is None and not self._failed_here(fail):
                        requests.append(request)
        if requests:
            stream_into_journal(
                recorder,
                provider,
                (pv, identity),
                requests,
                self.ctx.settings,
                progress=self.ctx.progress,
                name=recorder.task,
            )

    def _failed_here(self, fail: Any) -> bool:
        return (
            fail is not None
            and fail.run == self.ctx.run_id
            and sources.is_final(fail.failure, self.ctx.settings.max_attempts)
        )

    def _llm_trials(
        self, key: RolloutKey, reference: str, candidate: str, ref_text: str
    ) -> tuple[list[float], int]:
        judge, recorder = self.llm, self.recorder
        assert judge is not None and recorder is not None
        _, pv, _ = self.provider()
        scores: list[float] = []
        unreadable = 0
        for trial in range(judge.trials):
            request = self._request(key, reference, trial, candidate, ref_text)
            jkey = (key[0], request.instance_id, 0)
            gen, fail = recorder.index.standing(jkey, request_digest(request), pv)
            failed = f"the judge failed on {reference!r} (trial {trial})"
            if gen is None:
                why = fail.failure.message if fail is not None else "no verdict was recorded"
                unread = fail is not None and why.startswith(UNREADABLE_PREFIX)  # asked again, then failed
                raise (UnreadableVerdict if unread else EvalReplayError)(f"{failed}: {why}")
            verdict = judge.verdict(recorder.index.generation(gen).text, trial)
            if verdict.score is None:
                raise UnreadableVerdict(f"{failed}: {UNREADABLE_PREFIX}{verdict.reason}")
            if not verdict.readable:
                unreadable += 1  # kept as a tie (unreadable="tie"), still counted
            scores.append(verdict.score)
        return scores, unreadable

    # -- the run dir -----------------------------------------------------------------------

    def write_files(self) -> None:
        """The judge's replies as run dir files, so a replay judges without a model."""
        if self.recorder is not None:
            write_judge_files(self.recorder, self.ctx.run_id)
