"""Generate through a provider, as a stream, with retries; and score.

Plain functions over tasks, providers and requests: the pytest session
(`generation.py`, `taskrun.py`) and `EvalTask.evaluate` (`offline.py`) both
run through here, so a rollout is generated, retried and scored the same way
inside and outside pytest. Side effects (the journal)
belong to the caller, which consumes the events this module yields.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_evalreplay.journal.rows import Failure
from pytest_evalreplay.model import (
    LOGLIKELIHOOD_TYPES,
    EvalReplayError,
    GenerateResult,
    Generation,
    GenerationError,
    Instance,
    Provider,
    Request,
    RequestKey,
    RollingLoglikelihood,
    loglikelihoods_problem,
    scored_loglikelihoods,
)

RETRYABLE_EXCEPTIONS: tuple[type[BaseException], ...] = (TimeoutError, ConnectionError)
# What stops the session rather than failing a request or a rollout: Ctrl-C,
# and a provider's SystemExit (`generation.stream_into_journal` turns it into
# ProviderExit). Any other BaseException (asyncio.CancelledError,
# GeneratorExit...) is a failure like an Exception: a provider's fails the
# requests in flight for good, once; a scorer's (SystemExit included) fails
# that rollout's scoring.
STOPS_THE_SESSION: tuple[type[BaseException], ...] = (KeyboardInterrupt, SystemExit)


class ScoredTask(Protocol):
    """What running and scoring needs of a task (`EvalTask` is one): named
    here, not imported, so the task can call this module without a circle."""

    @property
    def name(self) -> str: ...

    def instance(self, instance_id: str) -> Instance: ...

    def postprocess(self, generation: Generation) -> Generation: ...

    def score(
        self,
        text: str,
        instance: Instance,
        grades: Mapping[str, float] | None = None,
        loglikelihoods: Sequence[tuple[float, bool]] = (),
    ) -> dict[str, float]: ...


def request_key(request: Request) -> RequestKey:
    return (request.stage, request.instance_id)


def error_from_exception(exc: BaseException) -> GenerationError:
    """A provider that raised instead of returning errors: connection-shaped
    exceptions are retryable, anything else is final."""
    retryable = isinstance(exc, RETRYABLE_EXCEPTIONS)
    detail = f": {exc}" if str(exc) else ""
    return GenerationError(f"provider raised {type(exc).__name__}{detail}", retryable=retryable)


def _pulled(source: Iterator[Any]) -> Iterator[tuple[Any, BaseException | None]]:
    """`source`'s items as `(item, None)`, then `(None, exc)` if the provider
    raised anything but an interrupt. Only the provider's own code runs in the
    guarded `next`, so a GeneratorExit thrown into the caller at its `yield`
    (the consumer closing it) is never mistaken for the provider's."""
    while True:
        try:
            item = next(source)
        except StopIteration:
            return
        except STOPS_THE_SESSION:
            raise
        except BaseException as exc:  # CancelledError and kin: a failure, not a stop
            yield None, exc
            return
        yield item, None


def _deferred_stream(provider: Provider, requests: list[Request]) -> Iterator[tuple[int, object]]:
    """The provider's stream, opened on the first `next`: a `generate_stream`
    or `generate` that raises at once fails its requests like one that
    raises midway."""
    yield from _raw_stream(provider, requests)


def provider_name(provider: object) -> str:
    """A provider for a message: its `kind` where it says one, else its class."""
    kind = getattr(provider, "kind", None)
    return f"{kind!r} provider" if isinstance(kind, str) else f"provider {type(provider).__name__}"


def check_result(request: Request, result: object, who: str = "provider") -> GenerateResult:
    """Hold a provider to its contract: a GenerationError, or one well-typed
    Generation per requested rollout, or one per sample (`num_samples`: a
    provider that answers the whole prompt, cut here to the rollouts asked,
    by index, so a split request works as a whole one) (for a loglikelihood request, one
    (log-probability, is_greedy) pair per continuation, wrapped into one
    Generation). Anything else fails that request, naming what was wrong."""
    if isinstance(result, GenerationError):
        if not isinstance(result.message, str):
            return GenerationError(f"provider returned GenerationError({result.message!r:.60})", False)
        return result
    if request.request_type == "loglikelihood":
        return _check_loglikelihoods(request, result, who)
    if request.request_type == "loglikelihood_rolling":
        return _check_rolling(request, result, who)
    wanted = len(request.rollouts)
    if isinstance(result, list) and len(result) == request.num_samples != wanted:
        result = [result[r] for r in request.rollouts]  # every sample answered: take the wanted ones
    if not isinstance(result, list) or len(result) != wanted:
        got = f"{len(result)} generations" if isinstance(result, list) else f"{result!r:.80}"
        either = "" if wanted == request.num_samples else f" or {request.num_samples} (one per sample)"
        return GenerationError(
            f"provider returned {got} for rollouts {request.rollouts} of num_samples="
            f"{request.num_samples}; expected {wanted} (one per rollout, in that order){either}: "
            "a list of Generation",
            retryable=False,
        )
    for n, gen in enumerate(result):
        if not isinstance(gen, Generation):
            return GenerationError(
                f"provider returned a {type(gen).__name__} for rollout {request.rollouts[n]}; "
                "expected a Generation",
                retryable=False,
            )
        problem = gen.problem()
        if problem is not None:
            return GenerationError(
                f"provider returned a bad Generation for rollout {request.rollouts[n]}: {problem}",
                retryable=False,
            )
    return result


def _check_loglikelihoods(request: Request, result: object, who: str) -> GenerateResult:
    """A loglikelihood answer as the one Generation the journal keeps (text "")."""
    count = len(request.continuations)
    if not isinstance(result, (list, tuple)) or len(result) != count:
        got = f"{len(result)} entries" if isinstance(result, (list, tuple)) else f"{result!r:.60}"
        return GenerationError(
            f"{who}: loglikelihood returned {got} for {count} continuations; expected a list of one "
            "(log-probability, is_greedy) pair per continuation",
            retryable=False,
        )
    problem = loglikelihoods_problem(result)
    if problem is not None:
        return GenerationError(f"{who}: loglikelihood returned a bad answer: {problem}", retryable=False)
    pairs = tuple((float(ll), greedy) for ll, greedy in result)
    return [Generation(text="", loglikelihoods=pairs) for _ in request.rollouts]


def _check_rolling(request: Request, result: object, who: str) -> GenerateResult:
    """A rolling answer as the one Generation the journal keeps (text "")."""
    if not isinstance(result, RollingLoglikelihood):
        return GenerationError(
            f"{who}: loglikelihood returned {result!r:.60} for a loglikelihood_rolling request; expected "
            "a RollingLoglikelihood(loglikelihood, tokens) of the whole text",
            retryable=False,
        )
    problem = result.problem()
    if problem is not None:
        return GenerationError(f"{who}: loglikelihood returned a bad rolling answer: it {problem}", False)
    answer = RollingLoglikelihood(float(result.loglikelihood), result.tokens)
    return [Generation(text="", rolling=answer) for _ in request.rollouts]


def require_loglikelihood(provider: Provider, requests: Sequence[Request]) -> None:
    """A provider asked for log-likelihoods must serve them: else a usage
    error naming the task and the provider, before anything is asked."""
    wanting = next((r for r in requests if r.request_type in LOGLIKELIHOOD_TYPES), None)
    if wanting is None:
        return
    if any(callable(getattr(provider, name, None)) for name in ("loglikelihood", "loglikelihood_stream")):
        return
    raise EvalReplayError(
        f"task {wanting.task!r} scores answer choices by log-likelihood, and the {provider_name(provider)} "
        "has no loglikelihood(requests): use a provider that serves log-likelihoods (vllm, openai "
        "against a server with a completions endpoint, or replay of a saved run that holds them), "
        "or give your provider a loglikelihood method (docs/providers.md)"
    )


def _plain_stream(provider: Provider, requests: list[Request], call: str) -> Iterator[tuple[int, object]]:
    results = getattr(provider, call)(requests)
    if not isinstance(results, list) or len(results) != len(requests):
        got = len(results) if isinstance(results, list) else type(results).__name__
        err = GenerationError(f"provider returned {got} results for {len(requests)} requests", False)
        yield from ((i, err) for i in range(len(requests)))
        return
    yield from enumerate(results)


def returns_whole(provider: Provider, requests: Sequence[Request]) -> bool:
    """Whether the provider answers these requests in calls that return a
    list (no `<call>_stream` method for any call they need): then a call's
    results are all in hand when the first of them is."""
    kinds = {"loglikelihood" if r.request_type in LOGLIKELIHOOD_TYPES else "generate" for r in requests}
    return not any(callable(getattr(provider, f"{kind}_stream", None)) for kind in kinds)


def _call_stream(provider: Provider, requests: list[Request], call: str) -> Iterator[tuple[int, object]]:
    """One call of the provider: `<call>_stream` where it has one, else `<call>`."""
    stream = getattr(provider, f"{call}_stream", None)
    if callable(stream):
        return iter(stream(requests))
    return _plain_stream(provider, requests, call)


def _raw_stream(provider: Provider, requests: list[Request]) -> Iterator[tuple[int, object]]:
    """`generate` for generate requests, `loglikelihood` for loglikelihood
    ones; a batch of both (never one task's) is asked in two calls."""
    wanting = [r.request_type in LOGLIKELIHOOD_TYPES for r in requests]
    if not any(wanting):
        return _call_stream(provider, requests, "generate")
    if all(wanting):
        return _call_stream(provider, requests, "loglikelihood")
    return _split_stream(provider, requests, wanting)


def _split_stream(
    provider: Provider, requests: list[Request], wanting: list[bool]
) -> Iterator[tuple[int, object]]:
    for call, kind in (("generate", False), ("loglikelihood", True)):
        positions = [i for i, w in enumerate(wanting) if w is kind]
        for item in _call_stream(provider, [requests[i] for i in positions], call):
            index = item[0] if isinstance(item, tuple) and len(item) == 2 else None
            if type(index) is int and 0 <= index < len(positions):
                yield positions[index], item[1]


_DONE = object()


def _watched(stream: Iterator[tuple[int, object]], timeout: float) -> Iterator[tuple[int, object] | None]:
    """Run a provider's stream on a daemon thread; yield its items, or None
    when nothing arrived for `timeout` seconds (the call is then abandoned:
    its thread keeps running until the provider returns or the process
    exits, and anything it yields later is dropped)."""
    box: queue.Queue[Any] = queue.Queue()
    stop = threading.Event()

    def pump() -> None:
        try:
            for item in stream:
                if stop.is_set():
                    return
                box.put(item)
        except BaseException as exc:
            box.put(exc)
            return
        box.put(_DONE)

    thread = threading.Thread(target=pump, name="evalreplay-provider", daemon=True)
    thread.start()
    try:
        while True:
            try:
                item = box.get(timeout=timeout)
            except queue.Empty:
                yield None
                return
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


def stream_results(
    provider: Provider, requests: list[Request], timeout: float | None = None
) -> Iterator[tuple[int, GenerateResult]]:
    """One provider call as a stream of checked `(index, result)`, every
    index exactly once. A provider exception fails every request it had not
    answered (retryable when connection-shaped). With `timeout`, a provider
    that does not enforce it itself (no `request_timeout` attribute) is
    watched from outside: nothing for `timeout` seconds fails the rest,
    retryably."""
    pending = set(range(len(requests)))
    who = provider_name(provider)
    raw = _deferred_stream(provider, requests)
    watched = timeout is not None and not hasattr(provider, "request_timeout")
    source: Iterator[Any] = _watched(raw, timeout) if watched else raw  # type: ignore[arg-type]
    try:
        for item, raised in _pulled(source):
            if raised is not None:
                err = error_from_exception(raised)
                for i in sorted(pending):
                    yield i, err
                pending.clear()
                return
            if item is None:  # the watchdog fired
                msg = (
                    f"no result from the provider within --evalreplay-timeout={timeout:g}s; the call "
                    "was abandoned (its thread keeps running in the background until it returns)"
                )
                for i in sorted(pending):
                    yield i, GenerationError(msg, retryable=True)
                pending.clear()
                return
            try:
                index, result = item
            except (TypeError, ValueError):
                continue
            if type(index) is not int or index not in pending:
                continue
            pending.discard(index)
            yield index, check_result(requests[index], result, who)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()
    for i in sorted(pending):
        yield i, GenerationError("the provider's stream ended without a result for this request", True)


@dataclass(frozen=True)
class Done:
    """A request generated: one Generation per requested rollout. `together`:
    more results of the same provider call are already in hand and follow at
    once (a call that returns a list returns them all together)."""

    request: Request
    generations: list[Generation]
    together: bool = False


@dataclass(frozen=True)
class Failed:
    """One failed attempt (final or to be retried); `together` as for `Done`."""

    request: Request
    failure: Failure
    together: bool = False


@dataclass(frozen=True)
class RoundEnd:
    """A provider call ended; `retries` requests are asked again in the next call."""

    retries: int = 0


Event = Done | Failed | RoundEnd


@dataclass(frozen=True)
class RolloutResult:
    """The outcome of one item: a scored generation, or a failure."""

    task: str
    stage: int
    instance_id: str
    rollout: int
    generation: Generation | None = None
    scores: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None
    failure_class: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def generate_events(
    provider: Provider,
    requests: Sequence[Request],
    max_attempts: int,
    prior_attempts: Mapping[RequestKey, int] | None = None,
    timeout: float | None = None,
) -> Iterator[Event]:
    """Generate `requests`, yielding each success and each failed attempt as
    it happens. Retryable failures are asked again, in one more call per
    round, until a request has had `max_attempts` attempts in all (counting
    `prior_attempts` of earlier runs). Interrupts propagate untouched, so a
    killed run records nothing for the requests in flight. A provider
    without `loglikelihood` asked for log-likelihoods raises EvalReplayError."""
    require_loglikelihood(provider, requests)
    prior = prior_attempts or {}
    attempts: dict[RequestKey, int] = {}  # of the requests that failed so far (most never do)
    pending = list(requests)
    while pending:
        again: list[Request] = []
        whole = returns_whole(provider, pending)
        for count, (index, result) in enumerate(stream_results(provider, pending, timeout), 1):
            request = pending[index]
            together = whole and count < len(pending)  # every index comes exactly once
            if not isinstance(result, GenerationError):
                yield Done(request, result, together)
                continue
            key = request_key(request)
            attempts[key] = attempts.get(key, prior.get(key, 0)) + 1
            retry = result.retryable and attempts[key] < max_attempts
            yield Failed(
                request,
                Failure(
                    stage=request.stage,
                    instance_id=request.instance_id,
                    rollouts=tuple(request.rollouts),
                    attempt=attempts[key],
                    failure_class="retryable" if result.retryable else "terminal",
                    message=result.message,
                    final=not retry,
                ),
                together,
            )
            if retry:
                again.append(request)
        yield RoundEnd(len(again))
        pending = again


def score_generation(
    task: ScoredTask, instance: Instance, generation: Generation, grades: Mapping[str, float] | None = None
) -> tuple[dict[str, float] | None, str | None]:
    """The task's scores of one (post-processed) generation, or the error:
    a scorer that raises, or returns anything but finite numbers, fails
    that rollout naming the value, never a score of 0. `grades`: a graded
    scorer's verdicts, read from the judge's journal by the session."""
    try:
        scores = task.score(generation.text, instance, grades, scored_loglikelihoods(generation))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a scorer's SystemExit, CancelledError: its rollout fails
        return None, f"scorer raised {type(exc).__name__}: {exc}"
    for name, value in scores.items():
        if not math.isfinite(value):
            return None, f"scorer returned {value!r} for {name!r}; scores must be finite numbers"
    return scores, None
