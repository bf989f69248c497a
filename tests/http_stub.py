"""A small OpenAI-compatible server for tests, in-process or as a subprocess.

In-process::

    with StubServer(model="m") as stub:
        provider = OpenAIProvider(stub.url, "m")
        stub.hold_if = lambda body: body.get("prompt") == "slow"   # keep those in flight
        ...
        assert stub.wait_until(lambda s: s.in_flight == 1)
        stub.release()

As a subprocess (the plugin-level tests kill pytest and resume against it)::

    python tests/http_stub.py --port 0 --model NAME --delay SECONDS --log FILE

prints the port it listens on as the first line of stdout, appends one JSON
line per answered request to FILE, and runs until SIGTERM or SIGINT.

Answers are deterministic: choice i of a request with prompt P and seed S has
the text `P|seed=S|i=i` (for chat, P is the last message's content), choices
are sent in reverse order (a client must order them by "index"), every
response carries `usage` (5 prompt tokens, 10 completion tokens in all) and a
`finish_reason` ("length" for completions, "stop" for chat).

A request is "answered" once the stub commits to sending a 200: its log line
is written (and reaches the file, unbuffered) before the answer is sent, so a
client that holds an answer always finds its line. A request whose client
goes away during `delay` (or while held) is not answered and not logged.
Standard library plus orjson (a dependency of the package) only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
from stub_logprobs import BOS, detokenize, echo_completion, token_ids

STUB_MODEL = "stub-model"  # the name the stub serves unless told another

PROMPT_TOKENS = 5
COMPLETION_TOKENS = 10
# How often a waiting handler looks at its client's socket and the stub's state.
_POLL = 0.02


def prompt_of(body: dict[str, Any]) -> Any:
    """What the request asks: the prompt string, or the chat messages."""
    return body["messages"] if "messages" in body else body.get("prompt")


def answer_text(body: dict[str, Any], i: int) -> str:
    prompt = body["messages"][-1]["content"] if "messages" in body else body.get("prompt")
    return f"{prompt}|seed={body.get('seed')}|i={i}"


def completion(body: dict[str, Any], bos: bool = False) -> dict[str, Any]:
    """The deterministic 200 answer to a completions or chat body. A chat body
    with `tools` whose last message is not a tool result is answered with a
    call of its first tool, `{"text": <the last message's content>}`. An echo
    completions body is answered as `vllm serve` does (stub_logprobs.py)."""
    if body.get("echo") and "messages" not in body:
        return echo_completion(body, bos)
    n = int(body.get("n", 1))
    chat = "messages" in body
    choices: list[dict[str, Any]] = []
    for i in range(n):
        text = answer_text(body, i)
        if chat and body.get("tools") and body["messages"][-1]["role"] != "tool":
            # As `vllm serve --enable-auto-tool-choice` answers: no content, a call of the first tool.
            name = body["tools"][0]["function"]["name"]
            arguments = json.dumps({"text": body["messages"][-1]["content"]})
            call = {
                "id": f"call-{len(body['messages'])}-{i}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            choices.append({"index": i, "finish_reason": "tool_calls", "message": message})
        elif chat:
            message = {"role": "assistant", "content": text}
            choices.append({"index": i, "finish_reason": "stop", "message": message})
        else:
            choices.append({"index": i, "finish_reason": "length", "text": text})
    choices.reverse()
    usage = {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": COMPLETION_TOKENS,
        "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
    }
    return {
        "id": "stub",
        "object": "chat.completion" if chat else "text_completion",
        "model": body.get("model"),
        "choices": choices,
        "usage": usage,
    }


# -- actions: what the stub does with one POST ------------------------------------------


class Action:
    """Handles one POST; `name` goes into the event log."""

    name = "action"

    def __call__(self, handler: _Handler, body: dict[str, Any]) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Answer(Action):
    """The deterministic answer, after the stub's `delay`."""

    name = "answer"

    def __call__(self, handler: _Handler, body: dict[str, Any]) -> None:
        stub = handler.stub
        if stub.delay > 0 and handler.wait(seconds=stub.delay) != "elapsed":
            return
        payload = completion(body, handler.stub.bos)
        stub._answered(handler.path, body)
        handler.reply(200, payload)


@dataclass(frozen=True)
class Fail(Action):
    """An HTTP error with an OpenAI-style error body."""

    status: int = 503
    message: str = "injected failure"
    headers: tuple[tuple[str, str], ...] = ()
    name = "fail"

    def __call__(self, handler: _Handler, body: dict[str, Any]) -> None:
        handler.stub._event("failed", handler.path, body, status=self.status)
        handler.reply(self.status, {"error": {"message": self.message, "code": self.status}}, self.headers)


@dataclass(frozen=True)
class Drop(Action):
    """Close the connection without a response."""

    name = "drop"

    def __call__(self, handler: _Handler, body: dict[str, Any]) -> None:
        handler.stub._event("dropped", handler.path, body)
        handler.close_connection = True


@dataclass(frozen=True)
class Hang(Action):
    """Never answer: keep the connection open until the client goes away or the stub stops."""

    name = "hang"

    def __call__(self, handler: _Handler, body: dict[str, Any]) -> None:
        handler.wait()
        handler.close_connection = True


@dataclass(frozen=True)
class Trickle(Action):
    """Answer one byte every `interval` seconds and never finish: in the body
    (headers promise a long body) or in the headers themselves."""

    interval: float = 0.05
    in_headers: bool = False
    name = "trickle"

    def __call__(self, handler: _Handler, body: dict[str, Any]) -> None:
        handler.close_connection = True
        if self.in_headers:
            first, rest = b"HTTP/1.1 200 OK\r\n", b"X-Slow: " + b"a" * 1_000_000
        else:
            first = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
            rest = b" " * 1_000_000
        try:
            handler.wfile.write(first)
            handler.wfile.flush()
            for i in range(len(rest)):
                if handler.wait(seconds=self.interval) != "elapsed":
                    return
                handler.wfile.write(rest[i : i + 1])
                handler.wfile.flush()
        except OSError:
            handler.stub._event("client_gone", handler.path, body)


@dataclass(frozen=True)
class Staggered(Action):
    """The deterministic answer after a delay drawn from [low, high) by the
    prompt's CRC32: a steady stream of answers rather than waves of
    `concurrency` answers landing together, as a real server's lengths make."""

    low: float = 0.05
    high: float = 0.35
    name = "answer"

    def __call__(self, handler: _Handler, body: dict[str, Any]) -> None:
        key = orjson.dumps(prompt_of(body), option=orjson.OPT_SORT_KEYS)
        seconds = self.low + (self.high - self.low) * (zlib.crc32(key) % 1000) / 1000
        if seconds > 0 and handler.wait(seconds=seconds) != "elapsed":
            return
        payload = completion(body, handler.stub.bos)
        handler.stub._answered(handler.path, body)
        handler.reply(200, payload)


ANSWER = Answer()


def readable(sock: socket.socket) -> bool:
    """Whether `sock` has data (or EOF, or a connection to accept) waiting:
    poll, not select, which fails for descriptors past 1024, as a long test
    process can reach."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


# -- the server ----------------------------------------------------------------------------


class StubServer:
    """An OpenAI-compatible server on 127.0.0.1 (see the module docstring).

    Knobs (plain attributes, change them at any time):
    - `model`: the name (or names) GET /v1/models lists;
    - `delay`: seconds each answer waits before it is sent;
    - `script`: actions the next POSTs take, in arrival order; then `default`;
    - `default`: the action once `script` is used up (`ANSWER`, `Hang()`, `Fail()`...);
    - `hold_if`: a predicate on the request body; matching POSTs wait, in
      flight, until `release()` (or their client goes away, or `stop()`);
    - `models_status`: the HTTP status GET /v1/models answers with (200);
    - `api_key`: when set, every request must carry `Authorization: Bearer <key>`;
    - `bos`: text prompts are tokenized with a start token first (stub_logprobs.py);
    - `tokenize`: whether POST /tokenize and /detokenize are served (True), as `vllm serve` does;
    - `max_model_len`: the context length `/tokenize` answers with (2048);
      `eos`: the end-of-text token `/tokenizer_info` names (None).

    What happened: `received`, `answered` (completions and chat POSTs),
    `tokenized` (/tokenize POSTs), `in_flight`, `peak_in_flight`, `requests`
    (path, lower-cased headers, body) and `events` (dicts with an "event" key:
    received, answered, failed, dropped, client_gone, closed, models). Wait
    for a state with `wait_until(predicate)` rather than sleeping.
    """

    def __init__(
        self,
        model: str | Sequence[str] = STUB_MODEL,
        *,
        delay: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
        log: str | Path | None = None,
    ) -> None:
        self.model: str | Sequence[str] = model
        self.delay = delay
        self.script: list[Action] = []
        self.default: Action = ANSWER
        self.hold_if: Callable[[dict[str, Any]], bool] | None = None
        self.models_status = 200
        self.api_key: str | None = None
        self.bos = False  # True: text prompts start with a start token, "<s>" (stub_logprobs.py)
        self.max_model_len = 2048  # what /tokenize says the model's context is
        self.eos: str | None = None  # the end-of-text token /tokenizer_info names
        self.tokenize = True  # False: no /tokenize or /detokenize (404), as a server without them
        self.tokenized = 0  # /tokenize calls answered
        self.received = 0
        self.answered = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.events: list[dict[str, Any]] = []
        self._host = host
        self._port = port
        self._log_path = Path(log) if log is not None else None
        self._log_fd: int | None = None
        self._cond = threading.Condition()
        self._stopped = threading.Event()
        self._connections: set[socket.socket] = set()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle --

    def start(self) -> StubServer:
        stub = self

        class Handler(_Handler):
            pass

        Handler.stub = stub
        server = ThreadingHTTPServer((self._host, self._port), Handler)
        server.daemon_threads = True
        if self._log_path is not None:
            self._log_fd = os.open(self._log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._server = server
        self._stopped.clear()
        self._thread = threading.Thread(
            target=server.serve_forever, args=(_POLL,), name="http-stub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every open connection (clients see a reset
        or EOF at once, new connections are refused). Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stopped.set()
        with self._cond:
            self._cond.notify_all()
            conns = list(self._connections)
        server.shutdown()
        server.server_close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join()
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None

    def __enter__(self) -> StubServer:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the stub is not running")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The base URL a client takes (`http://127.0.0.1:PORT/v1`)."""
        return f"http://{self._host}:{self.port}/v1"

    # -- observing --

    def release(self) -> None:
        """Let every held request go on, and hold no more."""
        with self._cond:
            self.hold_if = None
            self._cond.notify_all()

    def wait_until(self, predicate: Callable[[StubServer], bool], timeout: float = 60.0) -> bool:
        """Wait until `predicate(self)` holds (checked on every event); False
        if it still does not after `timeout`, a safety net against a hang."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self), timeout)

    def settle(self, quiet: float = 0.5, timeout: float = 60.0) -> bool:
        """Wait until what a killed client sent has been read and let go: no
        request in flight, no connection open or waiting to be accepted, and
        no new event for `quiet` seconds. On a loaded machine a request sent
        just before the kill can reach a handler thread (and be counted as
        received) well after it; counting the next run's requests from before
        that would charge it to the next run. False after `timeout`."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._cond:
                seen = len(self.events)
                busy = self.in_flight > 0 or bool(self._connections)
            server = self._server
            pending = server is not None and readable(server.socket)
            if not busy and not pending:
                with self._cond:
                    self._cond.wait_for(lambda n=seen: len(self.events) != n, quiet)
                    if len(self.events) == seen:
                        return True
            else:
                time.sleep(_POLL)
        return False

    def count(self, event: str) -> int:
        with self._cond:
            return sum(1 for e in self.events if e["event"] == event)

    def prompts(self, event: str = "answered") -> list[Any]:
        """The prompts of the requests with that event, in order."""
        with self._cond:
            return [e["prompt"] for e in self.events if e["event"] == event]

    def bodies(self) -> list[dict[str, Any]]:
        with self._cond:
            return [body for _, _, body in self.requests]

    # -- used by the handler --

    def _event(self, kind: str, path: str, body: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
        event: dict[str, Any] = {"event": kind, "path": path, **extra}
        if body is not None:
            event.update(prompt=prompt_of(body), seed=body.get("seed"), n=body.get("n", 1))
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()
        return event

    def _answered(self, path: str, body: dict[str, Any]) -> None:
        with self._cond:
            self.answered += 1
        event = self._event("answered", path, body, model=body.get("model"), port=self.port)
        if self._log_fd is not None:
            line = orjson.dumps({**event, "time": time.time()}) + b"\n"
            with self._cond:  # one whole line per write, never interleaved
                os.write(self._log_fd, line)

    def _served_models(self) -> list[str]:
        model = self.model
        return [model] if isinstance(model, str) else list(model)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as uvicorn (`vllm serve`) sets it: a reply is written as headers,
    # then body, and with Nagle on, a keep-alive client's delayed ACK of the headers
    # held each body back ~40 ms (lm-eval's 6,000 calls of mc_server_prompts.py: 217 s).
    disable_nagle_algorithm = True
    stub: StubServer

    def log_message(self, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.stub._cond:
            self.stub._connections.add(self.connection)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        with self.stub._cond:
            self.stub._connections.discard(self.connection)
        self.stub._event("closed", "", None)

    def reply(self, code: int, payload: Any, headers: Sequence[tuple[str, str]] = ()) -> None:
        data = orjson.dumps(payload)
        self.land()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in headers:
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def land(self) -> None:
        """The request is no longer in flight: called before its answer is sent,
        so a client holding an answer never finds it counted in `in_flight`."""
        if getattr(self, "_flying", False):
            self._flying = False
            with self.stub._cond:
                self.stub.in_flight -= 1
                self.stub._cond.notify_all()

    def client_gone(self) -> bool:
        """True once the client has closed its end (EOF on our socket)."""
        try:
            if not readable(self.connection):
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def wait(self, seconds: float | None = None, until: Callable[[], bool] | None = None) -> str:
        """Wait `seconds` (None: forever) or until `until()` holds, watching the
        client and the stub: "elapsed", "done", "gone" or "stopped"."""
        stub = self.stub
        end = None if seconds is None else time.monotonic() + seconds
        while True:
            if stub._stopped.is_set():
                return "stopped"
            if until is not None and until():
                return "done"
            if self.client_gone():
                stub._event("client_gone", self.path, None)
                self.close_connection = True
                return "gone"
            step = _POLL
            if end is not None:
                left = end - time.monotonic()
                if left <= 0:
                    return "elapsed"
                step = min(step, left)
            with stub._cond:
                stub._cond.wait(step)

    def _authorized(self) -> bool:
        key = self.stub.api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self.reply(401, {"error": {"message": "Invalid API key", "code": 401}})
        return False

    def do_GET(self) -> None:
        stub = self.stub
        if self.path.rstrip("/") in ("/health", "/v1/health"):
            self.reply(200, {"status": "ok"})
            return
        if not self._authorized():
            return
        if self.path.rstrip("/") == "/tokenizer_info":  # as vllm serve: lm-eval's remote tokenizer
            bos = "<s>" if stub.bos else None
            self.reply(200, {"eos_token": stub.eos, "bos_token": bos, "pad_token": None})
            return
        if self.path.rstrip("/") != "/v1/models":
            self.reply(404, {"error": {"message": f"no route {self.path}", "code": 404}})
            return
        stub._event("models", self.path, None)
        if stub.models_status != 200:
            self.reply(stub.models_status, {"error": {"message": "models unavailable", "code": 0}})
            return
        data = [{"id": m, "object": "model", "owned_by": "stub", "root": m} for m in stub._served_models()]
        self.reply(200, {"object": "list", "data": data})

    def do_POST(self) -> None:
        stub = self.stub
        length = self.headers.get("Content-Length")
        if length is None:
            self.reply(411, {"error": {"message": "Content-Length required", "code": 411}})
            self.close_connection = True
            return
        try:
            body = orjson.loads(self.rfile.read(int(length)))
        except (ValueError, orjson.JSONDecodeError):
            self.reply(400, {"error": {"message": "body is not JSON", "code": 400}})
            return
        if not self._authorized():
            return
        if self.path in ("/tokenize", "/detokenize") and isinstance(body, dict) and stub.tokenize:
            if self.path == "/tokenize":
                with stub._cond:
                    stub.tokenized += 1
                start = stub.bos and body.get("add_special_tokens", True)  # vllm serve's default
                tokens = token_ids(BOS) * start + token_ids(str(body.get("prompt", "")))
                self.reply(200, {"count": len(tokens), "max_model_len": stub.max_model_len, "tokens": tokens})
            else:
                self.reply(200, {"prompt": "".join(detokenize(list(body.get("tokens", []))))})
            return
        if self.path not in ("/v1/completions", "/v1/chat/completions") or not isinstance(body, dict):
            self.reply(404, {"error": {"message": f"no route {self.path}", "code": 404}})
            return
        with stub._cond:
            stub.received += 1
            stub.in_flight += 1
            stub.peak_in_flight = max(stub.peak_in_flight, stub.in_flight)
            stub.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            action = stub.script.pop(0) if stub.script else stub.default
        self._flying = True
        stub._event("received", self.path, body, action=action.name, client_port=self.client_address[1])
        try:
            hold = stub.hold_if
            if hold is not None and hold(body):
                outcome = self.wait(until=lambda: (h := stub.hold_if) is None or not h(body))
                if outcome != "done":
                    self.close_connection = True
                    return
            action(self, body)
        finally:
            self.land()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="OpenAI-compatible stub server for tests")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed on stdout)")
    parser.add_argument("--model", default=STUB_MODEL, help="the name GET /v1/models lists")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--log", type=Path, default=None, help="append one JSON line per answered request")
    args = parser.parse_args(argv)
    # Block the stop signals before any thread starts, so every thread inherits
    # the mask and sigwait below receives them.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    stub = StubServer(args.model, delay=args.delay, host=args.host, port=args.port, log=args.log).start()
    try:
        print(stub.port, flush=True)
        signal.sigwait(stop_signals)
    finally:
        stub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
