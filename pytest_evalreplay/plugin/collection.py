"""The collection's end: the eval items gathered, their tasks planned, the
selection applied in pytest's own way (deselected items are reported through
`pytest_deselected`, as -k and --lf do), and the collection line that says
what will run, be reused or replayed.

What is deselected and in which order is decided by `run/selection.py` over
plain `Entry` values; this module turns pytest items into entries and back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_evalreplay.run.selection import Entry
    from pytest_evalreplay.run.session import EvalSession
    from pytest_evalreplay.settings import Settings


@dataclass
class Planned:
    """What planning decided, kept for the collection line and the end."""

    deselected_all: bool = False
    deselected: int = 0  # reused items deselected (the rest of the reused run, reported skipped)
    unplanned: int = 0  # tasks collected by --collect-only with no provider chosen
    shard_lines: list[str] = field(default_factory=list)

    def drop(self, config: pytest.Config, items: list[pytest.Item], dropped: list[pytest.Item]) -> None:
        """Deselect `dropped` (pytest's own way: -k, --lf and the terminal count them)."""
        if dropped:
            self.deselected_all = len(dropped) == len(items)
            config.hook.pytest_deselected(items=dropped)
            ids = {id(i) for i in dropped}
            items[:] = [i for i in items if id(i) not in ids]


def plan(
    planned: Planned,
    config: pytest.Config,
    items: list[pytest.Item],
    settings: Settings,
    session: Callable[[], EvalSession],
) -> None:
    """Gather the eval items, plan their tasks, and apply the selection.
    `session` builds the eval session on first use: a run without eval
    items never builds one."""
    from pytest_evalreplay.plugin.items import TaskItem
    from pytest_evalreplay.run import selection

    eval_items = [item for item in items if isinstance(item, TaskItem)]
    if not eval_items:
        return
    tasks: dict[str, tuple[Any, list[tuple[int, str, int]]]] = {}
    for item in eval_items:
        entry = tasks.setdefault(item.task.name, (item.task, []))
        if entry[0] is not item.task:
            raise pytest.UsageError(
                f"two different tasks are named {item.task.name!r} ({item.nodeid}); task names must "
                "be unique in a session (they name run dir files)"
            )
        if (key := entry_of(item).key) is not None:
            entry[1].append(key)
    opts = selection.Options(
        resume=settings.resume,
        report_reused=settings.report_reused,
        no_generate=settings.no_generate,
        collect_only=bool(config.option.collectonly),
        serial=not hasattr(config, "workerinput"),
        replay=settings.provider == "replay",
    )
    shard = settings.shard
    if shard is not None:  # every shard collects every item; the others' are deselected
        entries = [entry_of(i) for i in items]
        planned.shard_lines = selection.shard_lines(shard, entries)
        planned.drop(config, items, [items[n] for n in selection.not_this_shard(shard, entries)])
        for name, (_, keys) in tasks.items():
            keys[:] = selection.owned(shard, name, keys)
    if opts.collect_only and settings.provider is None:
        planned.unplanned = len(tasks)  # reuse is by provider: without one there is nothing to plan
        return
    from pytest_evalreplay.model import EvalReplayError

    ev = session()
    try:
        ev.register(list(tasks.values()), collect_only=opts.collect_only)
        done = ev.rescore_reused() if opts.rescores_reused else {}
    except EvalReplayError as exc:
        raise pytest.UsageError(str(exc)) from None
    reused = {(name, key) for name, keys in done.items() for key in keys} if opts.deselects_reused else set()
    held = ev.hold_back() if opts.holds_back else {}
    waiting = {(run.name, key) for run in ev.runs.values() for key in run.waiting}
    chosen = selection.select([entry_of(i) for i in items], held, waiting, reused)
    ordered = list(items)
    for group in chosen.drops:
        planned.drop(config, items, [ordered[n] for n in group])
    if chosen.reused:
        planned.deselected = chosen.reused
    planned.shard_lines += chosen.lines
    items[:] = [ordered[n] for n in chosen.order]


def collection_lines(planned: Planned, ev: EvalSession | None) -> list[str] | None:
    """What the collection line says; an xdist worker hands it to its
    controller (which collects nothing: see distributed.py)."""
    if not planned.unplanned and (ev is None or not ev.runs):
        return None
    from pytest_evalreplay.report.summary import plural

    if planned.unplanned or ev is None:
        return [
            f"evalreplay: {plural(planned.unplanned, 'task')}, not planned: no provider chosen "
            "(what would run or be reused depends on it)"
        ]
    runs = ev.runs.values()
    run = sum(len(r.decisions.run) for r in runs)
    reused = sum(len(r.decisions.reuse) for r in runs)
    replayed = sum(len(r.replayed) for r in runs)
    failed = sum(len(r.decisions.failed) for r in runs)
    parts = [plural(len(ev.runs), "task"), f"{run:,} to run"]
    if reused:
        gone = planned.deselected
        if gone >= reused:
            how = "deselected"
        elif gone == 0:
            how = "reported skipped"
        else:  # an EloEval's reused items beside a task's
            how = f"{gone:,} deselected, {reused - gone:,} reported skipped"
        if reused > replayed:
            parts.append(f"{reused - replayed:,} reused from the journal ({how})")
        if replayed:
            parts.append(f"{replayed:,} replayed from the saved run ({how})")
    if failed:
        parts.append(f"{failed:,} failed for good before")
    status = [*planned.shard_lines, *ev.status()]
    return ["evalreplay: " + ", ".join(parts), *(f"evalreplay: {line}" for line in status)]


def entry_of(item: pytest.Item) -> Entry:
    """An item as the selection sees it (`run/selection.py`)."""
    from pytest_evalreplay.plugin.items import GateItem, RolloutItem
    from pytest_evalreplay.run.selection import Entry

    if isinstance(item, RolloutItem):
        return Entry(item.task.name, item.key)
    if isinstance(item, GateItem):
        return Entry(item.task.name, gate=True)
    return Entry()
