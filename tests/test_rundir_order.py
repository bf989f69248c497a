"""The run dir's row order (rundir/order.py): instance order, then stage, then
rollout; read off the outcome as it comes when it is in that order (a plain
task's plan order), and the same rows in the same order when it is not."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pytest_evalreplay.journal.index import GenRef
from pytest_evalreplay.numbers.metrics import ItemOutcome
from pytest_evalreplay.rundir.order import by_instance, in_order

ORDER = ["b", "a", "c", "d"]


def item(stage: int, iid: str, rollout: int, status: Any = "ok", gen: bool = True) -> ItemOutcome:
    ref = GenRef("rq", "pv", "r", 0, 1, 1, 1) if gen else None
    return ItemOutcome(key=(stage, iid, rollout), status=status, gen=ref)


def reference(items: list[ItemOutcome], order: list[str]) -> list[list[tuple[int, str, int]]]:
    """The order the writer sorted its rows in before rundir/order.py."""
    position = {iid: i for i, iid in enumerate(order)}
    groups: dict[tuple[int, str], list[tuple[int, str, int]]] = {}
    for i in items:
        if i.gen is not None and i.status != "missing":
            groups.setdefault(i.key[:2], []).append(i.key)
    keys = sorted(groups, key=lambda k: (position.get(k[1], len(position)), k[1], k[0]))
    return [sorted(groups[k], key=lambda key: key[2]) for k in keys]


def keys(groups: Any) -> list[list[tuple[int, str, int]]]:
    return [[i.key for i, _ in group] for group in groups]


def test_a_plain_tasks_plan_order_is_read_as_it_comes() -> None:
    items = [item(1, iid, r) for iid in ORDER for r in (1, 0)]
    items.append(item(1, "c", 2, status="missing"))
    assert in_order(items, ORDER)
    assert not isinstance(by_instance(items, ORDER), list)
    assert keys(by_instance(items, ORDER)) == reference(items, ORDER)
    assert keys(by_instance(items, ORDER)) == keys(by_instance(items, ORDER))  # iterable again


def test_stage_major_or_unknown_instances_are_sorted() -> None:
    stage_major = [item(s, iid, 0) for s in (1, 2) for iid in ORDER]
    assert not in_order(stage_major, ORDER)
    assert keys(by_instance(stage_major, ORDER)) == reference(stage_major, ORDER)
    unknown = [item(1, "b", 0), item(1, "zz", 0), item(1, "a", 0)]
    assert not in_order(unknown, ORDER)
    assert keys(by_instance(unknown, ORDER)) == reference(unknown, ORDER)


@given(
    st.lists(
        st.tuples(
            st.integers(1, 3),
            st.sampled_from([*ORDER, "x"]),
            st.integers(0, 2),
            st.sampled_from(["ok", "failed", "missing"]),
            st.booleans(),
        ),
        max_size=30,
        unique_by=lambda t: t[:3],
    ),
    st.booleans(),
)
def test_any_items_come_out_in_the_writers_order(rows: list[Any], sort_first: bool) -> None:
    if sort_first:  # often in order, as a plan's items are
        rows.sort(key=lambda r: (ORDER.index(r[1]) if r[1] in ORDER else 9, r[0]))
    items = [item(s, iid, r, status, gen) for s, iid, r, status, gen in rows]
    assert keys(by_instance(items, ORDER)) == reference(items, ORDER)
