"""Grading a plain task's rollouts with `scorers.graded(rubric, judge)` in a
session: the judge's requests (one per rollout, criterion and trial) go into
`<task>-judge-journal.jsonl` through the one generation loop, a batch at a
time, and are asked only when the journal holds no reply to the same request
(answer, criterion, prompt) from the same judge identity, so a resumed run
asks nothing twice. The replies become `<task>-judge-*.jsonl` in the run dir;
a replay (--evalreplay-predictions) serves them instead of a model. A reply
that says neither [[YES]] nor [[NO]] is asked again under the attempt cap,
then a scoring failure quoting it, never a 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_evalreplay.journal.recorder import TaskRecorder
from pytest_evalreplay.journal.rows import RolloutKey
from pytest_evalreplay.judges import task_text
from pytest_evalreplay.model import Request, request_digest
from pytest_evalreplay.numbers import sources
from pytest_evalreplay.rubric import Graded, unreadable_reason
from pytest_evalreplay.run.context import RunContext
from pytest_evalreplay.run.elojudge import judge_files_name, judge_provider, write_judge_files
from pytest_evalreplay.run.generation import stream_into_journal
from pytest_evalreplay.task import EvalTask


@dataclass
class Grading:
    """A graded task's judge in one session (one process)."""

    ctx: RunContext
    task: EvalTask
    graded: Graded
    directory: Path
    recorder: TaskRecorder = field(init=False)
    _provider: tuple[Any, str, dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        self.recorder = self.ctx.open_journal(self.directory, judge_files_name(self.task.name))

    def provider(self) -> tuple[Any, str, dict[str, Any]]:
        if self._provider is None:
            name = judge_files_name(self.task.name)
            self._provider = judge_provider(
                self.ctx, self.graded.judge, name, lambda text: self.graded.read(text) is not None
            )
        return self._provider

    def requests(self, key: RolloutKey, answer: str) -> list[tuple[str, Request]]:
        """The judge's requests for one rollout: (criterion, request) per criterion and trial."""
        stage, iid, rollout = key
        judge = self.graded.judge
        task = task_text(self.task.render(self.task.instance(iid)))
        return [
            (
                criterion,
                Request(
                    task=self.recorder.task,
                    instance_id=f"{iid}|r{rollout}|{criterion}|t{trial}",
                    context=self.graded.prompt(task, answer, criterion),
                    system_prompt=judge.system_prompt,
                    num_samples=1,
                    sampling=dict(judge.sampling),
                    stage=stage,
                    rollouts=(0,),
                ),
            )
            for criterion, _ in self.graded.rubric
            for trial in range(judge.trials)
        ]

    def ask(self, items: Sequence[tuple[RolloutKey, str]]) -> None:
        """Ask the judge, in one batch, what its journal does not hold for these rollouts' answers."""
        provider, pv, identity = self.provider()
        recorder = self.recorder
        recorder.flush()
        with recorder.locked():
            recorder.refresh()  # another process of the run may have graded them
        todo: list[Request] = []
        for key, answer in items:
            for _, request in self.requests(key, answer):
                gen, fail = recorder.index.standing(
                    (key[0], request.instance_id, 0), request_digest(request), pv
                )
                if gen is None and not (
                    fail is not None
                    and fail.run == self.ctx.run_id
                    and sources.is_final(fail.failure, self.ctx.settings.max_attempts)
                ):
                    todo.append(request)
        if todo:
            stream_into_journal(
                recorder, provider, (pv, identity), todo, self.ctx.settings, progress=self.ctx.progress
            )

    def scores(self, key: RolloutKey, answer: str) -> tuple[dict[str, float] | None, str | None]:
        """One rollout's score per criterion (the mean over trials), or why it has none."""
        _, pv, _ = self.provider()
        index = self.recorder.index
        votes: dict[str, list[float]] = {}
        for criterion, request in self.requests(key, answer):
            gen, fail = index.standing((key[0], request.instance_id, 0), request_digest(request), pv)
            where = f"the grader on criterion {criterion!r}"
            if gen is None:
                why = fail.failure.message if fail is not None else "no verdict was recorded"
                return None, f"{where} failed: {why}"
            reply = index.generation(gen).text
            value = self.graded.read(reply)
            if value is None:
                return None, f"{where}: {unreadable_reason(reply)}"
            votes.setdefault(criterion, []).append(value)
        return {c: sum(v) / len(v) for c, v in votes.items()}, None

    def write_files(self) -> None:
        write_judge_files(self.recorder, self.ctx.run_id)
