"""The openai provider's balancer: several servers serving one model.

`Balancer` is pure bookkeeping (which server takes the next attempt, which
are out for a cool-down), so the spreading and cooling rules are tested
without a network or a clock; the provider holds the lock and the time.
"""

from __future__ import annotations

import itertools
import posixpath
from dataclasses import dataclass
from urllib.parse import urlsplit

from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.values.credentials import redact_url


@dataclass(frozen=True)
class Server:
    """One server's address; `url` is its normalized base URL, credentials
    hidden (`user:***@`): it names the server in every message. The
    credentials are not sent (the key goes in a Bearer header)."""

    url: str
    scheme: str
    host: str
    port: int | None
    prefix: str

    def path_of(self, path: str) -> str:
        """The request path of `path` below the base URL, dot segments
        resolved (`/../tokenize` beside `/v1` is `/tokenize`)."""
        return posixpath.normpath(self.prefix + path)

    def url_of(self, path: str) -> str:
        """`path`'s full URL, for messages."""
        return self.url[: len(self.url) - len(self.prefix)] + self.path_of(path)


def parse_server(base_url: str) -> Server:
    """The base URL the OpenAI SDK takes (`http://host:8000/v1`); no path means `/v1`."""
    parts = urlsplit(base_url.strip().rstrip("/"))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EvalReplayError(
            "--evalreplay-base-url must be an http(s) URL such as http://127.0.0.1:8000/v1, "
            f"got {redact_url(base_url)!r}"
        )
    try:
        port = parts.port
    except ValueError:
        raise EvalReplayError(f"--evalreplay-base-url {redact_url(base_url)!r} has an invalid port") from None
    prefix = parts.path or "/v1"
    url = redact_url(f"{parts.scheme}://{parts.netloc}{prefix}")
    return Server(url, parts.scheme, parts.hostname, port, prefix)


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

    def put_out(self, i: int, now: float) -> None:
        """Server `i` was down at the start: out for a cool-down, then tried on
        probation like a server that failed in the run."""
        h = self.health[i]
        h.out_until = now + min(self.cool_down * 2**h.level, self.max_cool_down)
        h.level += 1
        h.probation = True

    def back_at(self, now: float) -> float | None:
        """When the soonest server that is out comes back (None: none is out;
        only a probe in flight keeps the rest waiting)."""
        times = [h.out_until for h in self.health if h.out_until > now]
        return min(times) if times else None
