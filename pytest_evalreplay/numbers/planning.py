"""What a session does with each selected item: reuse, run, or report failed.

Pure decisions over a task's plan (the requests rendered now) and its journal
index. Reuse is decided by content, never by code identity: a rollout is
reused only when the journal holds a generation of a byte-identical request
(context, system prompt, request type, sampling, images, tools; the rollout
index is the key) made by the same provider configuration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pytest_evalreplay.journal.index import FailRef, GenRef, JournalIndex
from pytest_evalreplay.journal.rows import RolloutKey
from pytest_evalreplay.model import RequestKey
from pytest_evalreplay.numbers import sources
from pytest_evalreplay.numbers.passk import SampleMetric

NOTE_LIMIT = 5  # per kind of note, per task


@dataclass(frozen=True)
class TaskPlan:
    """A task as collected now: every item key, in collection order, and the
    digest of each (stage, instance)'s request as it renders now."""

    task: str
    keys: tuple[RolloutKey, ...]
    requests: Mapping[RequestKey, str]
    provider: str  # digest of the provider configuration
    sample_metrics: tuple[SampleMetric, ...] = ()  # pass@k / maj@k over each instance's samples

    def request_of(self, key: RolloutKey) -> str:
        return self.requests[(key[0], key[1])]


@dataclass
class Decisions:
    """One task's selected items, sorted by what this session does with them."""

    reuse: dict[RolloutKey, GenRef] = field(default_factory=dict)
    run: list[RolloutKey] = field(default_factory=list)
    failed: dict[RolloutKey, FailRef] = field(default_factory=dict)
    prior_attempts: dict[RequestKey, int] = field(default_factory=dict)
    changed_request: int = 0  # run again because the journal's request differs from today's
    changed_provider: int = 0  # run again because another provider configuration made it


def decide(
    plan: TaskPlan,
    selected: Iterable[RolloutKey],
    index: JournalIndex | None,
    resume: bool,
    max_attempts: int,
) -> Decisions:
    """Sort the selected keys by where each one's answer comes from
    (`sources.answer_source`, over the journal as the session found it).
    Without `resume` (or without a journal) no row counts and every selected
    key runs, its earlier attempts forgotten; with it, a key is reused,
    reported failed (its final failure is newer than any generation), or run,
    continuing its attempt count."""
    out = Decisions()
    if index is None:
        out.run = list(selected)
        return out
    # run=None: no row of this run is in the journal yet; a replay's keys run as any
    # other's (the replay provider answers them from the saved run).
    mode = sources.Mode(run=None, resume=resume, replay=False, max_attempts=max_attempts)
    for key in selected:
        rq = plan.request_of(key)
        answer = sources.answer_source(
            mode, index.latest_gen(key, rq, plan.provider), index.latest_fail(key, rq, plan.provider)
        )
        fail = answer.fail
        if answer.source is sources.Source.JOURNAL and answer.gen is not None:
            out.reuse[key] = answer.gen
            continue
        if answer.source is sources.Source.FAILED and fail is not None:
            out.failed[key] = fail
            continue
        out.run.append(key)
        if fail is not None:
            rk = (key[0], key[1])
            out.prior_attempts[rk] = max(out.prior_attempts.get(rk, 0), fail.failure.attempt)
        elif resume and key in index.gens:
            if any(ref.provider == plan.provider for ref in index.gens[key]):
                out.changed_request += 1
            else:
                out.changed_provider += 1
    return out


def resumable(plan: TaskPlan, selected: Iterable[RolloutKey], index: JournalIndex, max_attempts: int) -> int:
    """How many selected items `--resume` would reuse, when the journal holds
    an unfinished run (some selected item has neither a generation nor a final
    failure); 0 when it holds none or all of them. A plain run's header says so."""
    decisions = decide(plan, selected, index, True, max_attempts)
    return len(decisions.reuse) if decisions.run else 0


def resumable_line(task: str, count: int) -> str | None:
    """The collection line for `resumable`'s count (None when there is nothing to say)."""
    if not count:
        return None
    return f"{task}: the output dir holds an unfinished run: --resume would reuse {count:,} results"


def foreign_rows(plan: TaskPlan, index: JournalIndex) -> list[str]:
    """Notes naming file:line for journal rows whose key is not one of the
    task's items (an unknown instance, rollout 7 of 2, stage -3): they are
    ignored, never counted."""
    known = set(plan.keys)
    bad: list[tuple[int, RolloutKey]] = []
    for key, refs in index.gens.items():
        if key not in known:
            bad.extend((ref.lineno, key) for ref in refs)
    for key, frefs in index.fails.items():
        if key not in known:
            bad.extend((ref.lineno, key) for ref in frefs)
    if not bad:
        return []
    bad.sort()
    shown = ", ".join(f"{index.path}:{line} ({_name(key)})" for line, key in bad[:NOTE_LIMIT])
    more = f" and {len(bad) - NOTE_LIMIT} more" if len(bad) > NOTE_LIMIT else ""
    return [f"{plan.task}: ignored journal rows for items the task does not have: {shown}{more}"]


def _name(key: RolloutKey) -> str:
    return f"{key[1]}[s{key[0]}-r{key[2]}]"


def chunks(keys: Sequence[RolloutKey], size: int | None, by_stage: bool = False) -> list[list[RequestKey]]:
    """Group keys into requests (one per stage and instance, in first-seen
    order) and the requests into chunks of at most `size` (None: one chunk).
    `by_stage`: no chunk holds two stages' requests (an ELO stage is planned
    from the rating before it, so its requests wait for that plan)."""
    order: dict[RequestKey, None] = {}
    for stage, iid, _ in keys:
        order.setdefault((stage, iid), None)
    groups: dict[int, list[RequestKey]] = {}
    for rk in order:
        groups.setdefault(rk[0] if by_stage else 0, []).append(rk)
    out: list[list[RequestKey]] = []
    for requests in groups.values():
        step = size or len(requests)
        out.extend(requests[i : i + step] for i in range(0, len(requests), step))
    return out
