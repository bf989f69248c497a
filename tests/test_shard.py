"""The shard function: stable (a rollout's shard depends on its task, stage,
instance and rollout only), balanced, and the K/N argument checked."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_evalreplay.values.shard import Shard, parse_shard, shard_of

ids = st.text(min_size=1, max_size=12)
keys = st.tuples(st.integers(1, 4), ids, st.integers(0, 7))


@given(
    st.text(min_size=1, max_size=8), st.lists(keys, min_size=1, max_size=40, unique=True), st.integers(1, 9)
)
def test_a_rollouts_shard_depends_on_the_rollout_alone(task: str, some: list, n: int) -> None:
    """Adding instances (or reordering them) moves no existing rollout."""
    alone = {key: shard_of(task, key, n) for key in some}
    more = [*reversed(some), *((s, iid + "+new", r) for s, iid, r in some)]
    together = {key: shard_of(task, key, n) for key in more}
    assert all(together[key] == k for key, k in alone.items())
    assert all(1 <= k <= n for k in together.values())


def test_the_shard_is_not_pythons_salted_hash() -> None:
    """Fixed values: the same on every machine and in every process."""
    assert [shard_of("gsm8k", (1, f"q{i}", 0), 3) for i in range(8)] == [
        shard_of("gsm8k", (1, f"q{i}", 0), 3) for i in range(8)
    ]
    assert shard_of("t", (1, "a", 0), 1) == 1
    assert [shard_of("gsm8k", (1, f"q{i}", 0), 4) for i in range(6)] == FIXED


FIXED = [1, 3, 4, 3, 2, 3]


@settings(max_examples=25, deadline=None)
@given(st.text(min_size=1, max_size=8), st.integers(2, 8), st.integers(1, 4))
def test_shards_are_balanced(task: str, n: int, samples: int) -> None:
    """Each shard's share of 2,000 items is within 5 standard deviations of 1/N."""
    items = [(1, f"i{i}", r) for i in range(2000 // samples) for r in range(samples)]
    counts = [0] * n
    for key in items:
        counts[shard_of(task, key, n) - 1] += 1
    mean = len(items) / n
    sd = (len(items) * (1 / n) * (1 - 1 / n)) ** 0.5
    assert all(abs(c - mean) <= 5 * sd for c in counts), counts


@pytest.mark.parametrize("text, shard", [("1/1", Shard(1, 1)), ("2/3", Shard(2, 3)), (" 3/3 ", Shard(3, 3))])
def test_k_of_n_parses(text: str, shard: Shard) -> None:
    assert parse_shard(text) == shard
    assert str(shard) == text.strip()


@pytest.mark.parametrize("text", ["0/3", "4/3", "1/0", "3", "a/b", "1/2/3", "-1/2", ""])
def test_a_bad_k_of_n_says_what_it_takes(text: str) -> None:
    with pytest.raises(ValueError, match=r"K/N"):
        parse_shard(text)


def test_a_shard_owns_its_keys_and_only_them() -> None:
    keys = [(1, f"q{i}", r) for i in range(30) for r in range(2)]
    owned = [[k for k in keys if Shard(s, 3).owns("t", k)] for s in (1, 2, 3)]
    assert sorted(k for part in owned for k in part) == sorted(keys)
