"""The one loop that turns a batch of requests into journal rows.

Every generation a session asks for, a candidate's answers and an LLM
judge's verdicts alike, goes through `stream_into_journal`: the provider
streams, retries come in rounds (`execution.generate_events`), each answer
becomes a `gen` row (after the `request` row of its content) the moment it
arrives, each failed attempt a `fail` row, and the journal is committed
before every retry and at the end, including when the session is stopped.
The rows of results that arrive together (a provider call that returns a
list) go out in one write under one task lock (a group of `GROUP_ROWS` rows
at most, so a call of 20,000 answers does not hold every row at once); a
streamed result's, at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pytest_evalreplay.journal.recorder import GROUP_ROWS, TaskRecorder
from pytest_evalreplay.journal.rows import Failure, RolloutKey
from pytest_evalreplay.model import Generation, Provider, Request, RequestKey, request_content, request_digest
from pytest_evalreplay.run.context import ProgressSink, ProviderExit
from pytest_evalreplay.run.execution import Done, Failed, RoundEnd, generate_events
from pytest_evalreplay.settings import Settings


def stream_into_journal(
    recorder: TaskRecorder,
    provider: Provider,
    identity: tuple[str, Mapping[str, Any]],
    requests: Sequence[Request],
    settings: Settings,
    *,
    digest_of: Callable[[Request], str] = request_digest,
    content_of: Callable[[Request], Mapping[str, Any]] = request_content,
    journal_id: Callable[[Request], str] | None = None,
    prior: Mapping[RequestKey, int] | None = None,
    progress: ProgressSink | None = None,
    name: str | None = None,
    on_answer: Callable[[RolloutKey, Generation], None] | None = None,
    on_failure: Callable[[Failure], None] | None = None,
    settle: bool = True,
) -> None:
    """Generate `requests` into `recorder`'s journal. `identity` is the
    provider's digest and identity; `digest_of` names each request's content
    (a task passes the digests it rendered at collection) and `content_of`
    what its request row holds (an agent's turn: what it added to the turn
    before), `journal_id` the instance id its rows are keyed by when not the
    request's (an agent's turn: by what was sent, not when); `on_answer`
    sees each generation once its row is written, `on_failure` each final
    failure.
    `settle=False` leaves the end's fsync and index catch-up to the caller
    (an agent's turn batches: every row is already written, and fsynced
    within `files.SYNC_SECONDS`; the episode runner settles once at its end)."""
    pv, ident = identity
    progress = progress or ProgressSink()
    name = name or recorder.task
    recorder.add(recorder.provider_rows(pv, ident))
    progress.start(name, len(requests), sum(len(r.rollouts) for r in requests))
    done_requests = done_samples = failures = tokens = 0
    rows: list[dict[str, Any]] = []  # of results in hand together: one write, under one lock
    seen: list[Done | Failed] = []  # their events, told once their rows are written

    def write() -> None:
        recorder.add(rows)
        rows.clear()
        for event in seen:
            key_of = event.request.instance_id if journal_id is None else journal_id(event.request)
            if on_failure is not None and isinstance(event, Failed) and event.failure.final:
                on_failure(event.failure)
            if on_answer is not None and isinstance(event, Done):
                for rollout, gen in zip(event.request.rollouts, event.generations, strict=True):
                    on_answer((event.request.stage, key_of, rollout), gen)
        seen.clear()

    try:
        for event in generate_events(provider, requests, settings.max_attempts, prior, settings.timeout):
            if isinstance(event, RoundEnd):
                write()
                if event.retries:
                    recorder.flush()  # failed attempts are durable before any retry
                continue
            req = event.request
            rq = digest_of(req)
            iid = req.instance_id if journal_id is None else journal_id(req)
            rows.extend(recorder.request_rows(rq, content_of(req)))
            if isinstance(event, Done):
                for rollout, gen in zip(req.rollouts, event.generations, strict=True):
                    rows.append(recorder.gen((req.stage, iid, rollout), rq, pv, gen))
                    tokens += gen.completion_tokens or 0
                done_requests += 1
                done_samples += len(req.rollouts)
            elif isinstance(event, Failed):
                if iid != event.failure.instance_id:
                    event = Failed(req, replace(event.failure, instance_id=iid), event.together)
                rows.append(recorder.fail(event.failure, rq, pv))
                if event.failure.final:
                    failures += 1
                    done_requests += 1
            seen.append(event)
            if not event.together or len(rows) >= GROUP_ROWS:  # a large call in groups: memory stays flat
                write()
            progress.update(name, done_requests, done_samples, failures, tokens)
    except SystemExit as exc:
        raise ProviderExit(f"the provider raised SystemExit({exc.code!r}); stopping the session") from None
    finally:
        if rows:
            recorder.add(rows)  # what came back is kept, also when the session is stopped
        progress.end(name)
        if settle:
            recorder.flush()  # what arrived is kept, also when the session is stopped
