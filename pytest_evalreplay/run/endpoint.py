"""An OpenAI-compatible HTTP endpoint per episode, for agents written against any OpenAI client.

While an agent task runs, an episode that asks for `llm.base_url` gets its
own base URL on a server bound to 127.0.0.1 (an ephemeral port, started on
the first such ask, stopped when the task's episodes end). Each request is
one model turn of that episode, handed to the episode's `chat` (the same
call `llm.chat` makes: batched with the other episodes' turns, journaled,
answered from the journal on `--resume` or from the saved run on replay).
The handler thread blocks until the turn is answered, so a sync agent's
client blocks in its own thread and an async one awaits as usual.

Every request must carry the server's token (`Authorization: Bearer ...`,
`llm.api_key`): nothing else on the machine can spend the task's provider.
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from pytest_evalreplay.agent import TurnFailed
from pytest_evalreplay.model import EvalReplayError, Generation
from pytest_evalreplay.run import endpoint_wire as wire

HOST = "127.0.0.1"  # never another interface
# The most an agent's request body may be: it is read whole, then saved as the
# turn's request; a larger one is refused (413) without being read.
MAX_REQUEST_BYTES = 256 * 2**20


class Served(Protocol):
    """What the endpoint needs of an episode: one model turn, as `llm.chat` takes it."""

    def serve(
        self, messages: list[dict[str, Any]], tools: list[Any], sampling: dict[str, Any]
    ) -> Generation: ...


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a client that keeps its connection idle does not hold the stop
    # socketserver's 5 reset connections when 32 episodes connect at once on a busy machine.
    request_queue_size = 128
    endpoint: Endpoint


class Endpoint:
    """The server and the episodes it serves, each under `/e/<id>/v1`."""

    def __init__(self, model: str) -> None:
        self.model = model or "evalreplay"
        self.token = secrets.token_urlsafe(24)
        self._episodes: dict[str, Served] = {}
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._count = 0

    @property
    def address(self) -> tuple[str, int]:
        """Where the server listens (its socket's own name)."""
        assert self._server is not None
        return self._server.socket.getsockname()[:2]

    @property
    def port(self) -> int:
        return self.address[1]

    def open(self, episode: Served) -> str:
        """A new base URL (ending in /v1) for this episode; starts the server on first use."""
        with self._lock:
            if self._server is None:
                server = _Server((HOST, 0), _Handler)
                server.endpoint = self
                self._server = server
                self._thread = threading.Thread(
                    target=server.serve_forever,
                    kwargs={"poll_interval": 0.2},
                    name="evalreplay-endpoint",
                    daemon=True,
                )
                self._thread.start()
            self._count += 1
            eid = f"{self._count}-{secrets.token_hex(4)}"
            self._episodes[eid] = episode
            return f"http://{HOST}:{self.port}/e/{eid}/v1"

    def close(self, base_url: str) -> None:
        """The episode has ended: its URL answers 404 from now on."""
        eid = base_url.rsplit("/e/", 1)[-1].split("/", 1)[0]
        with self._lock:
            self._episodes.pop(eid, None)

    def episode(self, eid: str) -> Served | None:
        with self._lock:
            return self._episodes.get(eid)

    def track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            (self._connections.add if add else self._connections.discard)(conn)

    def stop(self) -> None:
        """Stop serving; connections still open are shut, so their handlers end."""
        with self._lock:
            server, self._server = self._server, None
            thread, self._thread = self._thread, None
            connections = list(self._connections)
            self._episodes.clear()
        if server is None:
            return
        server.shutdown()
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        server.server_close()
        if thread is not None:
            thread.join()


# The turns each POST path serves: (parse the body, answer it, answer it as events).
_ROUTES: dict[
    str, tuple[Callable[[bytes], wire.Turn], Callable[..., bytes], Callable[..., Iterable[bytes]]]
] = {
    "chat/completions": (wire.chat_turn, wire.chat_completion, wire.chat_events),
    "responses": (wire.responses_turn, wire.response, wire.response_events),
}


# A request's header block, as http.client limits it: a line, and how many lines.
MAX_HEADER_LINE = 65536
MAX_HEADERS = 100


class Headers(dict[str, str]):
    """A request's headers by lower-cased name (a repeated one: its last),
    read as `email.message.Message.get` reads them, the one way the handler
    and http.server use them."""

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(name.lower(), default)


def read_headers(lines: Iterable[bytes]) -> Headers | tuple[HTTPStatus, str]:
    """The header block from its lines (each with its line end, up to the
    empty line), or the status and reason it is refused with: the email
    package's parser, which http.server uses, took about 60 us a request
    here, most of the endpoint's own cost. A continuation line (obsolete
    folding) is joined to its header."""
    headers = Headers()
    name = None
    for count, line in enumerate(lines):
        if len(line) > MAX_HEADER_LINE:
            return HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long"
        if line in (b"\r\n", b"\n", b""):
            return headers
        if count >= MAX_HEADERS:
            return HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers"
        text = line.decode("iso-8859-1").rstrip("\r\n")
        if text[:1] in (" ", "\t") and name is not None:
            headers[name] += " " + text.strip()
            continue
        key, colon, value = text.partition(":")
        if not colon or not key or key != key.strip():
            return HTTPStatus.BAD_REQUEST, f"Bad header line ({text!r:.80})"
        name = key.lower()
        headers[name] = value.strip()
    return headers


_DATE: list[Any] = [None, ""]  # the second and its `Date` header (threads may race: each writes a right one)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the SDKs reuse one connection per client
    # Buffered: the headers and the body leave in one segment. Written apart, the
    # body waited for the client's delayed ACK of the headers (Nagle): 40 ms a turn.
    wbufsize = 1 << 16
    server: _Server

    def log_message(self, *args: Any) -> None:
        pass  # the session's output is pytest's

    def parse_request(self) -> bool:
        """http.server's, for HTTP/1.0 and 1.1 (what the clients speak), its
        header block read by `read_headers`."""
        self.command = None  # as http.server: set in case of an error on the first line
        self.request_version = self.default_request_version
        self.close_connection = True
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if len(words) != 3:
            self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request syntax ({self.requestline!r:.100})")
            return False
        command, path, version = words
        if version.startswith("HTTP/"):
            self.request_version = version  # the error below gets a status line
        if version not in ("HTTP/1.0", "HTTP/1.1"):
            self.send_error(
                HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"HTTP version {version!r:.40} (1.0 or 1.1)"
            )
            return False
        self.command, self.path, self.request_version = command, path, version
        self.close_connection = version == "HTTP/1.0"
        headers = read_headers(iter(lambda: self.rfile.readline(MAX_HEADER_LINE + 1), None))
        if isinstance(headers, tuple):
            self.send_error(*headers)
            return False
        self.headers = headers  # type: ignore[assignment]
        conntype = headers.get("Connection", "").lower()
        if conntype == "close":
            self.close_connection = True
        elif conntype == "keep-alive":
            self.close_connection = False
        if headers.get("Expect", "").lower() == "100-continue" and version == "HTTP/1.1":
            return self.handle_expect_100()
        return True

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The `Date` header, formatted once a second (http.server formats it for every response)."""
        if timestamp is not None:
            return super().date_time_string(timestamp)
        now = int(time.time())
        if _DATE[0] != now:
            _DATE[:] = [now, super().date_time_string(now)]
        return str(_DATE[1])

    def setup(self) -> None:
        super().setup()
        self.server.endpoint.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.endpoint.track(self.connection, False)

    def _send(
        self, code: int, body: bytes, kind: str = "application/json", extra: tuple[tuple[str, str], ...] = ()
    ) -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            for name, value in extra:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client went away (its own timeout): nothing to answer
            self.close_connection = True

    def _error(
        self, code: int, message: str, param: str | None = None, kind: str = "invalid_request_error"
    ) -> None:
        # x-should-retry: the openai SDK would otherwise retry some of these, each a new turn.
        self._send(code, wire.error_body(message, param, kind), extra=(("x-should-retry", "false"),))

    def _route(self) -> tuple[Served, str] | None:
        """The episode and the path under its /v1, or None once an error is sent."""
        endpoint = self.server.endpoint
        given = self.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {endpoint.token}".encode()):
            self._error(
                401,
                "missing or wrong API key: use llm.api_key (the endpoint's token)",
                kind="invalid_api_key",
            )
            return None
        parts = self.path.split("?", 1)[0].split("/", 4)
        if len(parts) < 5 or parts[1] != "e" or parts[3] != "v1":
            self._error(404, f"no such path {self.path!r:.80}; use llm.base_url", kind="not_found_error")
            return None
        episode = endpoint.episode(parts[2])
        if episode is None:
            self._error(
                404,
                "this episode has ended (or never was): its base URL serves no more turns",
                kind="not_found_error",
            )
            return None
        return episode, parts[4].rstrip("/")

    def do_GET(self) -> None:
        routed = self._route()
        if routed is None:
            return
        if routed[1] == "models":
            self._send(200, wire.models_body(self.server.endpoint.model))
        else:
            self._error(404, f"GET /v1/{routed[1]} is not served", kind="not_found_error")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_REQUEST_BYTES:
            self.close_connection = True  # its body stays unread
            self._error(
                413,
                f"a request body of {length:,} bytes, over the {MAX_REQUEST_BYTES:,} the evalreplay endpoint "
                "reads: send less (each turn's messages are saved with the run)",
                kind="request_too_large",
            )
            return
        raw = self.rfile.read(length) if length else b""
        routed = self._route()
        if routed is None:
            return
        episode, path = routed
        route = _ROUTES.get(path)
        if route is None:
            self._error(
                404,
                f"POST /v1/{path} is not served (chat/completions and responses are)",
                kind="not_found_error",
            )
            return
        parse, answer, events = route
        try:
            turn = parse(raw)
            gen = episode.serve(turn.messages, turn.tools, turn.sampling)
        except wire.WireError as exc:
            self._error(400, str(exc), exc.param)
            return
        except (TurnFailed, EvalReplayError) as exc:
            self._error(400, str(exc), kind="evalreplay_turn_failed")
            return
        ident, created = secrets.token_hex(12), int(time.time())
        if turn.stream:
            self._send(200, b"".join(events(gen, turn, ident, created)), "text/event-stream")
        else:
            self._send(200, answer(gen, turn, ident, created))
