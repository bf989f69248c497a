"""pass@k and maj@k estimators, called directly: against their closed form
and against brute-force enumeration of every k-subset of the samples."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalreplay.numbers import passk


def closed_form(n: int, c: int, k: int) -> Fraction:
    """1 - C(n-c, k) / C(n, k), exactly."""
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


@given(st.data())
def test_pass_at_k_is_the_closed_form(data):
    n = data.draw(st.integers(1, 300), label="n")
    c = data.draw(st.integers(0, n), label="c")
    k = data.draw(st.integers(1, n), label="k")
    got = passk.pass_at_k(n, c, k)
    assert 0.0 <= got <= 1.0
    assert got == pytest.approx(float(closed_form(n, c, k)), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_correct_sample(n):
    for c in range(n + 1):
        samples = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(samples, k))
            brute = sum(1 for s in subsets if any(s)) / len(subsets)
            assert passk.pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


def test_pass_at_k_edge_cases():
    assert passk.pass_at_k(10, 0, 3) == 0.0
    assert passk.pass_at_k(10, 10, 3) == 1.0
    assert passk.pass_at_k(10, 8, 3) == 1.0  # fewer wrong samples than k: every subset holds a right one
    assert passk.pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert 0.0 < passk.pass_at_k(10_000, 1, 5) < 1e-3  # stable: no huge binomials
    with pytest.raises(ValueError, match="k"):
        passk.pass_at_k(3, 1, 4)


def brute_maj(answers, correct, k) -> float:
    """The mean over every k-subset of the share of its most common answers
    that are correct (a tie is broken uniformly at random)."""
    quality: dict[object, list[float]] = {}
    for a, q in zip(answers, correct, strict=True):
        quality.setdefault(a, []).append(q)
    group_q = {a: sum(v) / len(v) for a, v in quality.items()}
    total = Fraction(0)
    subsets = list(itertools.combinations(range(len(answers)), k))
    for subset in subsets:
        votes = Counter(answers[i] for i in subset)
        top = max(votes.values())
        winners = [a for a, v in votes.items() if v == top]
        total += Fraction(sum(Fraction(group_q[a]) for a in winners)) / len(winners)
    return float(total / len(subsets))


@given(st.data())
def test_maj_at_k_is_the_brute_force_count(data):
    n = data.draw(st.integers(1, 9), label="n")
    answers = data.draw(st.lists(st.sampled_from(["a", "b", "c", None]), min_size=n, max_size=n))
    right = data.draw(st.sampled_from(["a", "b", "c", None]))
    correct = [1.0 if a == right and a is not None else 0.0 for a in answers]
    k = data.draw(st.integers(1, n), label="k")
    assert passk.maj_at_k(answers, correct, k) == pytest.approx(brute_maj(answers, correct, k), abs=1e-12)


def test_maj_at_k_by_hand():
    # 3 of 5 say "4" (right): every 5-subset's majority is "4".
    assert passk.maj_at_k(["4", "4", "4", "5", "6"], [1, 1, 1, 0, 0], 5) == 1.0
    # a 2-2 tie between a right and a wrong answer: half right.
    assert passk.maj_at_k(["4", "4", "5", "5"], [1, 1, 0, 0], 4) == 0.5
    # k = 1 is the share of right samples.
    assert passk.maj_at_k(["4", "5", "5"], [1, 0, 0], 1) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="k"):
        passk.maj_at_k(["4"], [1], 2)


def test_maj_at_k_stays_fast_for_many_samples():
    answers = [str(i % 7) for i in range(64)]
    correct = [1.0 if a == "3" else 0.0 for a in answers]
    value = passk.maj_at_k(answers, correct, 32)
    assert 0.0 <= value <= 1.0


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("pass@4", passk.SampleMetric("pass", 4, None)),
        ("maj@16", passk.SampleMetric("maj", 16, None)),
        ("pass@1:exact_match", passk.SampleMetric("pass", 1, "exact_match")),
        ("acc", None),
        ("pass@0", None),
        ("pass@04", None),
        ("pass@k", None),
        ("best@4", None),
    ],
)
def test_parse(name, expected):
    assert passk.parse(name) == expected
    if expected is not None:
        assert expected.name == name


def test_correctness_needs_one_zero_or_one_score():
    m = passk.SampleMetric("pass", 2, None)
    assert passk.correctness(m, {"exact_match": 1.0}) == 1.0
    assert passk.correctness(m, {"exact_match": 0.0}) == 0.0
    with pytest.raises(ValueError, match=r"several scores \['a', 'b'\].*'pass@2:a'"):
        passk.correctness(m, {"a": 1.0, "b": 0.0})
    with pytest.raises(ValueError, match=r"0 or 1.*0\.5"):
        passk.correctness(m, {"f1": 0.5})
    named = passk.SampleMetric("maj", 2, "b")
    assert passk.correctness(named, {"a": 1.0, "b": 0.0}) == 0.0
    with pytest.raises(ValueError, match="no score 'c'"):
        passk.correctness(passk.SampleMetric("maj", 2, "c"), {"a": 1.0})


def test_instance_values_leave_out_an_instance_with_fewer_scored_samples_than_k():
    metrics = (passk.SampleMetric("pass", 2, None), passk.SampleMetric("maj", 3, None))
    rollouts = [({"em": 1.0}, "4"), ({"em": 0.0}, "5")]
    assert passk.instance_values(metrics, rollouts) == {"pass@2": 1.0}
    rollouts.append(({"em": 0.0}, "5"))
    values = passk.instance_values(metrics, rollouts)
    assert values["maj@3"] == 0.0
    assert values["pass@2"] == pytest.approx(float(closed_form(3, 1, 2)))
