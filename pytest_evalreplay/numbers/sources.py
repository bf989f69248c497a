"""Where one request's answer comes from: the journal, the saved run, or the provider.

One chain for a plain rollout (`planning.decide`, and a run's own rows in
`run/rollouts.py`) and for an agent's model turn or tool call
(`run/episodes.py`), so both follow the rules docs/resume.md, docs/agents.md
and docs/replay.md give:

- the journal's rows of exactly this request and provider configuration
  count when this run wrote them (an earlier chunk's, an xdist peer's), and
  an earlier run's only under `--resume`: a run without it asks again for
  everything it runs;
- of the rows that count the newest stands: its generation answers
  (`JOURNAL`) unless a newer failure overrides it; a standing failure that
  is final under this run's attempt cap is the answer (`FAILED`);
- otherwise a replay (`--evalreplay-predictions`) answers from the saved run
  (`SAVED`: the replay provider for a rollout, the transcripts for a turn)
  and any other run asks the provider or runs the tool (`LIVE`).

A replay's rollouts are journaled under the replay provider's identity (the
predictions path and its files), so a resumed replay reuses them as any run's;
an agent's turns under replay are never journaled (the saved run holds
them), so they always come from the saved run.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pytest_evalreplay.journal.index import FailRef, GenRef
from pytest_evalreplay.journal.rows import Failure


class Source(enum.Enum):
    JOURNAL = "journal"
    FAILED = "failed"
    SAVED = "saved"
    LIVE = "live"


@dataclass(frozen=True)
class Mode:
    """What a session is: whose rows count, whether it replays, its attempt cap."""

    run: str | None  # this run's id (None: the journal as the session found it, before it wrote)
    resume: bool
    replay: bool
    max_attempts: int


@dataclass(frozen=True)
class Answer:
    """Where a request's answer comes from, with the rows that say so: the
    generation that answers (`JOURNAL`), the standing failure (`FAILED`), or
    for `SAVED` and `LIVE` the newest failure that counts (whose attempts a
    retry continues), if any."""

    source: Source
    gen: GenRef | None = None
    fail: FailRef | None = None


def is_final(failure: Failure, max_attempts: int) -> bool:
    """Whether a recorded failure is not to be tried again under this run's cap:
    terminal, scoring and judging failures are; a retryable one is once it has
    used up `max_attempts` attempts (so raising the cap retries it)."""
    if failure.failure_class == "retryable":
        return failure.attempt >= max_attempts
    return True


def counts(mode: Mode, run: str) -> bool:
    """Whether a journal row written by `run` may answer in this session."""
    return mode.resume or run == mode.run


def answer_source(mode: Mode, gen: GenRef | None, fail: FailRef | None) -> Answer:
    """Where the answer comes from, given the journal's newest generation and
    newest failure of exactly this request and provider (either may be None).
    Only the newest of each is needed: this run's rows follow every earlier
    run's in the journal, so when the newest does not count none does."""
    if gen is not None and not counts(mode, gen.run):
        gen = None
    if fail is not None and not counts(mode, fail.run):
        fail = None
    if gen is not None and (fail is None or fail.seq < gen.seq):
        return Answer(Source.JOURNAL, gen=gen)
    if fail is not None and is_final(fail.failure, mode.max_attempts):
        return Answer(Source.FAILED, fail=fail)
    return Answer(Source.SAVED if mode.replay else Source.LIVE, fail=fail)
