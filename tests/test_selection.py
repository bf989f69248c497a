"""The selection policy (run/selection.py), called directly on plain
`Entry` lists: what a shard, serial --resume and --evalreplay-no-generate
deselect, the stages a shard waits with, and that each gate runs after its
task's last rollout. The plugin-level cases are in tests/test_shard_plugin.py,
tests/test_resume.py and tests/test_gates_plugin.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalreplay.run.selection import (
    Entry,
    Options,
    gates_last,
    not_this_shard,
    owned,
    select,
    shard_lines,
)
from pytest_evalreplay.values.shard import Shard


def rollouts(task: str, n: int, stage: int = 0) -> list[Entry]:
    return [Entry(task, (stage, f"i{i}", 0)) for i in range(n)]


GATE_A, GATE_B, PLAIN = Entry("a", gate=True), Entry("b", gate=True), Entry()


def test_a_shard_deselects_the_other_shards_rollouts_and_every_gate_but_keeps_plain_tests() -> None:
    entries = [*rollouts("a", 40), GATE_A, PLAIN]
    halves = [set(not_this_shard(Shard(k, 2), entries)) for k in (1, 2)]
    gate, plain = len(entries) - 2, len(entries) - 1
    assert all(gate in h and plain not in h for h in halves)
    assert halves[0] & halves[1] == {gate}  # every rollout is run by exactly one shard
    assert halves[0] | halves[1] == set(range(len(entries) - 1))
    assert 0 < len(halves[0]) - 1 < 40


def test_a_shard_plans_the_keys_it_owns_and_says_how_many_per_task() -> None:
    entries = [*rollouts("a", 10), *rollouts("b", 5), GATE_A]
    shard = Shard(2, 3)
    mine = owned(shard, "a", [e.key for e in entries[:10] if e.key])
    assert mine == [e.key for e in entries[:10] if e.key and shard.owns("a", e.key)]
    assert owned(None, "a", [(0, "i1", 0)]) == [(0, "i1", 0)]
    mine_b = sum(shard.owns("b", e.key) for e in entries[10:15] if e.key)
    assert shard_lines(shard, entries) == [
        f"shard 2/3: {len(mine):,} of 10 items of a (the rest deselected; gates are judged after the merge)",
        f"shard 2/3: {mine_b:,} of 5 items of b (the rest deselected; gates are judged after the merge)",
    ]


@pytest.mark.parametrize(
    ("options", "rescores", "deselects", "holds"),
    [
        (Options(), False, False, False),
        (Options(resume=True), True, True, False),
        (Options(resume=True, report_reused=True), True, False, False),
        (Options(resume=True, serial=False), False, False, False),  # an xdist worker
        (Options(resume=True, collect_only=True), False, False, False),
        (Options(no_generate=True), False, False, True),
        (Options(no_generate=True, collect_only=True), False, False, False),
    ],
)
def test_which_options_rescore_deselect_reused_and_hold_back(
    options: Options, rescores: bool, deselects: bool, holds: bool
) -> None:
    assert (options.rescores_reused, options.deselects_reused, options.holds_back) == (
        rescores,
        deselects,
        holds,
    )


def test_no_generate_deselects_what_needs_generating_and_the_gate_of_that_task() -> None:
    entries = [*rollouts("a", 3), GATE_A, *rollouts("b", 2), GATE_B]
    chosen = select(entries, {"a": [(0, "i1", 0)]}, set(), set())
    assert chosen.drops == ((1, 3),)
    assert chosen.order == (0, 2, 4, 5, 6)
    assert chosen.lines == (
        "1 items of a need generating (deselected: --evalreplay-no-generate): they stay missing, "
        "and its gate is not judged",
    )
    assert chosen.reused == 0


def test_waiting_and_reused_items_are_deselected_each_once_in_their_own_group() -> None:
    entries = [*rollouts("a", 2, stage=1), *rollouts("a", 2, stage=2), GATE_A]
    waiting = {("a", (2, "i0", 0)), ("a", (2, "i1", 0))}
    reused = {("a", (1, "i0", 0)), ("a", (2, "i1", 0))}  # one waits: it is deselected as waiting
    chosen = select(entries, {}, waiting, reused)
    assert chosen.drops == ((2, 3), (0,))
    assert chosen.reused == 1
    assert chosen.order == (1, 4)
    assert chosen.lines == ()


def test_nothing_to_deselect_keeps_every_item() -> None:
    entries = [*rollouts("a", 2), PLAIN]
    assert select(entries, {}, set(), set()).drops == ()
    assert select(entries, {}, set(), set()).order == (0, 1, 2)


def test_each_gate_runs_just_after_its_tasks_last_rollout() -> None:
    a, b = rollouts("a", 2), rollouts("b", 2)
    entries = [GATE_B, a[0], b[0], GATE_A, a[1], PLAIN, b[1], Entry("c", gate=True)]
    order = gates_last(entries, range(len(entries)))
    assert [entries[n] for n in order] == [
        a[0],
        b[0],
        a[1],
        GATE_A,
        PLAIN,
        b[1],
        GATE_B,
        Entry("c", gate=True),
    ]


@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.booleans(), st.integers(0, 3)),
        max_size=20,
    )
)
def test_gate_order_keeps_every_item_once_and_the_rest_in_their_order(
    raw: list[tuple[str, bool, int]],
) -> None:
    entries = [Entry(t, gate=True) if is_gate else Entry(t, (0, f"i{i}", 0)) for t, is_gate, i in raw]
    gate_tasks = [e.task for e in entries if e.gate]
    order = gates_last(entries, range(len(entries)))
    ordered = [entries[n] for n in order]
    assert [e for e in ordered if not e.gate] == [e for e in entries if not e.gate]
    assert len(set(order)) == len(order) and {entries[n].task for n in order if entries[n].gate} == set(
        gate_tasks
    )
    for n, e in enumerate(ordered):
        if e.gate:  # no rollout of its task after it
            assert not any(later.task == e.task and not later.gate for later in ordered[n + 1 :])
