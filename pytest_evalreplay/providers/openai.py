"""The `openai` provider: one or several OpenAI-compatible HTTP servers
(`vllm serve` replicas, ...) serving the same model.

Standard library only. This module retries calls and runs them on worker
threads; its other jobs have their own modules: which server takes a call
(`openai_balancer`), cutting off hung attempts and cancelled streams
(`openai_watchdog`), and the request and response bodies (`openai_wire`).
Text contexts go to `/completions`, chat contexts to `/chat/completions`; up
to `concurrency` HTTP calls are in flight at once (in total over all
servers), each worker thread keeping one keep-alive connection per server.
Each call goes to the server with the fewest calls in flight.

Failures: connection errors, timeouts, 5xx, 408 and 429 are retried with
exponential backoff, preferring a server the call has not failed on; when the
retries run out the request is a retryable `GenerationError` (the plugin tries
again up to --evalreplay-max-attempts). Any other 4xx is final at once and
carries the server's message. A server that fails (connection error, timeout,
5xx) `failures_to_cool` times in a row is taken out for a cool-down that
doubles while it keeps failing; afterwards one call at a time probes it until
one succeeds.

A 200 that holds no answer (no choices, a wrong count or index, a missing or
null text) is tried once more, then final. When every server keeps failing
the provider gives up on the session (`openai_breaker`): the calls still to
come fail at once, saying why in one line.

Time: `timeout` bounds each HTTP attempt, from connecting to the last byte of
the answer (a server that accepts and never answers, or trickles bytes, is cut
off there), and one call with all its retries and waits is bounded by
`(retries + 1) * timeout`. Time spent queued behind `concurrency` is not
counted.

The API key comes from $EVALREPLAY_API_KEY, else $OPENAI_API_KEY, and is sent
only as an `Authorization: Bearer` header: it never appears on the command
line, in the manifest, the journal or any error message.
"""

from __future__ import annotations

import os
import queue
import random
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from pytest_evalreplay.model import (
    EvalReplayError,
    GenerateResult,
    GenerationError,
    Request,
)
from pytest_evalreplay.providers.engine_requests import unsupported
from pytest_evalreplay.providers.openai_balancer import Balancer, Server, parse_server, redact_url
from pytest_evalreplay.providers.openai_breaker import GIVE_UP_AFTER, GIVE_UP_FAILURES, Breaker
from pytest_evalreplay.providers.openai_watchdog import Connections, Run, Watchdog, get_models, post
from pytest_evalreplay.providers.openai_wire import (
    CHAT_PATH,
    RETRY_STATUS,
    CallFailure,
    Malformed,
    ModelCheck,
    Outcome,
    Response,
    RetryAfter,
    combine_draws,
    draw_outcome,
    parse_generations,
    payload,
    plan_body,
    retry_after_seconds,
    server_message,
)
from pytest_evalreplay.settings import DEFAULT_CONCURRENCY, Settings

API_KEY_ENV = ("EVALREPLAY_API_KEY", "OPENAI_API_KEY")

# Per-attempt limit when --evalreplay-timeout is not given.
DEFAULT_TIMEOUT = 600.0
DEFAULT_RETRIES = 4
# The start-up check (GET /models) waits at most this long per server, whatever
# the per-request timeout: it runs once, and a loaded server may be slow to answer.
CHECK_TIMEOUT = 30.0
# Closing a stream waits at most this long for its aborted calls to unwind
# (only a call still connecting can take that long; the rest stop at once).
UNWIND_WAIT = 5.0


def from_settings(settings: Settings) -> OpenAIProvider:
    """The provider for a session, its servers checked (see `check_servers`)."""
    if not settings.base_urls:
        raise EvalReplayError(
            "the openai provider needs a server: pass --evalreplay-base-url=URL "
            "(ini evalreplay_base_url), e.g. http://127.0.0.1:8000/v1"
        )
    if not settings.model:
        raise EvalReplayError(
            "the openai provider needs a model: pass --evalreplay-model=NAME "
            "(ini evalreplay_model), the name the server serves it under"
        )
    timeout = settings.timeout if settings.timeout is not None else DEFAULT_TIMEOUT
    provider = OpenAIProvider(
        settings.base_urls, settings.model, concurrency=settings.concurrency, timeout=timeout
    )
    provider.check_servers()
    return provider


def describe(settings: Settings) -> str:
    """The limits a session's openai provider runs under, without building it."""
    timeout = settings.timeout if settings.timeout is not None else DEFAULT_TIMEOUT
    return (
        f"openai: {timeout:g} s per attempt, {DEFAULT_RETRIES} retries per call; gives up when every "
        f"server has failed {GIVE_UP_FAILURES} times in a row, at once if no request has succeeded yet, "
        f"else after {GIVE_UP_AFTER:g} s without a success"
    )


def api_key_from_env() -> str | None:
    for name in API_KEY_ENV:
        value = os.environ.get(name)
        if value:
            return value
    return None


class OpenAIProvider:
    """Generates through OpenAI-compatible servers (see the module docstring).

    `base_url`: one base URL or a sequence of them, all serving `model`.
    `timeout`: seconds per HTTP attempt (None: no limit); `retries`: extra
    attempts per HTTP call, waiting `backoff * 2**k` seconds (with jitter, at
    most `max_backoff`, or what a Retry-After header asks within the same cap)
    before retry k. `failures_to_cool`, `cool_down`, `max_cool_down`: when a
    server is taken out and for how long (doubling from `cool_down`).
    `give_up_failures`, `give_up_after`: when it gives up on every server
    (see `openai_breaker.Breaker`). `notes`: what the session should print
    at its end (a skipped model check, giving up).
    """

    kind = "openai"
    batch_size: int | None = None

    def __init__(
        self,
        base_url: str | Sequence[str],
        model: str,
        concurrency: int = DEFAULT_CONCURRENCY,
        timeout: float | None = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        api_key: str | None = None,
        *,
        failures_to_cool: int = 3,
        cool_down: float = 2.0,
        max_cool_down: float = 60.0,
        give_up_failures: int = GIVE_UP_FAILURES,
        give_up_after: float = GIVE_UP_AFTER,
    ) -> None:
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise EvalReplayError("the openai provider needs at least one server URL (--evalreplay-base-url)")
        servers = [parse_server(u) for u in urls]
        seen: set[str] = set()
        for s in servers:
            if s.url in seen:
                raise EvalReplayError(f"--evalreplay-base-url lists {s.url} twice; give each server once")
            seen.add(s.url)
        if concurrency < 1:
            raise EvalReplayError(f"concurrency must be >= 1, got {concurrency}")
        if timeout is not None and not 0 < timeout < float("inf"):
            raise EvalReplayError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        if retries < 0 or failures_to_cool < 1 or give_up_failures < 1 or not give_up_after >= 0:
            raise EvalReplayError(
                "retries and give_up_after must be >= 0, failures_to_cool and give_up_failures >= 1"
            )
        self.model = model
        self.servers = tuple(servers)
        self.base_urls = tuple(s.url for s in servers)
        self.base_url = self.base_urls[0]
        self.concurrency = concurrency
        self.timeout = timeout
        self.request_timeout = timeout  # the plugin leaves --evalreplay-timeout to us
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._api_key = api_key if api_key is not None else api_key_from_env()
        self._balancer = Balancer(len(servers), failures_to_cool, cool_down, max_cool_down)
        self._breaker = Breaker(len(servers), give_up_failures, give_up_after)
        self._gave_up: str | None = None  # the breaker's message, once it opened
        self.notes: list[str] = []
        self._cond = threading.Condition()  # guards the balancer; wakes calls waiting for a server
        self._last_error = CallFailure("none recorded", retryable=True)  # the latest server fault
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._connections = Connections(self.servers, timeout)
        self._runs: set[Run] = set()
        self._watchdog = Watchdog()
        self._checked = False
        self._check_lock = threading.Lock()

    def __repr__(self) -> str:  # never shows the key
        urls = self.base_url if len(self.base_urls) == 1 else list(self.base_urls)
        return f"OpenAIProvider(base_url={urls!r}, model={self.model!r})"

    def __enter__(self) -> OpenAIProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Cancel whatever is in flight, stop the worker threads, close the
        connections. The provider can still be used afterwards (it starts again)."""
        with self._lock:
            runs = list(self._runs)
        for run in runs:
            run.cancel()
        with self._cond:
            self._cond.notify_all()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        self._watchdog.stop()
        self._connections.close()

    # -- the servers' model ---------------------------------------------------------------

    def check_servers(self) -> None:
        """Ask every server (GET <base>/models) whether it serves `model`.

        Done once per provider, by `from_settings` or on first use. Raises an
        EvalReplayError naming each server that is unreachable, refuses, or
        serves other names (with what it serves)."""
        with self._check_lock:
            if self._checked:
                return
            if len(self.servers) == 1:
                checks = [self._probe(self.servers[0])]
            else:
                with ThreadPoolExecutor(min(len(self.servers), 16)) as pool:
                    checks = list(pool.map(self._probe, self.servers))
            found = [redact_url(c.problem) for c in checks if c.problem is not None]
            if found:
                what = (
                    "its server"
                    if len(self.servers) == 1
                    else f"{len(found)} of its {len(self.servers)} servers"
                )
                lines = "\n".join(f"  {p}" for p in found)
                raise EvalReplayError(
                    f"the openai provider cannot use {what} for model {self.model!r}:\n{lines}\n"
                    "Every --evalreplay-base-url must be running and serve the model under the name "
                    "--evalreplay-model gives (vLLM: --served-model-name)."
                )
            self.notes.extend(redact_url(c.note) for c in checks if c.note is not None)
            self._checked = True

    def _probe(self, server: Server) -> ModelCheck:
        return get_models(server, self._watchdog, self._headers(), self.model, CHECK_TIMEOUT)

    # -- batches -----------------------------------------------------------------------------

    def generate(self, requests: list[Request]) -> list[GenerateResult]:
        results = dict(self.generate_stream(requests))
        return [results[i] for i in range(len(requests))]

    def generate_stream(self, requests: list[Request]) -> Iterator[tuple[int, GenerateResult]]:
        """Yield `(index, result)` for each request as soon as all its draws
        are done, each index once. Closing the generator early cancels the
        calls still queued and aborts those in flight."""
        if requests:
            self.check_servers()
        run = Run()
        finished: queue.SimpleQueue[tuple[int, int, Future[Outcome]]] = queue.SimpleQueue()
        ready: list[tuple[int, GenerateResult]] = []
        parts: dict[int, list[Outcome]] = {}
        left: dict[int, int] = {}
        futures: list[Future[Outcome]] = []
        with self._lock:
            self._runs.add(run)
        complete = False
        try:
            pool = self._executor()
            for i, request in enumerate(requests):
                error = unsupported(request, self.kind, tools=True)
                if error is None:
                    try:
                        path, body, draws = plan_body(request, self.model)
                    except ValueError as exc:
                        error = GenerationError(str(exc), retryable=False)
                if error is not None:
                    ready.append((i, error))
                    continue
                parts[i] = [None] * len(draws)
                left[i] = len(draws)
                chat = path == CHAT_PATH
                for k, draw in enumerate(draws):
                    future = pool.submit(self._call, run, path, payload(body, draw), draw.n, chat)
                    future.add_done_callback(lambda f, i=i, k=k: finished.put((i, k, f)))
                    futures.append(future)
            yield from ready
            for _ in range(len(futures)):
                i, k, future = finished.get()
                parts[i][k] = draw_outcome(future)
                left[i] -= 1
                if not left[i]:
                    yield i, combine_draws(parts.pop(i))
            complete = True
        finally:
            with self._lock:
                self._runs.discard(run)
            if not complete:
                self._cancel(run, futures)

    def _cancel(self, run: Run, futures: list[Future[Outcome]]) -> None:
        """Stop a stream's calls: queued ones never start, those in flight are
        aborted (their sockets shut down), waiting ones wake up."""
        run.cancel()
        for future in futures:
            future.cancel()
        with self._cond:
            self._cond.notify_all()
        running = [f for f in futures if not f.done()]
        if running:
            wait(running, timeout=UNWIND_WAIT)

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="evalreplay-openai")
            return self._pool

    # -- one HTTP call, retried ------------------------------------------------------------

    def _call(self, run: Run, path: str, data: bytes, n: int, chat: bool) -> Outcome:
        """One draw's HTTP call with its retries, on whichever servers are up."""
        start = time.monotonic()
        budget = None if self.timeout is None else (self.retries + 1) * self.timeout
        call_deadline = None if budget is None else start + budget
        failure: CallFailure | None = None
        failed_on: set[int] = set()
        attempts = 0
        out_of_time = False
        malformed = False  # a 200 without an answer came back already
        for attempt in range(self.retries + 1):
            if attempt:
                assert failure is not None
                delay = self._delay(attempt, failure)
                if call_deadline is not None:
                    delay = min(delay, max(0.0, call_deadline - time.monotonic()))
                if self._pause(run, delay):
                    return None
            if call_deadline is not None and time.monotonic() >= call_deadline:
                out_of_time = True
                break
            got = self._acquire(run, frozenset(failed_on), call_deadline, failure)
            if got is None or isinstance(got, CallFailure):
                return got
            attempts += 1
            healthy: bool | None = None
            try:
                outcome = self._attempt(run, got, path, data, call_deadline)
                if outcome is None:
                    return None
                if isinstance(outcome, CallFailure):
                    healthy = False if outcome.server_fault else None
                    failure = outcome
                    failed_on.add(got)
                    continue
                healthy = outcome.status < 500
                if outcome.status == 200:
                    parsed = parse_generations(outcome.body, n, chat)
                    if not isinstance(parsed, Malformed) or malformed or attempt == self.retries:
                        if isinstance(parsed, Malformed) and attempts > 1:
                            return CallFailure(f"{parsed.message} (after {attempts} attempts)", False)
                        return parsed
                    malformed, failure = True, parsed
                    failed_on.add(got)
                    continue
                where = f"{self.servers[got].url}{path}"
                message = f"HTTP {outcome.status} from {where}: {server_message(outcome.body)}"
                retryable = outcome.status >= 500 or outcome.status in RETRY_STATUS
                if not retryable:
                    return CallFailure(message, retryable=False)
                failed_on.add(got)
                retry_after = retry_after_seconds(outcome.headers.get("retry-after"))
                failure = (
                    CallFailure(message, True)
                    if retry_after is None
                    else RetryAfter(message, True, seconds=retry_after)
                )
            finally:
                self._release(got, healthy, failure)
        assert failure is not None
        tries = f"{attempts} attempt{'s' * (attempts != 1)}"
        if out_of_time:
            return CallFailure(
                f"{failure.message} (after {tries}; no time was left for another: a call may take "
                f"(retries + 1) x --evalreplay-timeout = {budget:g} s in all)",
                retryable=True,
            )
        return CallFailure(f"{failure.message} (after {tries})", retryable=True)

    def _pause(self, run: Run, seconds: float) -> bool:
        """Wait between attempts (cut short when the provider gives up); True
        if the stream was cancelled meanwhile."""
        if seconds > 0:
            with self._cond:
                self._cond.wait_for(lambda: run.cancelled.is_set() or self._gave_up is not None, seconds)
        return run.cancelled.is_set()

    def _delay(self, attempt: int, failure: CallFailure) -> float:
        if isinstance(failure, RetryAfter):
            return min(failure.seconds, self.max_backoff)
        base = min(self.backoff * 2 ** (attempt - 1), self.max_backoff)
        return base * (0.5 + random.random() / 2)

    def _acquire(
        self, run: Run, avoid: frozenset[int], call_deadline: float | None, last: CallFailure | None
    ) -> int | CallFailure | None:
        """A server for the next attempt; waits while every server is out, as
        long as the call's time allows. None if the stream was cancelled."""
        with self._cond:
            while True:
                if run.cancelled.is_set():
                    return None
                now = time.monotonic()
                if self._gave_up is not None:
                    return CallFailure(self._gave_up, retryable=True)
                index = self._balancer.choose(now, avoid)
                if index is not None:
                    return index
                back = self._balancer.back_at(now)
                late = back is not None and call_deadline is not None and back > call_deadline
                if late or (call_deadline is not None and now >= call_deadline):
                    when = f"the soonest is back in {back - now:.1f} s, " if back is not None else ""
                    return CallFailure(
                        f"every server is out after repeated failures ({when}past this call's time "
                        f"budget); last error: {(last or self._last_error).message}",
                        retryable=True,
                    )
                waits = [t - now for t in (back, call_deadline) if t is not None]
                self._cond.wait(min(waits) if waits else None)

    def _release(self, index: int, healthy: bool | None, failure: CallFailure | None) -> None:
        with self._cond:
            now = time.monotonic()
            self._balancer.done(index, now, healthy)
            if healthy is False and failure is not None:
                self._last_error = failure
            self._breaker.record(index, now, healthy)
            why = self._breaker.reason(now)
            if why is not None and self._gave_up is None:
                self._gave_up = (
                    f"the openai provider gave up: {why} (last error: {self._last_error.message}); "
                    "the requests left fail without being sent: fix the server, then run again with --resume"
                )
                self.notes.append(self._gave_up)
            self._cond.notify_all()

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _attempt(
        self, run: Run, index: int, path: str, data: bytes, call_deadline: float | None
    ) -> Response | CallFailure | None:
        """One POST to server `index`, cut off at the sooner of its own
        timeout and the call's deadline."""
        where = f"{self.servers[index].url}{path}"
        start = time.monotonic()
        own = None if self.timeout is None else start + self.timeout
        limits = [t for t in (own, call_deadline) if t is not None]
        deadline = min(limits) if limits else None
        # Cut short by the call's budget (by more than the moment between the
        # call's start and this attempt's, which every first attempt has).
        if own is not None and deadline is not None and deadline < own - 0.01 * (self.timeout or 0.0):
            budget = (self.retries + 1) * (self.timeout or 0.0)
            what = f"timed out: the call's {budget:g} s ((retries + 1) x --evalreplay-timeout) ran out"
        else:
            what = f"timed out after {self.timeout:g} s (--evalreplay-timeout)"
        timed_out = CallFailure(f"{what} waiting for {where}", retryable=True, server_fault=True)
        return post(
            self._connections, self._watchdog, run, index, path, data, self._headers(), deadline, timed_out
        )
