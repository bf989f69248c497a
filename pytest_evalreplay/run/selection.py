"""Which collected eval items run, and in what order: the selection policy
of a session, as pure functions over plain data.

The hooks (`plugin/collection.py`) describe each collected item as an `Entry`
(a rollout of a task, a task's gate, or anything else), call these, and
apply the answer to pytest's item list: deselection (pytest's own way, so
the terminal counts it) and order. Nothing here sees a pytest object, a file
or a lock, so each rule is tested directly (tests/test_selection.py):

- a shard (--evalreplay-shard) keeps its own rollouts; the other shards'
  and every gate (judged on the whole task, after the merge) are deselected;
- serial --resume deselects the reused items it rescored at collection
  (unless --evalreplay-report-reused), and so does a serial replay
  (--evalreplay-predictions) for the items the saved run answered;
- --evalreplay-no-generate deselects what needs generating, and the gate of
  each task it leaves incomplete;
- a shard's ELO stages that wait for the merge are deselected;
- each gate runs after its task's last rollout, whatever order others left.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from pytest_evalreplay.journal.rows import RolloutKey
from pytest_evalreplay.values.shard import Shard

TaskKey = tuple[str, RolloutKey]  # (task name, rollout key)


@dataclass(frozen=True)
class Entry:
    """One collected item as the selection sees it: a rollout (`task` and
    `key`), a task's gate (`task`, `gate`), or anything else (neither)."""

    task: str | None = None
    key: RolloutKey | None = None
    gate: bool = False

    @property
    def rollout(self) -> TaskKey | None:
        return None if self.task is None or self.key is None else (self.task, self.key)


@dataclass(frozen=True)
class Options:
    """The options the selection depends on."""

    resume: bool = False
    report_reused: bool = False
    no_generate: bool = False
    collect_only: bool = False
    serial: bool = True  # not an xdist worker
    replay: bool = False  # --evalreplay-predictions: the saved run answers at collection

    @property
    def rescores_reused(self) -> bool:
        """Serial --resume rescores the reused rollouts at collection; so does a
        serial replay, once the saved run has answered what is to run."""
        return self.serial and (self.resume or self.replay) and not self.collect_only

    @property
    def deselects_reused(self) -> bool:
        """... and deselects them, unless they are to be reported one by one."""
        return self.rescores_reused and not self.report_reused

    @property
    def holds_back(self) -> bool:
        """--evalreplay-no-generate takes what needs generating out of the run."""
        return self.no_generate and not self.collect_only


@dataclass(frozen=True)
class Selection:
    """What to deselect and how to order the rest, by index into the entries."""

    drops: tuple[tuple[int, ...], ...]  # each group deselected together, in this order
    reused: int  # how many items the reused group deselected
    order: tuple[int, ...]  # the kept entries, in the order they run
    lines: tuple[str, ...]  # what the collection report says of it


def not_this_shard(shard: Shard, entries: Sequence[Entry]) -> tuple[int, ...]:
    """Every gate (judged on the whole task, after the merge) and every other shard's rollout."""
    return tuple(
        n
        for n, e in enumerate(entries)
        if e.gate or (e.task is not None and e.key is not None and not shard.owns(e.task, e.key))
    )


def owned(shard: Shard | None, task: str, keys: Sequence[RolloutKey]) -> list[RolloutKey]:
    """The keys of `task` this run (this shard, or all without one) plans."""
    return list(keys) if shard is None else [key for key in keys if shard.owns(task, key)]


def shard_lines(shard: Shard, entries: Sequence[Entry]) -> list[str]:
    """Per task, how much of it this shard runs."""
    counts: dict[str, list[int]] = {}
    for e in entries:
        if e.task is not None and e.key is not None:
            count = counts.setdefault(e.task, [0, 0])
            count[0] += shard.owns(e.task, e.key)
            count[1] += 1
    return [
        f"shard {shard}: {mine:,} of {total:,} items of {name} (the rest deselected; gates are judged after "
        "the merge)"
        for name, (mine, total) in counts.items()
    ]


def select(
    entries: Sequence[Entry],
    held: Mapping[str, Sequence[RolloutKey]],
    waiting: Collection[TaskKey],
    reused: Collection[TaskKey],
) -> Selection:
    """After the tasks are planned: deselect what --evalreplay-no-generate
    holds back (`held`, per task; with the gate of each such task), the ELO
    stages a shard waits with (`waiting`), and the reused items (`reused`),
    each item in the first group that names it; then put each gate after
    its task's last rollout."""
    held_keys = {(name, key) for name, keys in held.items() for key in keys}
    gone: set[int] = set()
    drops: list[tuple[int, ...]] = []

    def drop(picks: Sequence[bool]) -> int:
        group = tuple(n for n, pick in enumerate(picks) if pick and n not in gone)
        if group:
            drops.append(group)
            gone.update(group)
        return len(group)

    drop([e.rollout in held_keys or (e.gate and e.task in held) for e in entries])
    drop([e.rollout is not None and e.rollout in waiting for e in entries])
    reused_count = drop([e.rollout is not None and e.rollout in reused for e in entries])
    kept = [n for n in range(len(entries)) if n not in gone]
    lines = tuple(
        f"{len(keys):,} items of {name} need generating (deselected: --evalreplay-no-generate): "
        "they stay missing, and its gate is not judged"
        for name, keys in held.items()
    )
    return Selection(tuple(drops), reused_count, gates_last(entries, kept), lines)


def gates_last(entries: Sequence[Entry], kept: Sequence[int]) -> tuple[int, ...]:
    """The kept entries in run order: as they are, each gate moved to just
    after its task's last rollout (a gate whose task has none, at the end)."""
    gates = [n for n in kept if entries[n].gate]
    if not gates:
        return tuple(kept)
    rest = [n for n in kept if not entries[n].gate]
    last = {entries[n].task: n for n in rest if entries[n].rollout is not None}
    pending = {entries[n].task: n for n in gates}
    ordered: list[int] = []
    for n in rest:
        ordered.append(n)
        e = entries[n]
        if e.rollout is not None and last.get(e.task) == n:
            gate = pending.pop(e.task, None)
            if gate is not None:
                ordered.append(gate)
    ordered.extend(pending.values())
    return tuple(ordered)
