"""One HTTP call of the openai provider, retried: which server takes each
attempt (`openai_balancer`), the backoff between attempts, the per-attempt
and per-call time limits, one more try for a malformed 200, and giving up on
the session when every server keeps failing (`openai_breaker`).

What a call sends and how its 200 is read are the caller's (`parse`), so
generation and loglikelihood calls share every rule here; the provider
(openai.py) runs the calls of a batch on worker threads.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pytest_evalreplay.providers.openai_balancer import Balancer, Server
from pytest_evalreplay.providers.openai_breaker import Breaker
from pytest_evalreplay.providers.openai_watchdog import Connections, Run, Watchdog, post
from pytest_evalreplay.providers.openai_wire import (
    RETRY_STATUS,
    CallFailure,
    Malformed,
    Response,
    RetryAfter,
    retry_after_seconds,
    server_message,
)
from pytest_evalreplay.values.credentials import redact

T = TypeVar("T")
# What a call makes of a 200 body: its answer, or why it holds none (`Malformed`).
Parse = Callable[[bytes], "T | CallFailure"]


@dataclass(frozen=True)
class Call:
    """One HTTP call a request needs: where (below the base URL, or beside
    it: `/../tokenize`), what, and how its 200 body is read."""

    path: str
    data: bytes
    parse: Parse[Any]


class Caller:
    """Retried HTTP calls to `servers` (see the module docstring and
    `OpenAIProvider` for the parameters). `notes` is the provider's list: a
    message saying the provider gave up is appended to it."""

    def __init__(
        self,
        servers: Sequence[Server],
        timeout: float | None,
        retries: int,
        backoff: float,
        max_backoff: float,
        api_key: str | None,
        balancer: Balancer,
        breaker: Breaker,
        notes: list[str],
    ) -> None:
        self.servers = tuple(servers)
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._api_key = api_key
        self.secrets = (api_key,) if api_key else ()  # hidden in every text a server sends back
        self._balancer = balancer
        self._breaker = breaker
        self._gave_up: str | None = None  # the breaker's message, once it opened
        self.notes = notes
        self._cond = threading.Condition()  # guards the balancer; wakes calls waiting for a server
        self._last_error = CallFailure("none recorded", retryable=True)  # the latest server fault
        self._connections = Connections(self.servers, timeout)
        self.watchdog = Watchdog()

    def wake(self) -> None:
        """Wake every call waiting for a server or between attempts (to see a cancellation)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        self.watchdog.stop()
        self._connections.close()

    def call(
        self, run: Run, path: str, data: bytes, parse: Parse[T], method: str = "POST"
    ) -> T | CallFailure | None:
        """One HTTP call with its retries, on whichever servers are up: what
        `parse` makes of the 200 body, why the call failed, or None if `run`
        was cancelled. `path` is below the base URL (`/completions`), or
        beside it (`/../tokenize`: vLLM's tokenizer routes, at the server's root)."""
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
                outcome = self._attempt(run, got, path, data, call_deadline, method)
                if outcome is None:
                    return None
                if isinstance(outcome, CallFailure):
                    healthy = False if outcome.server_fault else None
                    if not outcome.retryable:  # an answer over the cap: asking again would repeat it
                        return outcome
                    failure = outcome
                    failed_on.add(got)
                    continue
                healthy = outcome.status < 500
                if outcome.status == 200:
                    parsed = parse(outcome.body)
                    if not isinstance(parsed, Malformed) or malformed or attempt == self.retries:
                        if isinstance(parsed, Malformed) and attempts > 1:
                            return CallFailure(f"{parsed.message} (after {attempts} attempts)", False)
                        return parsed
                    malformed, failure = True, parsed
                    failed_on.add(got)
                    continue
                where = self.servers[got].url_of(path)
                message = redact(
                    f"HTTP {outcome.status} from {where}: {server_message(outcome.body)}", self.secrets
                )
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

    def put_out(self, index: int) -> None:
        """Server `index` was down when the provider started (see Balancer.put_out)."""
        with self._cond:
            self._balancer.put_out(index, time.monotonic())

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _attempt(
        self, run: Run, index: int, path: str, data: bytes, call_deadline: float | None, method: str
    ) -> Response | CallFailure | None:
        """One request to server `index`, cut off at the sooner of its own
        timeout and the call's deadline."""
        where = self.servers[index].url_of(path)
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
            self._connections,
            self.watchdog,
            run,
            index,
            path,
            data,
            self.headers(),
            deadline,
            timed_out,
            method,
        )
