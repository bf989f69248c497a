"""The order a task's run dir rows are written in: one row per (stage,
instance), in instance order, then stage; its samples in rollout order.

A plain task's outcome lists its items in that order already (its plan's),
so they are read off as they come; any other order is grouped and sorted in
memory (at 100k items, some 30 MiB held at the session's end for that)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from pytest_evalreplay.journal.index import GenRef
from pytest_evalreplay.numbers.metrics import ItemOutcome

Saved = tuple[ItemOutcome, GenRef]  # an item with the generation it stands on


def saved_items(items: Iterable[ItemOutcome]) -> Iterator[Saved]:
    """The items whose generation the outcome stands on (what the run dir saves)."""
    return ((item, item.gen) for item in items if item.gen is not None and item.status != "missing")


def by_instance(items: Sequence[ItemOutcome], instance_order: Sequence[str]) -> Iterable[list[Saved]]:
    """The saved items, one list per (stage, instance), in the run dir's order
    (iterable more than once): read off `items` as they come when they are in
    that order, else sorted here."""
    if in_order(items, instance_order):
        return _Runs(items)
    order = {iid: i for i, iid in enumerate(instance_order)}
    groups: dict[tuple[int, str], list[Saved]] = {}
    for pair in saved_items(items):
        groups.setdefault(pair[0].key[:2], []).append(pair)
    keys = sorted(groups, key=lambda k: (order.get(k[1], len(order)), k[1], k[0]))
    return [sorted(groups[key], key=_rollout) for key in keys]


def in_order(items: Iterable[ItemOutcome], instance_order: Sequence[str]) -> bool:
    """Whether the saved items come instance by instance in `instance_order`,
    each instance's stages rising (so each (stage, instance) in one run).
    One pass, nothing kept."""
    position, last = -1, None
    for item, _ in saved_items(items):
        stage, iid = item.key[0], item.key[1]
        if last is not None and last[1] == iid:
            if stage < last[0]:
                return False
        else:
            try:
                position = instance_order.index(iid, position + 1)
            except ValueError:  # not in the order, or behind where the walk is
                return False
        last = (stage, iid)
    return True


def _rollout(pair: Saved) -> int:
    return pair[0].key[2]


class _Runs:
    """Each run of consecutive saved items of one (stage, instance), rollouts
    sorted: a fresh pass over the outcome's items each time it is iterated."""

    def __init__(self, items: Sequence[ItemOutcome]) -> None:
        self._items = items

    def __iter__(self) -> Iterator[list[Saved]]:
        run: list[Saved] = []
        for pair in saved_items(self._items):
            if run and run[0][0].key[:2] != pair[0].key[:2]:
                yield sorted(run, key=_rollout)
                run = []
            run.append(pair)
        if run:
            yield sorted(run, key=_rollout)
