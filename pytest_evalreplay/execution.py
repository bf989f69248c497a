"""Generate a batch through a provider with retries, then score it.

Plain functions over tasks, providers and requests: the pytest session and
`EvalTask.evaluate` both run through here, so a rollout is generated, retried
and scored the same way inside and outside pytest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_evalreplay.model import (
    GenerateResult,
    Generation,
    GenerationError,
    Provider,
    Request,
    RolloutResult,
)

if TYPE_CHECKING:
    from pytest_evalreplay.task import EvalTask

RETRYABLE_EXCEPTIONS: tuple[type[BaseException], ...] = (TimeoutError, ConnectionError)


@dataclass(frozen=True)
class AttemptFailure:
    """One failed attempt at one request, as the failures sidecar records it."""

    request: Request
    attempt: int
    message: str
    failure_class: str  # "retryable" | "terminal"
    final: bool


RequestKey = tuple[int, str]  # (stage, instance_id)
OnFailure = Callable[[AttemptFailure], None]
OnRound = Callable[[], None]


def request_key(request: Request) -> RequestKey:
    return (request.stage, request.instance_id)


def error_from_exception(exc: Exception) -> GenerationError:
    """A provider that raised instead of returning errors: connection-shaped
    exceptions are retryable, anything else is final."""
    retryable = isinstance(exc, RETRYABLE_EXCEPTIONS)
    return GenerationError(f"provider raised {type(exc).__name__}: {exc}", retryable=retryable)


def _checked(requests: Sequence[Request], results: object) -> list[GenerateResult]:
    """Hold a provider to its contract: one entry per request, one generation per rollout."""
    if not isinstance(results, list) or len(results) != len(requests):
        got = len(results) if isinstance(results, list) else type(results).__name__
        msg = f"provider returned {got} results for {len(requests)} requests"
        return [GenerationError(msg) for _ in requests]
    checked: list[GenerateResult] = []
    for req, res in zip(requests, results, strict=True):
        if isinstance(res, GenerationError) or (
            isinstance(res, list)
            and len(res) == len(req.rollouts)
            and all(isinstance(g, Generation) for g in res)
        ):
            checked.append(res)
        else:
            checked.append(
                GenerationError(
                    f"provider returned {res!r:.80} for {len(req.rollouts)} rollouts; "
                    "expected a list of Generation, one per rollout"
                )
            )
    return checked


def generate_with_retries(
    provider: Provider,
    requests: Sequence[Request],
    max_attempts: int,
    prior_attempts: Mapping[RequestKey, int] | None = None,
    on_failure: OnFailure | None = None,
    after_round: OnRound | None = None,
) -> list[GenerateResult]:
    """Generate, trying retryable failures again until `max_attempts` in all
    (attempts made by earlier runs count). Interrupts propagate untouched so
    that a killed run records nothing for the requests in flight.

    `after_round` runs after each provider call that had failures, before any
    retry: the session makes the attempts durable there, so a run killed
    mid-retry still counts them against the cap."""
    attempts = {request_key(r): (prior_attempts or {}).get(request_key(r), 0) for r in requests}
    final: list[GenerateResult | None] = [None] * len(requests)
    pending = list(range(len(requests)))
    while pending:
        batch = [requests[i] for i in pending]
        try:
            results = _checked(batch, provider.generate(batch))
        except Exception as exc:
            results = [error_from_exception(exc)] * len(batch)
        still: list[int] = []
        for i, res in zip(pending, results, strict=True):
            if not isinstance(res, GenerationError):
                final[i] = res
                continue
            key = request_key(requests[i])
            attempts[key] += 1
            again = res.retryable and attempts[key] < max_attempts
            if on_failure is not None:
                on_failure(
                    AttemptFailure(
                        request=requests[i],
                        attempt=attempts[key],
                        message=res.message,
                        failure_class="retryable" if res.retryable else "terminal",
                        final=not again,
                    )
                )
            if again:
                still.append(i)
            else:
                final[i] = res
        if after_round is not None and any(isinstance(r, GenerationError) for r in results):
            after_round()
        pending = still
    return [r for r in final if r is not None]


def score_request(task: EvalTask, request: Request, result: GenerateResult) -> list[RolloutResult]:
    """One RolloutResult per requested rollout: scored, or failed with the reason."""
    base = {"task": task.name, "stage": request.stage, "instance_id": request.instance_id}
    if isinstance(result, GenerationError):
        cls = "retryable" if result.retryable else "terminal"
        return [
            RolloutResult(**base, rollout=r, error=result.message, failure_class=cls)
            for r in request.rollouts
        ]
    instance = task.instance(request.instance_id)
    out: list[RolloutResult] = []
    for rollout, raw in zip(request.rollouts, result, strict=True):
        generation = task.postprocess(raw)
        try:
            scores = task.score(generation.text, instance)
        except Exception as exc:
            out.append(
                RolloutResult(
                    **base,
                    rollout=rollout,
                    generation=generation,
                    error=f"scorer raised {type(exc).__name__}: {exc}",
                    failure_class="scoring",
                )
            )
            continue
        out.append(RolloutResult(**base, rollout=rollout, generation=generation, scores=scores))
    return out


def run_requests(
    task: EvalTask,
    provider: Provider,
    requests: Sequence[Request],
    max_attempts: int = 3,
    prior_attempts: Mapping[RequestKey, int] | None = None,
    on_failure: OnFailure | None = None,
    after_round: OnRound | None = None,
) -> list[RolloutResult]:
    results = generate_with_retries(provider, requests, max_attempts, prior_attempts, on_failure, after_round)
    return [rr for req, res in zip(requests, results, strict=True) for rr in score_request(task, req, res)]
