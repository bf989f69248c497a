"""The openai provider's circuit breaker: when every server keeps failing,
give up on the session instead of retrying for an hour.

Retries, backoff and cool-downs ride out one bad server or a short outage,
but against servers that fail every POST they add up: 1 instance x 2
rollouts against an always-500 server took 1,384 s before the breaker. Here
the provider's attempts are counted across all its calls; once the breaker
opens it stays open for the provider's life, and every call still to come
fails at once with the breaker's one-line reason.

Pure bookkeeping over explicit times (the provider locks and passes `now`),
so the rule is tested without a network or a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Failed attempts in a row on every server (no success anywhere since) before
# the breaker may open: more than a brief overload takes (a few 503s, then an
# answer), far fewer than the dozens of attempts retries give a dead server.
GIVE_UP_FAILURES = 4
# Once some request has succeeded, how long every server may keep failing
# (a restart, a reload) before the provider gives up.
GIVE_UP_AFTER = 120.0


@dataclass
class Breaker:
    """Opens when every one of `n` servers has failed `failures` attempts in
    a row with no success anywhere since, and either no request has
    succeeded yet in the session (a server that fails from its first POST is
    misconfigured: give up within seconds) or none has for `give_up_after`
    seconds (a server that worked gets that long to come back).

    `record` takes what the balancer takes: True (the server answered,
    whatever the status below 500), False (a connection error, timeout or
    5xx) or None (cancelled: says nothing)."""

    n: int
    failures: int = GIVE_UP_FAILURES
    give_up_after: float = GIVE_UP_AFTER
    _streak: list[int] = field(init=False)
    _since: float | None = field(init=False, default=None)  # first failure since the last success
    _ever_ok: bool = field(init=False, default=False)
    _reason: str | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self._streak = [0] * self.n

    def record(self, server: int, now: float, healthy: bool | None) -> None:
        if healthy is None or self._reason is not None:
            return
        if healthy:
            self._ever_ok = True
            self._since = None
            self._streak = [0] * self.n
            return
        if self._since is None:
            self._since = now
        self._streak[server] += 1

    def reason(self, now: float) -> str | None:
        """Why the breaker is open, or None while it is closed."""
        if self._reason is None and self._since is not None and min(self._streak) >= self.failures:
            every = "the server" if self.n == 1 else "every server"
            in_a_row = f"{every} failed {self.failures} times in a row"
            if not self._ever_ok:
                self._reason = f"{in_a_row} and no request has succeeded since the session started"
            elif now - self._since >= self.give_up_after:
                self._reason = f"no request has succeeded for {self.give_up_after:g} s and {in_a_row}"
        return self._reason
