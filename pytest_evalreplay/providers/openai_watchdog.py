"""The openai provider's watchdog: attempts that hang are cut off.

A socket timeout alone does not bound an HTTP attempt (it restarts with every
byte), and a blocked `recv` does not notice a cancelled stream. Here each
attempt in flight is a `Watch` on its socket; `Watchdog` aborts it at its
deadline and `Run` aborts a stream's attempts when the stream is closed, both
by shutting the socket down. `post` is one attempt on this thread's kept-alive
connection (`Connections`) under those rules; `get_models` the start-up check.
"""

from __future__ import annotations

import contextlib
import heapq
import http.client
import itertools
import socket
import ssl
import threading
import time
from collections.abc import Mapping, Sequence

from pytest_evalreplay.providers.openai_balancer import Server
from pytest_evalreplay.providers.openai_wire import CallFailure, ModelCheck, Response, check_model_list

# What a server closing an idle keep-alive connection looks like.
STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
# The most bytes of one answer read from a server, a chunk at a time: a larger
# body (a broken server or proxy) fails the attempt instead of filling memory.
MAX_BODY_BYTES = 256 * 2**20
BODY_CHUNK = 1 << 20


class BodyTooLarge(Exception):
    """A server's answer over MAX_BODY_BYTES; the message names the URL and the cap."""


def read_body(resp: http.client.HTTPResponse, where: str) -> bytes:
    """`resp`'s body, refused (BodyTooLarge) past the cap: at once when its
    Content-Length says so, else once that much has arrived."""
    cap = MAX_BODY_BYTES
    too_large = BodyTooLarge(
        f"the answer from {where} is over {cap:,} bytes, the most read from a server: not read "
        "(is that an OpenAI-compatible server, and max_tokens sensible?)"
    )
    declared = resp.getheader("Content-Length") or ""
    if declared.isdigit() and int(declared) > cap:
        resp.close()  # its file holds the socket open past the connection's close
        raise too_large
    parts: list[bytes] = []
    read = 0
    while chunk := resp.read(BODY_CHUNK):
        parts.append(chunk)
        read += len(chunk)
        if read > cap:
            resp.close()
            raise too_large
    return b"".join(parts)


class Watch:
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


class Watchdog:
    """One daemon thread that aborts attempts past their deadline.

    A socket timeout alone does not bound an attempt: it restarts with every
    byte, so a server that trickles bytes would hold a call forever."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Watch]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, watch: Watch) -> None:
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


class Run:
    """The calls of one stream: closing the stream cancels them all, and
    lets go every answer it holds (`hold`)."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self._lock = threading.Lock()
        self._watches: set[Watch] = set()
        self._held: set[threading.Event] = set()

    def hold(self) -> threading.Event:
        """An answer handed towards the stream's consumer: set once `release`d
        (the consumer took it back, its rows written), or when the run is cancelled."""
        taken = threading.Event()
        with self._lock:
            if self.cancelled.is_set():
                taken.set()
            else:
                self._held.add(taken)
        return taken

    def release(self, taken: threading.Event | None) -> None:
        if taken is not None:
            with self._lock:
                self._held.discard(taken)
            taken.set()

    def enter(self, watch: Watch) -> bool:
        with self._lock:
            if self.cancelled.is_set():
                return False
            self._watches.add(watch)
            return True

    def leave(self, watch: Watch) -> None:
        with self._lock:
            self._watches.discard(watch)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled.set()
            watches = list(self._watches)
            held, self._held = self._held, set()
        for taken in held:
            taken.set()
        for watch in watches:
            watch.abort("cancelled")


def connect_to(server: Server, timeout: float | None) -> http.client.HTTPConnection:
    """An unopened connection (it connects on first use)."""
    if server.scheme == "https":
        return http.client.HTTPSConnection(
            server.host, server.port, timeout=timeout, context=ssl.create_default_context()
        )
    return http.client.HTTPConnection(server.host, server.port, timeout=timeout)


class Connections:
    """Each worker thread's keep-alive connection to each server, all of
    which `close` closes at once."""

    def __init__(self, servers: Sequence[Server], timeout: float | None) -> None:
        self.servers = tuple(servers)
        self.timeout = timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()

    def get(self, index: int) -> http.client.HTTPConnection:
        conns: dict[int, http.client.HTTPConnection] | None = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        conn = conns.get(index)
        if conn is None:
            conn = conns[index] = connect_to(self.servers[index], self.timeout)
            with self._lock:
                self._open.add(conn)
        return conn

    def drop(self, index: int) -> None:
        conns: dict[int, http.client.HTTPConnection] = getattr(self._local, "conns", {})
        conn = conns.pop(index, None)
        if conn is not None:
            conn.close()
            with self._lock:
                self._open.discard(conn)

    def close(self) -> None:
        with self._lock:
            conns, self._open = self._open, set()
        for conn in conns:
            conn.close()


def post(
    conns: Connections,
    watchdog: Watchdog,
    run: Run,
    index: int,
    path: str,
    data: bytes,
    headers: Mapping[str, str],
    deadline: float | None,
    timed_out: CallFailure,
    method: str = "POST",
) -> Response | CallFailure | None:
    """One POST (or `method`) on this thread's connection to server `index`, cut off at
    `deadline` (answered with `timed_out`). A kept-alive connection the server
    has closed meanwhile is reopened once, within the same attempt. None: the
    run was cancelled."""
    server = conns.servers[index]
    where = server.url_of(path)
    for fresh_retry in (False, True):
        conn = conns.get(index)
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
            conns.drop(index)
            return timed_out
        except OSError as exc:
            conns.drop(index)
            return CallFailure(f"cannot connect to {server.url}: {type(exc).__name__}: {exc}", True, True)
        watch = Watch(conn.sock, deadline)
        if not run.enter(watch):
            return None
        if deadline is not None:
            watchdog.add(watch)
        try:
            conn.request(method, server.path_of(path), body=data, headers=dict(headers))
            resp = conn.getresponse()
            raw = read_body(resp, where)
            got = {k.lower(): v for k, v in resp.getheaders()}
        except BodyTooLarge as exc:
            conns.drop(index)  # the rest of the body is still on the connection
            return CallFailure(str(exc), retryable=False)  # the server is up: it answered
        except (OSError, http.client.HTTPException, ValueError) as exc:
            reason = watch.finish()
            conns.drop(index)
            if reason == "cancelled":
                return None
            if reason == "timeout" or isinstance(exc, TimeoutError):
                return timed_out
            if reused and not fresh_retry and isinstance(exc, STALE):
                continue
            what = f"{type(exc).__name__}: {exc}"
            return CallFailure(f"connection error on {where}: {what}", retryable=True, server_fault=True)
        finally:
            watch.finish()
            run.leave(watch)
        if watch.reason is not None:
            # Aborted while reading: what was read may be cut short (http.client
            # takes EOF inside the headers for their end), so it is no answer.
            conns.drop(index)
            return None if watch.reason == "cancelled" else timed_out
        if resp.will_close:
            conns.drop(index)
        return Response(resp.status, got, raw)
    raise AssertionError("unreachable")


def get_models(
    server: Server, watchdog: Watchdog, headers: Mapping[str, str], model: str, limit: float
) -> ModelCheck:
    """GET <base>/models on a fresh connection, cut off after `limit` s: whether
    `server` serves `model` (see `check_model_list`), or why it cannot be used."""
    conn = connect_to(server, limit)
    watch = Watch(None, time.monotonic() + limit)
    try:
        conn.connect()
        watch.sock = conn.sock
        watchdog.add(watch)
        conn.request("GET", f"{server.prefix}/models", headers=dict(headers))
        resp = conn.getresponse()
        raw = read_body(resp, f"{server.url}/models")
    except BodyTooLarge as exc:
        return ModelCheck(str(exc), down=True)
    except (OSError, http.client.HTTPException) as exc:
        if watch.finish() == "timeout" or isinstance(exc, TimeoutError):
            return ModelCheck(
                f"{server.url}: no answer to GET {server.prefix}/models within {limit:g} s", down=True
            )
        return ModelCheck(
            f"{server.url}: unreachable ({type(exc).__name__}: {exc}); "
            "is the server running, and is the URL right?",
            down=True,
        )
    finally:
        watch.finish()
        conn.close()
    return check_model_list(server.url, server.prefix, resp.status, raw, model)
