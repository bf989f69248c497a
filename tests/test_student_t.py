"""The pure-Python t quantile against scipy, and the metric's interval
against numpy's arithmetic to the bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import stdtr, stdtrit

from pytest_evalreplay.numbers.stats import t_interval
from pytest_evalreplay.numbers.student_t import t_quantile

dfs = st.one_of(st.integers(1, 60), st.integers(1, 10**6))
tails = st.floats(1e-12, 0.499)

# scipy 1.10's stdtrit (the oldest supported) is accurate to a few parts in 1e9
# only (at 1 degree of freedom it puts the 0.25 quantile, exactly -1, at
# -1.0000000000134); later versions are accurate to about an ulp.
SCIPY_REL = 1e-12 if tuple(int(x) for x in scipy.__version__.split(".")[:2]) >= (1, 11) else 5e-9
# numpy 1.x adds long arrays in another order than numpy 2's pairwise sum,
# which t_interval follows: there the bounds agree to an ulp, not to the bit.
NUMPY_2 = int(np.__version__.split(".")[0]) >= 2


@settings(deadline=None, max_examples=300)
@given(dfs, tails, st.booleans())
def test_matches_scipy_across_degrees_of_freedom(df, tail, upper):
    p = 1 - tail if upper else tail
    assert t_quantile(df, p) == pytest.approx(float(stdtrit(df, p)), rel=SCIPY_REL)


@pytest.mark.parametrize("df", [2, 3, 4, 11, 1000, 10**6])
def test_near_the_median_the_cdf_gives_p_back(df):
    # scipy's quantile loses digits next to 0.5 (4e-4 relative at 4 degrees of freedom); its cdf does not.
    for p in (0.5000001, 0.4999999, 0.5 + 1e-12):
        assert float(stdtr(df, t_quantile(df, p))) == pytest.approx(p, abs=1e-16)


def test_near_the_median_one_degree_of_freedom_is_cauchy():
    # scipy's cdf loses digits there too; the Cauchy quantile is tan(pi (p - 1/2)).
    for p in (0.5000001, 0.4999999, 0.5 + 1e-12):
        assert t_quantile(1, p) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-15)


@pytest.mark.parametrize(
    ("df", "p", "table"),
    [(1, 0.975, 12.706204736174694), (3, 0.975, 3.182446305284263), (3, 0.95, 2.353363434801823)],
)
def test_table_values(df, p, table):
    assert t_quantile(df, p) == pytest.approx(table, rel=1e-15)
    assert t_quantile(df, 1 - p) == -t_quantile(df, p)


def test_median_and_bad_input():
    assert t_quantile(7, 0.5) == 0.0
    for df, p in [(0.5, 0.9), (math.inf, 0.9), (3, 0.0), (3, 1.0), (3, math.nan)]:
        with pytest.raises(ValueError):
            t_quantile(df, p)


def _numpy_interval(values: list[float], confidence: float) -> tuple[float, float, float]:
    """What t_interval computed with numpy before, with the same quantile."""
    x = np.asarray(values, dtype=float)
    scale = float(np.max(np.abs(x)))
    y = x / scale
    mean_y = float(np.mean(y))
    sd_y = float(np.std(y, ddof=1))
    mean = mean_y * scale
    half = t_quantile(len(values) - 1, 0.5 + confidence / 2) * sd_y / math.sqrt(len(values)) * scale
    return mean, min(mean - half, mean), max(mean + half, mean)


@settings(deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=300), st.sampled_from([0.9, 0.95, 0.99]))
def test_interval_is_numpys_to_the_bit(values, confidence):
    if all(v == values[0] for v in values):
        return
    got = t_interval(values, confidence)
    assert (got.mean, got.lo, got.hi) == _numpy_interval(values, confidence)


@pytest.mark.parametrize("n", [129, 1000, 20_000, 100_003])
def test_long_sums_are_numpys_to_the_bit(n):
    values = np.random.default_rng(n).random(n).tolist()
    got = t_interval(values)
    want = _numpy_interval(values, 0.95)
    if NUMPY_2:
        assert (got.mean, got.lo, got.hi) == want
    else:
        assert (got.mean, got.lo, got.hi) == pytest.approx(want, rel=1e-15)
