"""The `openai` provider: one or several OpenAI-compatible HTTP servers
(`vllm serve` replicas, ...) serving the same model.

Standard library only. This module turns a batch of requests into HTTP
calls run on worker threads and hands back each request's result as its
calls finish; the other jobs have their own modules: one call with its
retries (`openai_calls`), which server takes a call (`openai_balancer`),
cutting off hung attempts and cancelled streams (`openai_watchdog`), the
request and response bodies (`openai_wire`) and loglikelihood requests
(`openai_loglikelihood`: one echo call to `/completions` each, beside a
`/tokenize` call where the server has it: probed once, on first use).
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
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from pytest_evalreplay.model import (
    EvalReplayError,
    GenerateResult,
    GenerationError,
    LoglikelihoodResult,
    Request,
)
from pytest_evalreplay.providers.engine_requests import unsupported
from pytest_evalreplay.providers.openai_balancer import Balancer, Server, parse_server
from pytest_evalreplay.providers.openai_breaker import GIVE_UP_AFTER, GIVE_UP_FAILURES, Breaker
from pytest_evalreplay.providers.openai_calls import Call, Caller
from pytest_evalreplay.providers.openai_loglikelihood import plan_scoring
from pytest_evalreplay.providers.openai_rolling import (
    RollingCall,
    ServerTokenizer,
    combine_answers,
    plan_rolling,
)
from pytest_evalreplay.providers.openai_watchdog import Run, get_models
from pytest_evalreplay.providers.openai_wire import (
    CHAT_PATH,
    TOKENIZE_PATH,
    CallFailure,
    ModelCheck,
    combine_draws,
    parse_generations,
    parse_token_count,
    payload,
    plan_body,
    sent,
    tokenize_body,
)
from pytest_evalreplay.settings import DEFAULT_CONCURRENCY, Settings
from pytest_evalreplay.values.credentials import API_KEY_ENV, redact

R = TypeVar("R")


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
        self.notes: list[str] = []
        self._caller = Caller(
            self.servers,
            timeout,
            retries,
            backoff,
            max_backoff,
            api_key if api_key is not None else api_key_from_env(),
            Balancer(len(servers), failures_to_cool, cool_down, max_cool_down),
            Breaker(len(servers), give_up_failures, give_up_after),
            self.notes,
        )
        self._tokenizer = ServerTokenizer(model)  # asked for rolling requests' windows only
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._runs: set[Run] = set()
        self._checked = False
        self._check_lock = threading.Lock()
        self._tokenizes: bool | None = None  # whether the servers answer /tokenize (probed once)
        self._local = threading.local()  # per worker thread: its last answer, until journaled

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
        self._caller.wake()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        self._caller.close()

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
            live = [c.problem is None for c in checks]
            if any(live) and all(c.down for c in checks if c.problem is not None):
                for i, check in enumerate(checks):
                    if check.problem is not None:  # down now; tried again after a cool-down
                        self._caller.put_out(i)
                        others = sum(live)
                        self.notes.append(
                            redact(check.problem, self._caller.secrets)
                            + f"; running on the {others} other server{'s' * (others != 1)}, this one is "
                            "tried again after a cool-down"
                        )
                checks = [c for c in checks if c.problem is None]
            found = [redact(c.problem, self._caller.secrets) for c in checks if c.problem is not None]
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
            self.notes.extend(redact(c.note, self._caller.secrets) for c in checks if c.note is not None)
            self._checked = True

    def _probe(self, server: Server) -> ModelCheck:
        return get_models(server, self._caller.watchdog, self._caller.headers(), self.model, CHECK_TIMEOUT)

    # -- batches -----------------------------------------------------------------------------

    def generate(self, requests: list[Request]) -> list[GenerateResult]:
        results = dict(self.generate_stream(requests))
        return [results[i] for i in range(len(requests))]

    def generate_stream(self, requests: list[Request]) -> Iterator[tuple[int, GenerateResult]]:
        """Yield `(index, result)` for each request as soon as all its draws
        are done, each index once. Closing the generator early cancels the
        calls still queued and aborts those in flight."""
        return self._stream(requests, self._plan_generation, combine_draws)

    def _plan_generation(self, request: Request) -> list[Call] | GenerationError:
        """A generation request's HTTP calls, one per draw."""
        error = unsupported(request, self.kind, tools=True)
        if error is not None:
            return error
        try:
            path, body, draws = plan_body(request, self.model)
        except ValueError as exc:
            return GenerationError(str(exc), retryable=False)
        chat = path == CHAT_PATH
        return [
            Call(path, payload(body, d), lambda raw, n=d.n: parse_generations(raw, n, chat)) for d in draws
        ]

    def loglikelihood(self, requests: list[Request]) -> list[LoglikelihoodResult]:
        results = dict(self.loglikelihood_stream(requests))
        return [results[i] for i in range(len(requests))]

    def loglikelihood_stream(self, requests: list[Request]) -> Iterator[tuple[int, LoglikelihoodResult]]:
        """Like `generate_stream`, for loglikelihood requests: one echo call
        each to the completions endpoint (openai_loglikelihood.py); a
        loglikelihood_rolling request's windows after the server's tokenizer
        cut them (openai_rolling.py)."""
        choices = any(r.request_type != "loglikelihood_rolling" for r in requests)
        tokenize = choices and self._counts_tokens()
        yield from self._stream(requests, lambda r: self._plan_scoring(r, tokenize), combine_answers)

    def _plan_scoring(
        self, request: Request, tokenize: bool
    ) -> list[Call] | list[RollingCall] | GenerationError:
        if request.request_type == "loglikelihood_rolling":
            return plan_rolling(request, self.kind, self._tokenizer)
        return plan_scoring(request, self.kind, self.model, tokenize)

    def _counts_tokens(self) -> bool:
        """Whether the servers count a text's tokens at `/tokenize`, asked once
        (`vllm serve` does); without it each context is echoed alone too, and
        the session's notes say so."""
        self.check_servers()
        with self._check_lock:
            if self._tokenizes is None:
                run = Run()
                with self._lock:
                    self._runs.add(run)
                try:
                    got = self._caller.call(
                        run, TOKENIZE_PATH, tokenize_body(self.model, "Hello"), parse_token_count
                    )
                finally:
                    with self._lock:
                        self._runs.discard(run)
                if got is None:
                    return False  # closed meanwhile: ask again next time
                self._tokenizes = isinstance(got, int)
                if isinstance(got, CallFailure):
                    self.notes.append(
                        "multiple choice: the server does not count tokens at /tokenize ("
                        + redact(got.message, self._caller.secrets)
                        + "), so each request's context is echoed alone beside its continuations: "
                        "one prompt more per request than lm-eval sends"
                    )
            return self._tokenizes

    def _stream(
        self,
        requests: list[Request],
        plan: Callable[[Request], list[Call] | list[RollingCall] | GenerationError],
        combine: Callable[[list[Any]], R],
    ) -> Iterator[tuple[int, R | GenerationError]]:
        """Run each request's planned calls on the worker threads; yield
        `(index, combine(its call outcomes))` as soon as all its calls are done,
        or its planning error at once."""
        if requests:
            self.check_servers()
        run = Run()
        finished: queue.SimpleQueue[tuple[int, int, Future[Any]]] = queue.SimpleQueue()
        ready: list[tuple[int, GenerationError]] = []
        parts: dict[int, list[Any]] = {}
        left: dict[int, int] = {}
        futures: list[Future[Any]] = []
        with self._lock:
            self._runs.add(run)
        complete = False
        try:
            pool = self._executor()
            for i, request in enumerate(requests):
                calls = plan(request)
                if isinstance(calls, GenerationError):
                    ready.append((i, calls))
                    continue
                parts[i] = [None] * len(calls)
                left[i] = len(calls)
                for k, call in enumerate(calls):
                    future = pool.submit(self._send, run, call)
                    future.add_done_callback(lambda f, i=i, k=k: finished.put((i, k, f)))
                    futures.append(future)
            yield from ready
            for _ in range(len(futures)):
                i, k, future = finished.get()
                parts[i][k], taken = sent(future)
                left[i] -= 1
                if left[i]:
                    run.release(taken)  # nothing to journal until the request's last call is in
                    continue
                outcome = combine(parts.pop(i))
                if isinstance(outcome, GenerationError):
                    message = redact(outcome.message, self._caller.secrets)
                    outcome = GenerationError(message, outcome.retryable)
                yield i, outcome
                run.release(taken)  # the consumer is back: it wrote the answer's rows
            complete = True
        finally:
            with self._lock:
                self._runs.discard(run)
            if not complete:
                self._cancel(run, futures)

    def _send(self, run: Run, call: Call | RollingCall) -> tuple[Any, threading.Event]:
        """One call on this worker thread, sent only once the answer the
        thread fetched before is journaled (released by `_stream` when its
        consumer comes back for the next): a kill then loses at most the
        answers in flight, never one that waited for its rows while its
        connection went on to the next request."""
        before = getattr(self._local, "untaken", None)
        if before is not None:
            before.wait()
        if isinstance(call, RollingCall):  # its calls one after another, on this thread
            outcome = call(self._caller, run)
        else:
            outcome = self._caller.call(run, call.path, call.data, call.parse)
        self._local.untaken = taken = run.hold()
        return outcome, taken

    def _cancel(self, run: Run, futures: list[Future[Any]]) -> None:
        """Stop a stream's calls: queued ones never start, those in flight are
        aborted (their sockets shut down), waiting ones wake up."""
        run.cancel()
        for future in futures:
            future.cancel()
        self._caller.wake()
        running = [f for f in futures if not f.done()]
        if running:
            wait(running, timeout=UNWIND_WAIT)

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="evalreplay-openai")
            return self._pool
