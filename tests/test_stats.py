"""Intervals clustered by instance and paired differences, against hand-computed values and scipy."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from pytest_evalreplay.stats import (
    Interval,
    clustered_interval,
    instance_interval,
    paired_difference,
    t_interval,
)

T_975_3 = 3.182446305284263  # Student t, 97.5% quantile, 3 degrees of freedom (tables)

finite = st.floats(allow_nan=False, allow_infinity=False)
score_lists = st.lists(finite, min_size=0, max_size=40)


def test_hand_computed_interval():
    # mean 0.75, sample sd 0.5, standard error 0.25, t(0.975, 3) = 3.1824...
    got = instance_interval([1.0, 0.0, 1.0, 1.0])
    assert got.n == 4
    assert got.mean == pytest.approx(0.75)
    assert got.lo == pytest.approx(0.75 - T_975_3 * 0.25)
    assert got.hi == pytest.approx(0.75 + T_975_3 * 0.25)
    assert got.half_width == pytest.approx(0.7956115763)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("n", [2, 3, 10, 500])
def test_matches_scipy(seed, n):
    x = np.random.default_rng(seed).random(n)
    lo, hi = sps.t.interval(0.95, n - 1, loc=x.mean(), scale=sps.sem(x))
    got = t_interval(x.tolist())
    assert got.mean == pytest.approx(x.mean(), rel=1e-12)
    assert got.lo == pytest.approx(lo, rel=1e-9, abs=1e-12)
    assert got.hi == pytest.approx(hi, rel=1e-9, abs=1e-12)


def test_other_confidence_matches_scipy():
    x = [0.2, 0.9, 0.4, 0.4, 1.0]
    lo, hi = sps.t.interval(0.9, 4, loc=np.mean(x), scale=sps.sem(x))
    got = t_interval(x, confidence=0.9)
    assert (got.lo, got.hi) == (pytest.approx(lo), pytest.approx(hi))
    assert got.confidence == 0.9


def test_no_instances_no_interval():
    assert instance_interval([]) == Interval(0, None, None, None)


def test_one_instance_has_a_mean_but_no_interval():
    got = instance_interval([0.25])
    assert (got.n, got.mean, got.lo, got.hi) == (1, 0.25, None, None)
    assert got.half_width is None
    assert not got.excludes_zero


def test_equal_values_give_a_zero_width_interval_at_exactly_that_value():
    got = instance_interval([0.1] * 7)
    assert (got.mean, got.lo, got.hi) == (0.1, 0.1, 0.1)


def test_non_finite_scores_are_refused():
    with pytest.raises(ValueError, match="finite"):
        instance_interval([0.5, math.nan])
    with pytest.raises(ValueError, match="finite"):
        paired_difference({"a": math.inf}, {"a": 0.0})
    with pytest.raises(ValueError, match="confidence"):
        t_interval([1.0, 2.0], confidence=1.0)


def test_clustered_interval_treats_the_instance_as_the_unit():
    # Three instances, four rollouts each, rollouts agreeing within an instance.
    rollouts = [[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 0], [0, 0, 1, 0]]
    clustered = clustered_interval(rollouts)
    assert clustered == instance_interval([1.0, 0.0, 0.75, 0.25])
    # Pretending the 16 correlated rollouts are independent gives a far too narrow interval.
    naive = t_interval([s for r in rollouts for s in r])
    assert naive.mean == pytest.approx(clustered.mean)
    assert naive.half_width < clustered.half_width / 2


def test_clustered_interval_skips_instances_without_scores():
    assert clustered_interval([[1.0, 0.0], [], [1.0]]) == instance_interval([0.5, 1.0])


def test_paired_difference_by_hand():
    base = {"a": 1.0, "b": 1.0, "c": 0.0, "d": 1.0, "only_base": 1.0}
    new = {"a": 0.0, "b": 1.0, "c": 0.0, "d": 1.0, "only_new": 0.0}
    got = paired_difference(new, base)
    # differences -1, 0, 0, 0: mean -0.25, sd 0.5, se 0.25
    assert got.n == 4
    assert got.mean == pytest.approx(-0.25)
    assert got.lo == pytest.approx(-0.25 - T_975_3 * 0.25)
    assert got.hi == pytest.approx(-0.25 + T_975_3 * 0.25)
    assert not got.excludes_zero


def test_paired_difference_matches_scipy_and_detects_a_shift():
    rng = np.random.default_rng(7)
    base = {f"i{k}": float(v) for k, v in enumerate(rng.random(200))}
    new = {k: v - 0.1 + 0.05 * float(rng.standard_normal()) for k, v in base.items()}
    d = np.array([new[k] - base[k] for k in sorted(base)])
    lo, hi = sps.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=sps.sem(d))
    got = paired_difference(new, base)
    assert (got.n, got.lo, got.hi) == (200, pytest.approx(lo), pytest.approx(hi))
    assert got.excludes_zero and got.hi < 0


def test_nothing_in_common():
    assert paired_difference({"a": 1.0}, {"b": 1.0}) == Interval(0, None, None, None)


def test_huge_scores_stay_finite_or_none():
    got = t_interval([1e308, -1e308, 1e308])
    assert got.mean is not None and math.isfinite(got.mean)
    assert got.lo is None and got.hi is None  # t * sd overflows: no interval rather than inf
    assert paired_difference({"a": 1e308}, {"a": -1e308}) == Interval(1, None, None, None)


def test_to_dict_is_strict_json():
    for interval in (instance_interval([]), instance_interval([1.0]), instance_interval([0.0, 1.0])):
        json.dumps(interval.to_dict(), allow_nan=False)


@settings(deadline=None)  # the first example pays numpy's and scipy's import
@given(score_lists)
def test_interval_contains_the_mean_and_is_finite(values):
    got = t_interval(values)
    assert got.n == len(values)
    if not values:
        assert got.mean is None
        return
    assert got.mean is not None and math.isfinite(got.mean)
    assert min(values) <= got.mean <= max(values)
    if got.lo is not None:
        assert got.hi is not None
        assert math.isfinite(got.lo) and math.isfinite(got.hi)
        assert got.lo <= got.mean <= got.hi
    json.dumps(got.to_dict(), allow_nan=False)


@settings(deadline=None)  # the first example pays numpy's and scipy's import
@given(st.dictionaries(st.text(max_size=3), st.tuples(finite, finite), max_size=30))
def test_swapping_the_runs_flips_the_sign(pairs):
    a = {k: v[0] for k, v in pairs.items()}
    b = {k: v[1] for k, v in pairs.items()}
    ab, ba = paired_difference(a, b), paired_difference(b, a)
    assert ab.n == ba.n == len(pairs)
    if ab.mean is None:
        assert ba.mean is None
        return
    assert ba.mean == -ab.mean
    if ab.lo is None:
        assert ba.lo is None and ba.hi is None
    else:
        assert (ba.lo, ba.hi) == (-ab.hi, -ab.lo)


@settings(deadline=None)  # the first example pays numpy's and scipy's import
@given(st.lists(st.floats(0, 1), min_size=2, max_size=30), st.floats(0, 1))
def test_a_constant_shift_is_the_mean_difference(base_values, shift):
    base = {str(i): v for i, v in enumerate(base_values)}
    new = {k: v + shift for k, v in base.items()}
    got = paired_difference(new, base)
    assert got.mean == pytest.approx(shift, abs=1e-12)
    assert got.lo is not None and got.lo <= got.mean <= got.hi
