"""`EvalTask.evaluate`'s runner: generate and score a task's requests outside
pytest, with no journal, and aggregate them as the session does.

The generating, retrying and scoring are `execution.py`'s, as in the session;
the numbers are `metrics.py`'s (`instance_means`, `task_means`), so a task
evaluated here and run under pytest report the same metrics, to the last bit.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pytest_evalreplay.model import EvalReplayError, Instance, Provider, Request
from pytest_evalreplay.numbers import passk
from pytest_evalreplay.numbers.metrics import instance_means, task_means
from pytest_evalreplay.rubric import Graded, outside_session
from pytest_evalreplay.run.execution import (
    Done,
    Failed,
    RolloutResult,
    ScoredTask,
    generate_events,
    request_key,
    score_generation,
)


class EvaluatedTask(ScoredTask, Protocol):
    """What `evaluate` needs of a task beyond scoring (`EvalTask` is one):
    named here, not imported, so the task can hand itself over without a circle."""

    instances: Sequence[Instance]
    agent: Any
    scorer: Any

    @property
    def sample_metrics(self) -> tuple[passk.SampleMetric, ...]: ...

    def request_digests(self) -> dict[tuple[int, str], str]: ...

    def request(self, instance: Instance) -> Request: ...

    def answer(self, text: str, instance: Instance) -> Hashable: ...


@dataclass(frozen=True)
class EvalResult:
    """What `EvalTask.evaluate` returns: aggregate metrics, per-instance scores
    (mean over rollouts) and per-instance errors (never scored as 0)."""

    task: str
    metrics: dict[str, float]
    scores: dict[str, dict[str, float]]
    errors: dict[str, str]
    rollouts: tuple[RolloutResult, ...] = ()


def run_requests(
    task: ScoredTask,
    provider: Provider,
    requests: Sequence[Request],
    max_attempts: int = 3,
    timeout: float | None = None,
) -> list[RolloutResult]:
    """Generate and score, outside pytest (`EvalTask.evaluate`)."""
    results: list[RolloutResult] = []
    for event in generate_events(provider, requests, max_attempts, timeout=timeout):
        request = getattr(event, "request", None)
        if request is None:
            continue
        base = {"task": task.name, "stage": request.stage, "instance_id": request.instance_id}
        if isinstance(event, Failed):
            if event.failure.final:
                results.extend(
                    RolloutResult(
                        **base,
                        rollout=r,
                        error=event.failure.message,
                        failure_class=event.failure.failure_class,
                    )
                    for r in request.rollouts
                )
            continue
        assert isinstance(event, Done)
        instance = task.instance(request.instance_id)
        for rollout, raw in zip(request.rollouts, event.generations, strict=True):
            generation = task.postprocess(raw)
            scores, error = score_generation(task, instance, generation)
            results.append(
                RolloutResult(
                    **base,
                    rollout=rollout,
                    generation=generation,
                    scores=scores or {},
                    error=error,
                    failure_class="scoring" if error else None,
                )
            )
    order = {request_key(r): n for n, r in enumerate(requests)}
    results.sort(key=lambda r: (order[(r.stage, r.instance_id)], r.rollout))
    return results


def evaluate(task: EvaluatedTask, provider: Provider, max_attempts: int = 3) -> EvalResult:
    """Generate and score every instance of a prompt task, then aggregate:
    per instance, the mean over its scored rollouts plus its pass@k / maj@k;
    the metrics, the mean over instances. A failed rollout is left out (never
    a 0) and its instance's first error kept."""
    if task.agent is not None:
        raise EvalReplayError(
            f"task {task.name!r} is an agent task: EvalTask.evaluate runs prompt tasks; run an "
            "agent task under pytest (its episodes are journaled turn by turn there)"
        )
    if isinstance(task.scorer, Graded):
        raise EvalReplayError(outside_session(task.name))
    task.request_digests()  # every prompt (and a choices task's choices and gold) checked first
    requests = [task.request(instance) for instance in task.instances]
    results = run_requests(task, provider, requests, max_attempts=max_attempts)
    scored = [r for r in results if r.ok and r.generation is not None]
    votes = any(m.kind == "maj" for m in task.sample_metrics)
    values = passk.by_instance(
        task.sample_metrics,
        (
            (
                r.instance_id,
                r.scores,
                task.answer(r.generation.text, task.instance(r.instance_id))
                if votes and r.generation
                else None,
            )
            for r in scored
        ),
    )
    means = instance_means((r.instance_id, r.scores) for r in scored)
    scores = {iid: m | values.get(iid, {}) for iid, m in means.items()}
    errors: dict[str, str] = {}
    for r in results:
        if not r.ok and r.instance_id not in errors:
            errors[r.instance_id] = r.error or "failed"
    return EvalResult(
        task=task.name, metrics=task_means(scores), scores=scores, errors=errors, rollouts=tuple(results)
    )
