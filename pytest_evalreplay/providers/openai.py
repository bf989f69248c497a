"""The `openai` provider: any OpenAI-compatible HTTP server (`vllm serve`, ...).

Standard library only. Text contexts go to `/completions`, chat contexts to
`/chat/completions`; up to `concurrency` requests are in flight at once, each
thread keeping its own keep-alive connection. Connection errors, timeouts,
5xx, 408 and 429 are retried with exponential backoff; when the retries run
out the request is a retryable `GenerationError` (the plugin tries again up
to --evalreplay-max-attempts). Any other 4xx is final at once and carries the
server's message.

The API key comes from $EVALREPLAY_API_KEY, else $OPENAI_API_KEY, and is sent
only as an `Authorization: Bearer` header: it never appears on the command
line, in the manifest, the journal or any error message.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import random
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
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
from pytest_evalreplay.options import DEFAULT_CONCURRENCY, Settings
from pytest_evalreplay.providers.engine_requests import (
    GREEDY_EPS,
    Draw,
    chat_messages,
    key_hint,
    plan_draws,
    text_prompt,
    unsupported,
)

API_KEY_ENV = ("EVALREPLAY_API_KEY", "OPENAI_API_KEY")

# Body fields the provider sets itself; a task's sampling may not.
_RESERVED = frozenset({"n", "model", "prompt", "messages", "stream", "echo", "best_of"})
_RETRY_STATUS = frozenset({408, 429})


def from_settings(settings: Settings) -> OpenAIProvider:
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
    return OpenAIProvider(settings.base_urls[0], settings.model, concurrency=settings.concurrency)


def api_key_from_env() -> str | None:
    for name in API_KEY_ENV:
        value = os.environ.get(name)
        if value:
            return value
    return None


@dataclass(frozen=True)
class _Failure:
    """Why one HTTP call failed for good."""

    message: str
    retryable: bool


class OpenAIProvider:
    """Generates through an OpenAI-compatible server (see the module docstring).

    `base_url` is what the OpenAI SDK takes (`http://host:8000/v1`); a URL
    with no path gets `/v1`. `timeout` is the socket timeout in seconds for
    each attempt; `retries` the extra attempts per HTTP call, waiting
    `backoff * 2**k` seconds (with jitter, at most `max_backoff`, or what a
    Retry-After header asks, within the same cap) before retry k.
    """

    kind = "openai"
    batch_size: int | None = None

    def __init__(
        self,
        base_url: str,
        model: str,
        concurrency: int = DEFAULT_CONCURRENCY,
        timeout: float = 600.0,
        retries: int = 4,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        api_key: str | None = None,
    ) -> None:
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EvalReplayError(
                f"--evalreplay-base-url must be an http(s) URL such as "
                f"http://127.0.0.1:8000/v1, got {base_url!r}"
            )
        if concurrency < 1:
            raise EvalReplayError(f"concurrency must be >= 1, got {concurrency}")
        self.model = model
        self.base_url = base_url
        self.concurrency = concurrency
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path or "/v1"
        self._api_key = api_key if api_key is not None else api_key_from_env()
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._connections: list[http.client.HTTPConnection] = []

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAIProvider(base_url={self.base_url!r}, model={self.model!r})"

    def __enter__(self) -> OpenAIProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker threads and close their connections."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            conns, self._connections = self._connections, []
        for conn in conns:
            conn.close()

    def _abort_connections(self) -> None:
        """Unblock worker threads waiting on a response (shutdown wakes recv)."""
        with self._lock:
            conns = list(self._connections)
        for conn in conns:
            sock = conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    # -- batch -----------------------------------------------------------------

    def generate(self, requests: list[Request]) -> list[GenerateResult]:
        results: list[GenerateResult | None] = [None] * len(requests)
        calls: list[tuple[int, Draw, Future[list[Generation] | _Failure]]] = []
        pool = self._executor()
        try:
            for i, request in enumerate(requests):
                error = unsupported(request, self.kind)
                if error is None:
                    try:
                        path, body, draws = self._plan(request)
                    except ValueError as exc:
                        error = GenerationError(str(exc), retryable=False)
                if error is not None:
                    results[i] = error
                    continue
                for draw in draws:
                    calls.append((i, draw, pool.submit(self._call, path, body, draw)))
            gathered: dict[int, list[Generation]] = {}
            for i, _draw, future in calls:
                try:
                    outcome = future.result()
                except Exception as exc:  # a bug in one call fails its request only
                    outcome = _Failure(f"openai provider: {type(exc).__name__}: {exc}", False)
                if isinstance(results[i], GenerationError):
                    continue
                if isinstance(outcome, _Failure):
                    results[i] = GenerationError(outcome.message, retryable=outcome.retryable)
                else:
                    gathered.setdefault(i, []).extend(outcome)
        except BaseException:  # an interrupt: stop what is in flight, fast
            for _, _, future in calls:
                future.cancel()
            self._abort_connections()
            raise
        for i, gens in gathered.items():
            if results[i] is None:
                results[i] = gens
        return [r if r is not None else GenerationError("no result", retryable=True) for r in results]

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="evalreplay-openai")
        return self._pool

    def _plan(self, request: Request) -> tuple[str, dict[str, Any], list[Draw]]:
        """Endpoint, body without n/seed, and draws. ValueError on bad sampling."""
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
            return f"{self._prefix}/completions", body, draws
        body["messages"] = chat_messages(request.context, request.system_prompt)
        return f"{self._prefix}/chat/completions", body, draws

    # -- one HTTP call, retried ---------------------------------------------------

    def _call(self, path: str, body: Mapping[str, Any], draw: Draw) -> list[Generation] | _Failure:
        payload = dict(body)
        if draw.n != 1:
            payload["n"] = draw.n
        if draw.seed is not None:
            payload["seed"] = draw.seed
        data = orjson.dumps(payload)
        failure = _Failure("not attempted", retryable=True)
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self._delay(attempt, failure))
            status, headers, raw, error = self._post(path, data)
            if error is not None:
                failure = error
                continue
            if status == 200:
                return _parse(raw, draw.n, chat=path.endswith("/chat/completions"))
            message = f"HTTP {status} from {path}: {_server_message(raw)}"
            retry_after = _retry_after(headers.get("retry-after"))
            failure = _Failure(message, retryable=status >= 500 or status in _RETRY_STATUS)
            if not failure.retryable:
                return failure
            if retry_after is not None:
                failure = _RetryAfter(message, True, retry_after)
        return _Failure(f"{failure.message} (after {self.retries + 1} attempts)", retryable=True)

    def _delay(self, attempt: int, failure: _Failure) -> float:
        if isinstance(failure, _RetryAfter):
            return min(failure.seconds, self.max_backoff)
        base = min(self.backoff * 2 ** (attempt - 1), self.max_backoff)
        return base * (0.5 + random.random() / 2)

    def _post(self, path: str, data: bytes) -> tuple[int, Mapping[str, str], bytes, _Failure | None]:
        """One POST on this thread's connection. A keep-alive connection the
        server has closed meanwhile is reopened once without counting as a try."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        for fresh_retry in (False, True):
            conn, reused = self._connection()
            try:
                conn.request("POST", path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                resp_headers = {k.lower(): v for k, v in resp.getheaders()}
                if resp.will_close:
                    self._drop()
                return resp.status, resp_headers, raw, None
            except TimeoutError:
                self._drop()
                return 0, {}, b"", _Failure(f"timed out after {self.timeout:g} s on {path}", True)
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                if reused and not fresh_retry and isinstance(exc, _STALE):
                    continue
                what = type(exc).__name__
                return 0, {}, b"", _Failure(f"connection error on {path}: {what}: {exc}", True)
        raise AssertionError("unreachable")

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn, True
        if self._scheme == "https":
            conn = http.client.HTTPSConnection(
                self._host, self._port, timeout=self.timeout, context=ssl.create_default_context()
            )
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        self._local.conn = conn
        with self._lock:
            self._connections.append(conn)
        return conn, False

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()
            with self._lock:
                if conn in self._connections:
                    self._connections.remove(conn)


# What a server closing an idle keep-alive connection looks like.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


@dataclass(frozen=True)
class _RetryAfter(_Failure):
    seconds: float = 0.0


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
