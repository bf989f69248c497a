"""Confidence intervals for eval metrics, with the instance as the unit.

A task's metric is the mean over instances of each instance's mean over its
rollouts. Rollouts of one instance are not independent draws: they share the
instance's difficulty, so when one fails the others tend to fail too. Treating
n instances x k rollouts as n*k independent scores understates the standard
error by up to sqrt(k) (the design effect 1 + (k-1)*rho, rho being the
within-instance correlation) and gives intervals that are too narrow. Here
each instance's mean is one observation, and the interval is a Student t
interval on those n values: the cluster-robust interval for equally weighted
clusters, and the one that matches how the metric itself is defined.

Two runs are compared by one paired test, `paired_test`: the gate decides a
regression with it and compare prints it, so the two can never disagree. It
is a paired t-test on per-instance differences (instance difficulty, shared
by both runs, cancels out), one-sided for a drop, with the t interval whose
upper end is the one-sided bound: the interval lies below 0 exactly when the
test rejects.

The metric's interval is pure Python (student_t.py holds its quantile): every
eval session computes one, and numpy and scipy would cost it more than the
rest of a small run. The paired test imports them inside the function: only
gates against a baseline and compare pay for them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_evalreplay.numbers.student_t import t_quantile

CONFIDENCE = 0.95
ALPHA = 0.05  # the paired test's one-sided significance level unless a gate says otherwise
PAIRED_T_TEST = "paired t-test"


@dataclass(frozen=True)
class Interval:
    """A mean over `n` instances and its confidence interval.

    `mean` is None when n == 0; `lo` and `hi` are None when n < 2 (one
    instance says nothing about spread) or when the bounds are not
    representable as finite floats. All floats are finite, so `to_dict()`
    serialises to strict JSON (never NaN).
    """

    n: int
    mean: float | None
    lo: float | None
    hi: float | None
    confidence: float = CONFIDENCE

    @property
    def half_width(self) -> float | None:
        if self.lo is None or self.hi is None:
            return None
        return (self.hi - self.lo) / 2

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "mean": self.mean, "lo": self.lo, "hi": self.hi, "confidence": self.confidence}


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def t_interval(values: Iterable[float], confidence: float = CONFIDENCE) -> Interval:
    """Student t interval for the mean of independent observations.

    n == 0 gives no mean; n == 1 a mean without bounds; equal values a
    zero-width interval (exactly the value, with no rounding noise).
    Raises ValueError on a non-finite value or a confidence outside (0, 1).

    Pure Python, so a session's metrics import neither numpy nor scipy: the
    mean and the standard deviation add up in numpy's order (`_sum`), so they
    are numpy 2's to the bit (numpy 1.x adds long arrays in another order,
    within an ulp); the t quantile is the correctly rounded one.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence!r}")
    try:
        x = [float(v) for v in values]
    except TypeError:
        raise ValueError("t_interval takes a flat sequence of numbers") from None
    n = len(x)
    if n == 0:
        return Interval(0, None, None, None, confidence)
    for v in x:
        if not math.isfinite(v):
            raise ValueError(f"scores must be finite numbers, got {v!r}")
    first = x[0]
    if all(v == first for v in x):
        if n == 1:
            return Interval(1, first, None, None, confidence)
        return Interval(n, first, first, first, confidence)
    # Scale into [-1, 1] first, so huge scores neither overflow the sum nor the squares.
    scale = max(abs(v) for v in x)
    y = [v / scale for v in x]
    mean_y = _sum(y) / n
    mean = mean_y * scale
    if not math.isfinite(mean):
        return Interval(n, None, None, None, confidence)
    sd_y = math.sqrt(_sum([(v - mean_y) * (v - mean_y) for v in y]) / (n - 1))
    t = t_quantile(n - 1, 0.5 + confidence / 2)
    half = t * sd_y / math.sqrt(n) * scale
    lo, hi = _finite(mean - half), _finite(mean + half)
    if lo is None or hi is None:
        return Interval(n, mean, None, None, confidence)
    # Rounding must never put the mean outside its own interval.
    return Interval(n, mean, min(lo, mean), max(hi, mean), confidence)


def _sum(x: list[float]) -> float:
    """The sum of x in numpy's float64 order (pairwise, eight accumulators
    per block of up to 128), so an interval is the one numpy 2 gave, to the bit."""
    return -0.0 + _pairwise(x, 0, len(x)) if x else 0.0


def _pairwise(x: list[float], start: int, n: int) -> float:
    if n < 8:
        total = -0.0
        for i in range(start, start + n):
            total += x[i]
        return total
    if n <= 128:
        acc = x[start : start + 8]
        i = 8
        while i < n - n % 8:
            for j in range(8):
                acc[j] += x[start + i + j]
            i += 8
        total = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
        for k in range(i, n):
            total += x[start + k]
        return total
    half = n // 2
    half -= half % 8
    return _pairwise(x, start, half) + _pairwise(x, start + half, n - half)


def instance_interval(instance_means: Iterable[float], confidence: float = CONFIDENCE) -> Interval:
    """The interval of a task metric from each instance's mean over its
    rollouts (what a predictions row's `scores` holds): a t interval with the
    instance as the unit. See the module docstring for why not the rollouts."""
    return t_interval(instance_means, confidence)


def clustered_interval(rollout_scores: Iterable[Sequence[float]], confidence: float = CONFIDENCE) -> Interval:
    """The interval of a task metric from each instance's rollout scores
    (one sequence per instance): each instance is averaged first, then the
    instance means get a t interval. An instance with no scored rollout is
    left out (a failure is never a 0)."""
    means = [math.fsum(s) / len(s) for s in rollout_scores if len(s)]
    return t_interval(means, confidence)


@dataclass(frozen=True)
class PairedTest:
    """Whether a new run dropped below a base run, paired over the `n` units
    (instances; for an EloEval, tasks) both scored.

    `estimate` is the mean change new - base (negative: worse; None when n == 0
    or not representable); `lo`, `hi` its interval at `confidence` (None below
    two units); `p_value` is one-sided for a drop (H1: new < base) and `p_gain`
    one-sided for a gain (None when the test gives none). For the paired
    t-test `confidence` is 1 - 2 * alpha, so `hi` is the one-sided (1 - alpha)
    upper bound: `hi < 0` exactly when `p_value < alpha`, and `lo > 0` exactly
    when `p_gain < alpha`. `decimals` is how many digits `describe` shows (a
    rating needs fewer than a score).
    """

    name: str
    n: int
    estimate: float | None
    lo: float | None
    hi: float | None
    confidence: float
    p_value: float
    alpha: float
    p_gain: float | None = None
    unit: str = "instance"
    decimals: int = 4

    @property
    def drop(self) -> float | None:
        """base - new: how much worse the new run is (what max_drop bounds)."""
        return None if self.estimate is None else -self.estimate

    @property
    def significant_drop(self) -> bool:
        return self.p_value < self.alpha

    @property
    def significant_gain(self) -> bool:
        if self.p_gain is not None:
            return self.p_gain < self.alpha
        return self.lo is not None and self.lo > 0

    def _signed(self, x: float) -> str:
        return f"{x:+.{self.decimals}f}"

    def describe(self) -> str:
        """One line with the test's name, estimate, interval and p-value (the
        gate's message and compare both print it)."""
        units = f"{self.n:,} {self.unit}{'' if self.n == 1 else 's'}"
        if self.n == 0:
            return f"{self.name}: no {self.unit} scored by both runs"
        if self.estimate is None or not math.isfinite(self.estimate):
            return f"{self.name} over {units}: the change is not representable as a float"
        text = f"{self.name} over {units}: change {self._signed(self.estimate)}"
        if self.lo is None or self.hi is None:
            why = f" (one {self.unit} cannot show a change)" if self.n == 1 else ""
            text += f", no interval{why}"
        else:
            lo, hi = self._signed(self.lo), self._signed(self.hi)
            text += f", {self.confidence * 100:g}% interval [{lo}, {hi}]"
        if self.estimate > 0 and self.p_gain is not None:
            return text + f", one-sided p={self.p_gain:.3g} for a gain"
        return text + f", one-sided p={self.p_value:.3g} for a drop"

    def to_dict(self) -> dict[str, Any]:
        return {
            "test": self.name,
            "n": self.n,
            "estimate": self.estimate,
            "lo": self.lo,
            "hi": self.hi,
            "confidence": self.confidence,
            "p_value": self.p_value,
            "p_gain": self.p_gain,
            "alpha": self.alpha,
            "significant_drop": self.significant_drop,
            "significant_gain": self.significant_gain,
        }


def _agree(p: float, rejects: bool, alpha: float) -> float:
    """The p-value put on the interval's side of alpha: where the quantile and
    the p-value round differently in the last bit, the interval decides."""
    if rejects and not p < alpha:
        return math.nextafter(alpha, 0.0)
    if not rejects and p < alpha:
        return alpha
    return p


def paired_test(new: Mapping[str, float], base: Mapping[str, float], alpha: float = ALPHA) -> PairedTest:
    """The one paired test of "new is significantly lower than base", over the
    instances both runs scored: a paired t-test on the differences new - base.

    p_value is one-sided for a drop and p_gain for a gain; the interval is the
    t interval at 1 - 2 * alpha, whose ends are the one-sided (1 - alpha)
    bounds, so it excludes 0 exactly when one of the two tests rejects.
    Degenerate cases, explicitly: no common instance: no estimate, p = 1; one:
    the change, no interval, p = 1 (one instance cannot show a change); every
    difference equal: a zero-width interval at that value, and p = 0 in its
    direction (no noise to weigh a change against; identical runs give p = 1
    both ways). Swapping the runs swaps p_value and p_gain and mirrors the
    interval. Raises ValueError on a non-finite score or alpha outside (0, 0.5).
    """
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be between 0 and 0.5 (a one-sided level), got {alpha!r}")
    confidence = 1 - 2 * alpha
    common = sorted(new.keys() & base.keys())
    pairs = [(float(new[i]), float(base[i])) for i in common]
    if not all(math.isfinite(a) and math.isfinite(b) for a, b in pairs):
        raise ValueError("scores must be finite numbers")
    diffs = [a - b for a, b in pairs]
    n = len(diffs)

    def result(
        estimate: float | None, lo: float | None, hi: float | None, p: float, p_gain: float
    ) -> PairedTest:
        return PairedTest(PAIRED_T_TEST, n, estimate, lo, hi, confidence, p, alpha, p_gain)

    if n == 0 or not all(math.isfinite(d) for d in diffs):  # the latter: scores near the float limit
        return result(None, None, None, 1.0, 1.0)
    if n == 1:
        return result(diffs[0], None, None, 1.0, 1.0)
    first = diffs[0]
    if all(d == first for d in diffs):
        return result(first, first, first, 0.0 if first < 0 else 1.0, 0.0 if first > 0 else 1.0)

    import numpy as np
    from scipy.special import stdtr, stdtrit

    x = np.asarray(diffs, dtype=float)
    # Scaled into [-1, 1] first, so huge differences neither overflow the sum nor the squares.
    scale = float(np.max(np.abs(x)))
    y = x / scale
    mean_y = float(np.mean(y))
    se_y = float(np.std(y, ddof=1)) / math.sqrt(n)
    t = mean_y / se_y
    half_y = float(stdtrit(n - 1, 1 - alpha)) * se_y
    mean = mean_y * scale
    # Rounding must never put the mean outside its own interval.
    lo_y, hi_y = min(mean_y - half_y, mean_y), max(mean_y + half_y, mean_y)
    lo, hi = _finite(lo_y * scale), _finite(hi_y * scale)
    drop = hi < 0 if hi is not None else hi_y < 0
    gain = lo > 0 if lo is not None else lo_y > 0
    p = _agree(float(stdtr(n - 1, t)), drop, alpha)
    p_gain = _agree(float(stdtr(n - 1, -t)), gain, alpha)
    if lo is None or hi is None:
        lo = hi = None
    return result(mean, lo, hi, p, p_gain)
