"""The `openai` provider: one or several OpenAI-compatible HTTP servers
(`vllm serve` replicas, ...) serving the same model.

Standard library only. Text contexts go to `/completions`, chat contexts to
`/chat/completions`; up to `concurrency` HTTP calls are in flight at once (in
total over all servers), each worker thread keeping one keep-alive connection
per server. Each call goes to the server with the fewest calls in flight.

Failures: connection errors, timeouts, 5xx, 408 and 429 are retried with
exponential backoff, preferring a server the call has not failed on; when the
retries run out the request is a retryable `GenerationError` (the plugin tries
again up to --evalreplay-max-attempts). Any other 4xx is final at once and
carries the server's message. A server that fails (connection error, timeout,
5xx) `failures_to_cool` times in a row is taken out for a cool-down that
doubles while it keeps failing; afterwards one call at a time probes it until
one succeeds.

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

import contextlib
import heapq
import http.client
import itertools
import os
import queue
import random
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

from pytest_evalreplay.model import (
    EvalReplayError,
    GenerateResult,
    Generation,
    GenerationError,
    Request,
)
from pytest_evalreplay.providers.engine_requests import (
    GREEDY_EPS,
    Draw,
    chat_messages,
    key_hint,
    plan_draws,
    text_prompt,
    unsupported,
)
from pytest_evalreplay.settings import DEFAULT_CONCURRENCY, Settings

API_KEY_ENV = ("EVALREPLAY_API_KEY", "OPENAI_API_KEY")

# Per-attempt limit when --evalreplay-timeout is not given.
DEFAULT_TIMEOUT = 600.0
# The start-up check (GET /models) waits at most this long per server, whatever
# the per-request timeout: it runs once, and a loaded server may be slow to answer.
CHECK_TIMEOUT = 30.0
# Closing a stream waits at most this long for its aborted calls to unwind
# (only a call still connecting can take that long; the rest stop at once).
UNWIND_WAIT = 5.0

# Body fields the provider sets itself; a task's sampling may not.
_RESERVED = frozenset({"n", "model", "prompt", "messages", "stream", "echo", "best_of"})
_RETRY_STATUS = frozenset({408, 429})


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


def api_key_from_env() -> str | None:
    for name in API_KEY_ENV:
        value = os.environ.get(name)
        if value:
            return value
    return None


# -- servers and their health ---------------------------------------------------------


@dataclass(frozen=True)
class Server:
    """One server's address; `url` is its normalized base URL."""

    url: str
    scheme: str
    host: str
    port: int | None
    prefix: str


def parse_server(base_url: str) -> Server:
    """The base URL the OpenAI SDK takes (`http://host:8000/v1`); no path means `/v1`."""
    parts = urlsplit(base_url.strip().rstrip("/"))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EvalReplayError(
            f"--evalreplay-base-url must be an http(s) URL such as http://127.0.0.1:8000/v1, got {base_url!r}"
        )
    try:
        port = parts.port
    except ValueError:
        raise EvalReplayError(f"--evalreplay-base-url {base_url!r} has an invalid port") from None
    prefix = parts.path or "/v1"
    return Server(f"{parts.scheme}://{parts.netloc}{prefix}", parts.scheme, parts.hostname, port, prefix)


@dataclass
class _Health:
    in_flight: int = 0
    failures: int = 0  # in a row
    level: int = 0  # cool-downs in a row
    out_until: float = float("-inf")
    probation: bool = False  # back from a cool-down, not yet proven
    last_pick: int = -1


class Balancer:
    """Which server takes the next attempt, and which servers are out.

    Pure bookkeeping over explicit times (the caller locks and passes `now`),
    so it is tested without a network or a clock. `choose` picks the server
    with the fewest attempts in flight (the least recently picked among
    equals), skipping servers that are out and preferring ones not in `avoid`;
    `done` records how an attempt went: True (the server answered), False (a
    connection error, timeout or 5xx) or None (cancelled: says nothing).
    """

    def __init__(self, n: int, failures_to_cool: int, cool_down: float, max_cool_down: float) -> None:
        self.health = [_Health() for _ in range(n)]
        self.failures_to_cool = failures_to_cool
        self.cool_down = cool_down
        self.max_cool_down = max_cool_down
        self._picks = itertools.count()

    def available(self, i: int, now: float) -> bool:
        h = self.health[i]
        return now >= h.out_until and not (h.probation and h.in_flight > 0)

    def choose(self, now: float, avoid: frozenset[int] = frozenset()) -> int | None:
        ready = [i for i in range(len(self.health)) if self.available(i, now)]
        preferred = [i for i in ready if i not in avoid] or ready
        if not preferred:
            return None
        best = min(preferred, key=lambda i: (self.health[i].in_flight, self.health[i].last_pick))
        h = self.health[best]
        h.in_flight += 1
        h.last_pick = next(self._picks)
        return best

    def done(self, i: int, now: float, healthy: bool | None) -> None:
        h = self.health[i]
        h.in_flight -= 1
        if healthy is None:
            return
        if healthy:
            h.failures = h.level = 0
            h.probation = False
            return
        if now < h.out_until:
            return  # already out: a call sent before it went out
        h.failures += 1
        if h.probation or h.failures >= self.failures_to_cool:
            h.out_until = now + min(self.cool_down * 2**h.level, self.max_cool_down)
            h.level += 1
            h.failures = 0
            h.probation = True

    def back_at(self, now: float) -> float | None:
        """When the soonest server that is out comes back (None: none is out;
        only a probe in flight keeps the rest waiting)."""
        times = [h.out_until for h in self.health if h.out_until > now]
        return min(times) if times else None


# -- aborting calls: deadlines and cancellation --------------------------------------------


class _Watch:
    """One attempt in flight on a socket, which a deadline or a cancelled
    stream aborts by shutting the socket down (that wakes a blocked recv)."""

    __slots__ = ("deadline", "done", "lock", "reason", "sock")

    def __init__(self, sock: socket.socket | None, deadline: float | None) -> None:
        self.sock = sock
        self.deadline = deadline
        self.reason: str | None = None
        self.done = False
        self.lock = threading.Lock()

    def abort(self, reason: str) -> None:
        with self.lock:
            if self.done or self.reason is not None:
                return
            self.reason = reason
            if self.sock is not None:
                with contextlib.suppress(OSError):
                    # The plain socket's shutdown, also for TLS: the SSL
                    # object stays intact for the thread reading it.
                    socket.socket.shutdown(self.sock, socket.SHUT_RDWR)

    def finish(self) -> str | None:
        with self.lock:
            self.done = True
            self.sock = None
            return self.reason


class _Watchdog:
    """One daemon thread that aborts attempts past their deadline.

    A socket timeout alone does not bound an attempt: it restarts with every
    byte, so a server that trickles bytes would hold a call forever."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Watch]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, watch: _Watch) -> None:
        assert watch.deadline is not None
        with self._cond:
            heapq.heappush(self._heap, (watch.deadline, next(self._seq), watch))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="evalreplay-openai-watchdog", daemon=True
                )
                self._thread.start()
            if self._heap[0][2] is watch:  # the loop sleeps until the earliest deadline
                self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            thread, self._thread = self._thread, None
            self._heap.clear()
            self._cond.notify()
        if thread is not None:
            thread.join()

    def _loop(self) -> None:
        me = threading.current_thread()
        with self._cond:
            while self._thread is me:
                now = time.monotonic()
                while self._heap and (self._heap[0][2].done or self._heap[0][0] <= now):
                    _, _, watch = heapq.heappop(self._heap)
                    watch.abort("timeout")
                self._cond.wait(self._heap[0][0] - now if self._heap else None)


class _Run:
    """The calls of one stream: closing the stream cancels them all."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self._lock = threading.Lock()
        self._watches: set[_Watch] = set()

    def enter(self, watch: _Watch) -> bool:
        with self._lock:
            if self.cancelled.is_set():
                return False
            self._watches.add(watch)
            return True

    def leave(self, watch: _Watch) -> None:
        with self._lock:
            self._watches.discard(watch)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled.set()
            watches = list(self._watches)
        for watch in watches:
            watch.abort("cancelled")


# -- outcomes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Failure:
    """Why one HTTP attempt or call failed. `server_fault`: counts against the server's health."""

    message: str
    retryable: bool
    server_fault: bool = False


@dataclass(frozen=True)
class _RetryAfter(_Failure):
    seconds: float = 0.0


@dataclass(frozen=True)
class _Response:
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


_Outcome = list[Generation] | _Failure | None  # None: cancelled


class OpenAIProvider:
    """Generates through OpenAI-compatible servers (see the module docstring).

    `base_url`: one base URL or a sequence of them, all serving `model`.
    `timeout`: seconds per HTTP attempt (None: no limit); `retries`: extra
    attempts per HTTP call, waiting `backoff * 2**k` seconds (with jitter, at
    most `max_backoff`, or what a Retry-After header asks within the same cap)
    before retry k. `failures_to_cool`, `cool_down`, `max_cool_down`: when a
    server is taken out and for how long (doubling from `cool_down`).
    """

    kind = "openai"
    batch_size: int | None = None

    def __init__(
        self,
        base_url: str | Sequence[str],
        model: str,
        concurrency: int = DEFAULT_CONCURRENCY,
        timeout: float | None = DEFAULT_TIMEOUT,
        retries: int = 4,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        api_key: str | None = None,
        *,
        failures_to_cool: int = 3,
        cool_down: float = 2.0,
        max_cool_down: float = 60.0,
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
        if retries < 0 or failures_to_cool < 1:
            raise EvalReplayError("retries must be >= 0 and failures_to_cool >= 1")
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
        self._cond = threading.Condition()  # guards the balancer; wakes calls waiting for a server
        self._last_error = _Failure("none recorded", retryable=True)  # the latest server fault
        self._lock = threading.Lock()
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        self._connections: set[http.client.HTTPConnection] = set()
        self._runs: set[_Run] = set()
        self._watchdog = _Watchdog()
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
        with self._lock:
            conns, self._connections = self._connections, set()
        for conn in conns:
            conn.close()

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
                problems = [self._probe(self.servers[0])]
            else:
                with ThreadPoolExecutor(min(len(self.servers), 16)) as pool:
                    problems = list(pool.map(self._probe, self.servers))
            found = [p for p in problems if p is not None]
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
            self._checked = True

    def _probe(self, server: Server) -> str | None:
        """None if `server` serves the model, else what is wrong."""
        limit = CHECK_TIMEOUT
        conn = _connect_to(server, limit)
        watch = _Watch(None, time.monotonic() + limit)
        try:
            conn.connect()
            watch.sock = conn.sock
            self._watchdog.add(watch)
            conn.request("GET", f"{server.prefix}/models", headers=self._headers())
            resp = conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            if watch.finish() == "timeout" or isinstance(exc, TimeoutError):
                return f"{server.url}: no answer to GET {server.prefix}/models within {limit:g} s"
            return (
                f"{server.url}: unreachable ({type(exc).__name__}: {exc}); "
                "is the server running, and is the URL right?"
            )
        finally:
            watch.finish()
            conn.close()
        if resp.status != 200:
            hint = " (check $EVALREPLAY_API_KEY or $OPENAI_API_KEY)" if resp.status in (401, 403) else ""
            message = _server_message(raw)
            return f"{server.url}: GET {server.prefix}/models answered HTTP {resp.status}: {message}{hint}"
        try:
            data = orjson.loads(raw)["data"]
            names = [str(m["id"]) for m in data]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return f"{server.url}: GET {server.prefix}/models gave no model list: {raw[:200]!r}"
        if self.model in names:
            return None
        served = ", ".join(repr(n) for n in names) if names else "no model"
        return f"{server.url}: serves {served}, not {self.model!r}"

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
        run = _Run()
        finished: queue.SimpleQueue[tuple[int, int, Future[_Outcome]]] = queue.SimpleQueue()
        ready: list[tuple[int, GenerateResult]] = []
        parts: dict[int, list[_Outcome]] = {}
        left: dict[int, int] = {}
        futures: list[Future[_Outcome]] = []
        with self._lock:
            self._runs.add(run)
        complete = False
        try:
            pool = self._executor()
            for i, request in enumerate(requests):
                error = unsupported(request, self.kind)
                if error is None:
                    try:
                        path, body, draws = self._plan(request)
                    except ValueError as exc:
                        error = GenerationError(str(exc), retryable=False)
                if error is not None:
                    ready.append((i, error))
                    continue
                parts[i] = [None] * len(draws)
                left[i] = len(draws)
                chat = path.endswith("/chat/completions")
                for k, draw in enumerate(draws):
                    future = pool.submit(self._call, run, path, _payload(body, draw), draw.n, chat)
                    future.add_done_callback(lambda f, i=i, k=k: finished.put((i, k, f)))
                    futures.append(future)
            yield from ready
            for _ in range(len(futures)):
                i, k, future = finished.get()
                parts[i][k] = _outcome(future)
                left[i] -= 1
                if not left[i]:
                    yield i, _combine(parts.pop(i))
            complete = True
        finally:
            with self._lock:
                self._runs.discard(run)
            if not complete:
                self._cancel(run, futures)

    def _cancel(self, run: _Run, futures: list[Future[_Outcome]]) -> None:
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

    def _plan(self, request: Request) -> tuple[str, dict[str, Any], list[Draw]]:
        """Endpoint (under the server's prefix), body without n/seed, and draws.
        ValueError on bad sampling."""
        sampling = dict(request.sampling)
        for key in sampling:
            if key in _RESERVED:
                raise ValueError(f"sampling key {key!r} is set by the openai provider{key_hint(key)}")
        temperature = sampling.get("temperature")
        # Unset temperature is the server's default (1.0 for OpenAI): sampling.
        greedy = isinstance(temperature, (int, float)) and temperature < GREEDY_EPS
        draws = plan_draws(request, greedy)
        sampling.pop("seed", None)
        body: dict[str, Any] = {"model": self.model, **sampling}
        if isinstance(request.context, str):
            body["prompt"] = text_prompt(request.context, request.system_prompt)
            return "/completions", body, draws
        body["messages"] = chat_messages(request.context, request.system_prompt)
        return "/chat/completions", body, draws

    # -- one HTTP call, retried ------------------------------------------------------------

    def _call(self, run: _Run, path: str, data: bytes, n: int, chat: bool) -> _Outcome:
        """One draw's HTTP call with its retries, on whichever servers are up."""
        start = time.monotonic()
        budget = None if self.timeout is None else (self.retries + 1) * self.timeout
        call_deadline = None if budget is None else start + budget
        failure: _Failure | None = None
        failed_on: set[int] = set()
        attempts = 0
        out_of_time = False
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
            if got is None or isinstance(got, _Failure):
                return got
            attempts += 1
            healthy: bool | None = None
            try:
                outcome = self._attempt(run, got, path, data, call_deadline)
                if outcome is None:
                    return None
                if isinstance(outcome, _Failure):
                    healthy = False if outcome.server_fault else None
                    failure = outcome
                    failed_on.add(got)
                    continue
                healthy = outcome.status < 500
                if outcome.status == 200:
                    return _parse(outcome.body, n, chat)
                where = f"{self.servers[got].url}{path}"
                message = f"HTTP {outcome.status} from {where}: {_server_message(outcome.body)}"
                retryable = outcome.status >= 500 or outcome.status in _RETRY_STATUS
                if not retryable:
                    return _Failure(message, retryable=False)
                failed_on.add(got)
                retry_after = _retry_after(outcome.headers.get("retry-after"))
                failure = (
                    _Failure(message, True)
                    if retry_after is None
                    else _RetryAfter(message, True, seconds=retry_after)
                )
            finally:
                self._release(got, healthy, failure)
        assert failure is not None
        tries = f"{attempts} attempt{'s' * (attempts != 1)}"
        if out_of_time:
            return _Failure(
                f"{failure.message} (after {tries}; no time was left for another: a call may take "
                f"(retries + 1) x --evalreplay-timeout = {budget:g} s in all)",
                retryable=True,
            )
        return _Failure(f"{failure.message} (after {tries})", retryable=True)

    def _pause(self, run: _Run, seconds: float) -> bool:
        """Wait between attempts; True if the stream was cancelled meanwhile."""
        return run.cancelled.wait(seconds) if seconds > 0 else run.cancelled.is_set()

    def _delay(self, attempt: int, failure: _Failure) -> float:
        if isinstance(failure, _RetryAfter):
            return min(failure.seconds, self.max_backoff)
        base = min(self.backoff * 2 ** (attempt - 1), self.max_backoff)
        return base * (0.5 + random.random() / 2)

    def _acquire(
        self, run: _Run, avoid: frozenset[int], call_deadline: float | None, last: _Failure | None
    ) -> int | _Failure | None:
        """A server for the next attempt; waits while every server is out, as
        long as the call's time allows. None if the stream was cancelled."""
        with self._cond:
            while True:
                if run.cancelled.is_set():
                    return None
                now = time.monotonic()
                index = self._balancer.choose(now, avoid)
                if index is not None:
                    return index
                back = self._balancer.back_at(now)
                late = back is not None and call_deadline is not None and back > call_deadline
                if late or (call_deadline is not None and now >= call_deadline):
                    when = f"the soonest is back in {back - now:.1f} s, " if back is not None else ""
                    return _Failure(
                        f"every server is out after repeated failures ({when}past this call's time "
                        f"budget); last error: {(last or self._last_error).message}",
                        retryable=True,
                    )
                waits = [t - now for t in (back, call_deadline) if t is not None]
                self._cond.wait(min(waits) if waits else None)

    def _release(self, index: int, healthy: bool | None, failure: _Failure | None) -> None:
        with self._cond:
            self._balancer.done(index, time.monotonic(), healthy)
            if healthy is False and failure is not None:
                self._last_error = failure
            self._cond.notify_all()

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _attempt(
        self, run: _Run, index: int, path: str, data: bytes, call_deadline: float | None
    ) -> _Response | _Failure | None:
        """One POST on this thread's connection to server `index`. A kept-alive
        connection the server has closed meanwhile is reopened once, within
        the same attempt."""
        server = self.servers[index]
        where = f"{server.url}{path}"
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
        timed_out = _Failure(f"{what} waiting for {where}", retryable=True, server_fault=True)
        for fresh_retry in (False, True):
            conn = self._connection(index)
            reused = conn.sock is not None
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return timed_out
            try:
                if conn.sock is None:
                    conn.timeout = remaining
                    conn.connect()
                else:
                    conn.sock.settimeout(remaining)
            except TimeoutError:
                self._drop(index)
                return timed_out
            except OSError as exc:
                self._drop(index)
                return _Failure(f"cannot connect to {server.url}: {type(exc).__name__}: {exc}", True, True)
            watch = _Watch(conn.sock, deadline)
            if not run.enter(watch):
                return None
            if deadline is not None:
                self._watchdog.add(watch)
            try:
                conn.request("POST", server.prefix + path, body=data, headers=self._headers())
                resp = conn.getresponse()
                raw = resp.read()
                headers = {k.lower(): v for k, v in resp.getheaders()}
            except (OSError, http.client.HTTPException, ValueError) as exc:
                reason = watch.finish()
                self._drop(index)
                if reason == "cancelled":
                    return None
                if reason == "timeout" or isinstance(exc, TimeoutError):
                    return timed_out
                if reused and not fresh_retry and isinstance(exc, _STALE):
                    continue
                what = f"{type(exc).__name__}: {exc}"
                return _Failure(f"connection error on {where}: {what}", retryable=True, server_fault=True)
            finally:
                watch.finish()
                run.leave(watch)
            if watch.reason is not None:
                # Aborted while reading: what was read may be cut short (http.client
                # takes EOF inside the headers for their end), so it is no answer.
                self._drop(index)
                return None if watch.reason == "cancelled" else timed_out
            if resp.will_close:
                self._drop(index)
            return _Response(resp.status, headers, raw)
        raise AssertionError("unreachable")

    def _connection(self, index: int) -> http.client.HTTPConnection:
        conns: dict[int, http.client.HTTPConnection] | None = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        conn = conns.get(index)
        if conn is None:
            conn = conns[index] = _connect_to(self.servers[index], self.timeout)
            with self._lock:
                self._connections.add(conn)
        return conn

    def _drop(self, index: int) -> None:
        conns: dict[int, http.client.HTTPConnection] = getattr(self._local, "conns", {})
        conn = conns.pop(index, None)
        if conn is not None:
            conn.close()
            with self._lock:
                self._connections.discard(conn)


# What a server closing an idle keep-alive connection looks like.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


def _connect_to(server: Server, timeout: float | None) -> http.client.HTTPConnection:
    """An unopened connection (it connects on first use)."""
    if server.scheme == "https":
        return http.client.HTTPSConnection(
            server.host, server.port, timeout=timeout, context=ssl.create_default_context()
        )
    return http.client.HTTPConnection(server.host, server.port, timeout=timeout)


def _payload(body: Mapping[str, Any], draw: Draw) -> bytes:
    payload = dict(body)
    if draw.n != 1:
        payload["n"] = draw.n
    if draw.seed is not None:
        payload["seed"] = draw.seed
    return orjson.dumps(payload)


def _outcome(future: Future[_Outcome]) -> _Outcome:
    if future.cancelled():
        return None
    exc = future.exception()
    if exc is not None:  # a bug in one call fails its request only
        return _Failure(f"openai provider: {type(exc).__name__}: {exc}", retryable=False)
    return future.result()


def _combine(outcomes: list[_Outcome]) -> GenerateResult:
    """A request's result from its draws, in draw order: the first failure, or all generations."""
    gens: list[Generation] = []
    for outcome in outcomes:
        if outcome is None:
            return GenerationError("cancelled: the openai provider was closed", retryable=True)
        if isinstance(outcome, _Failure):
            return GenerationError(outcome.message, retryable=outcome.retryable)
        gens.extend(outcome)
    return gens


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: fall back to the backoff


def _server_message(raw: bytes) -> str:
    """The error text of an OpenAI-style (or FastAPI) error body, else the body."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        text = raw.decode("utf-8", "replace").strip()
        return text[:500] or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            for key in ("message", "detail"):
                if isinstance(err.get(key), str):
                    return err[key]
        if isinstance(err, str):
            return err
        if isinstance(data.get("detail"), str):
            return data["detail"]
    return orjson.dumps(data).decode()[:500]


def _choice_tokens(choice: Mapping[str, Any]) -> int | None:
    usage = choice.get("usage")
    own = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return own if own is not None else choice.get("completion_tokens")


def _parse(raw: bytes, n: int, chat: bool) -> list[Generation] | _Failure:
    """Generations from a 200 body, in choice order.

    Token counts: every choice shares the prompt, so each gets
    usage.prompt_tokens; completion tokens come per choice where the server
    gives them (a choice-level `usage` or `completion_tokens`), else
    usage.completion_tokens split evenly (rounded; exact when n is 1).
    """
    try:
        data = orjson.loads(raw)
        choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
        usage = data.get("usage") or {}
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        snippet = raw[:200].decode("utf-8", "replace")
        return _Failure(f"malformed response from the server: {snippet!r}", retryable=False)
    if len(choices) != n:
        return _Failure(f"the server returned {len(choices)} choices where {n} were asked for", False)
    prompt_tokens = usage.get("prompt_tokens")
    total = usage.get("completion_tokens")
    share = int(total / n + 0.5) if isinstance(total, (int, float)) else None
    gens = []
    for c in choices:
        metadata: dict[str, Any] = {}
        if chat:
            message = c.get("message") or {}
            text = message.get("content") or ""
            reasoning = message.get("reasoning_content") or message.get("reasoning")
            if reasoning:
                metadata["reasoning"] = reasoning
        else:
            text = c.get("text") or ""
        own = _choice_tokens(c)
        gens.append(
            Generation(
                text=text,
                finish_reason=c.get("finish_reason"),
                prompt_tokens=prompt_tokens if isinstance(prompt_tokens, int) else None,
                completion_tokens=own if isinstance(own, int) else share,
                metadata=metadata,
            )
        )
    return gens
