"""pytest-xdist on one machine: a chunk's items go to one worker, the one
that generates the chunk, instead of every worker reaching the chunk at once
and all but one waiting on its lock.

The controller collects nothing: it knows node ids only, and a chunk is not
a function of a node id. Chunks are formed from what this run generates
(`planning.chunks` over the selected items the journal cannot answer, so a
`--resume` moves their edges), in groups of the batch size (which may be the
provider's, known once a worker has built it). So each worker, after
planning, reports one group number per collected item beside its collection
(every worker plans alike, from the same snapshot), and the controller's
scheduler groups by what the workers reported, the way xdist's `loadgroup`
groups by `xdist_group` marks; the other items go out in bundles of up to
`MAX_BUNDLE`. Where no worker reported a grouping (no eval item, no task
with enough chunks, a worker that said something else), it is xdist's
`load` scheduling unchanged.

Used only when `-n` is given without `--dist` (an explicit `--dist`, `load`
included, is xdist's own), and only for a plain task with at least
`MIN_CHUNKS_PER_WORKER` chunks per worker: with fewer, whole chunks on one
worker each would leave workers idle, where today's way (one worker
generates, the others wait and then score their share) keeps them busy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from xdist.scheduler import LoadScheduling, LoadScopeScheduling

from pytest_evalreplay.model import RequestKey

UNGROUPED = -1  # an item scheduled alone (a gate, a reused item, an EloEval's, another test)
MIN_CHUNKS_PER_WORKER = 2  # a task is grouped by chunk only with at least this many chunks per worker
_GROUP = "\x00evalreplay chunk "  # + group number: scopes no node id can be (pytest escapes NUL in ids)
_ALONE = "\x00evalreplay items "  # + bundle number
MAX_BUNDLE = 16  # ungrouped items per scope, at most (xdist's load sends a few per message too)


def chunk_groups(
    keys: Sequence[tuple[str, RequestKey] | None],
    chunk_of: Mapping[str, Mapping[RequestKey, int]],
    chunk_count: Mapping[str, int],
    workers: int,
) -> list[int]:
    """One group number per item (`keys`: an item's task and request, None
    for an item that is not a plain task's rollout): the items of one chunk
    of a task with enough chunks share a number, numbered in first-seen
    order; every other item is `UNGROUPED`."""
    numbers: dict[tuple[str, int], int] = {}
    out: list[int] = []
    enough = {task for task, count in chunk_count.items() if count >= MIN_CHUNKS_PER_WORKER * max(workers, 1)}
    for key in keys:
        chunk = chunk_of[key[0]].get(key[1]) if key is not None and key[0] in enough else None
        if key is None or chunk is None:
            out.append(UNGROUPED)
        else:
            out.append(numbers.setdefault((key[0], chunk), len(numbers)))
    return out


def agreed_groups(
    collection: Sequence[str], reported: Sequence[Sequence[int] | None], bundle: int = 1
) -> dict[str, str] | None:
    """The scope of each node id, when every worker reported the same
    grouping for this collection and it groups something; else None (xdist's
    `load` scheduling). A chunk is one scope; the other items go in scopes of
    up to `bundle` neighbours (none of them waits for another: bundling only
    saves the controller a message per item)."""
    if not reported or any(r is None or len(r) != len(collection) for r in reported):
        return None
    first = list(reported[0] or ())
    if any(list(r or ()) != first for r in reported[1:]) or all(g == UNGROUPED for g in first):
        return None
    scopes: dict[str, str] = {}
    alone = 0  # the ungrouped items met so far
    for nodeid, group in zip(collection, first, strict=True):
        if group == UNGROUPED:
            scopes[nodeid] = f"{_ALONE}{alone // max(bundle, 1)}"
            alone += 1
        else:
            scopes[nodeid] = f"{_GROUP}{group}"
    return scopes


class ChunkGroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with our scopes (a chunk's items are one work
    unit, in collection order), and without its two costs that grow with the
    square of the collection: a node id's position is looked up in a dict
    (not `list.index`), and a finished unit leaves its node's workload (which
    xdist sums over at every report)."""

    def __init__(self, config: pytest.Config, log: Any, scopes: Mapping[str, str]) -> None:
        super().__init__(config, log)
        self._scopes = scopes
        self._positions: dict[Any, dict[str, int]] = {}
        self._left: dict[Any, dict[str, int]] = {}  # node -> scope -> its items not yet reported

    def _split_scope(self, nodeid: str) -> str:
        return self._scopes.get(nodeid, nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        scope, unit = self.workqueue.popitem(last=False)
        self.assigned_work.setdefault(node, {})[scope] = unit
        positions = self._positions.get(node)
        if positions is None:
            positions = {nodeid: n for n, nodeid in enumerate(self.registered_collections[node])}
            self._positions[node] = positions
        todo = [positions[nodeid] for nodeid, done in unit.items() if not done]
        self._left.setdefault(node, {})[scope] = len(todo)
        node.send_runtest_some(todo)

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        nodeid = self.registered_collections[node][item_index]
        scope = self._split_scope(nodeid)
        self.assigned_work[node][scope][nodeid] = True
        left = self._left[node]
        left[scope] -= 1
        if left[scope] <= 0:
            del left[scope], self.assigned_work[node][scope]
        self._reschedule(node)

    def remove_node(self, node: Any) -> str | None:
        self._left.pop(node, None)
        return super().remove_node(node)


class ChunkScheduling:
    """The scheduler of an eval session under `-n` (xdist's Scheduling
    protocol). Until the collections are in, it is xdist's `load`;
    `schedule()` keeps that, or moves its nodes and collections to the chunk
    grouping when the workers reported one, and hands every later call on."""

    def __init__(self, config: pytest.Config, log: Any, reported: Mapping[str, Sequence[int] | None]) -> None:
        self._config = config
        self._log = log
        self._reported = reported  # worker id -> its groups, filled as collections arrive (distributed.py)
        self._load = LoadScheduling(config, log)
        self._chosen: Any = None
        self.grouped = False

    @property
    def _current(self) -> Any:
        return self._chosen if self._chosen is not None else self._load

    @property
    def nodes(self) -> list[Any]:
        return self._current.nodes

    @property
    def collection_is_completed(self) -> bool:
        return self._current.collection_is_completed

    @property
    def tests_finished(self) -> bool:
        return self._current.tests_finished

    @property
    def has_pending(self) -> bool:
        return self._current.has_pending

    def add_node(self, node: Any) -> None:
        self._current.add_node(node)

    def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
        self._current.add_node_collection(node, collection)

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        self._current.mark_test_complete(node, item_index, duration)

    def mark_test_pending(self, item: str) -> None:
        self._current.mark_test_pending(item)

    def remove_pending_tests_from_node(self, node: Any, indices: Sequence[int]) -> None:
        self._current.remove_pending_tests_from_node(node, indices)

    def remove_node(self, node: Any) -> str | None:
        return self._current.remove_node(node)

    def schedule(self) -> None:
        if self._chosen is None:
            self._chosen = self._choose()
        self._chosen.schedule()

    def _choose(self) -> Any:
        collections = self._load.node2collection
        nodes = [node for node in self._load.nodes if node in collections]
        if not nodes:
            return self._load
        collection = collections[nodes[0]]
        bundle = max(1, min(MAX_BUNDLE, len(collection) // (4 * len(nodes))))
        reported = [self._reported.get(str(node.gateway.id)) for node in nodes]
        scopes = agreed_groups(collection, reported, bundle)
        if scopes is None:
            return self._load
        grouped = ChunkGroupScheduling(self._config, self._log, scopes)
        for node in self._load.nodes:
            grouped.add_node(node)
            if node in collections:
                grouped.add_node_collection(node, collections[node])
        self.grouped = True
        return grouped
