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

The paired interval does the same on per-instance differences between two
runs, so that instance difficulty, shared by both runs, cancels out.

numpy and scipy are imported inside the functions: the plugin imports this
module on its start-up path, and a plain pytest run should not pay for them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CONFIDENCE = 0.95


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

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval lies wholly on one side of 0 (for a
        difference: the change is significant at 1 - confidence)."""
        return self.lo is not None and self.hi is not None and (self.lo > 0 or self.hi < 0)

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "mean": self.mean, "lo": self.lo, "hi": self.hi, "confidence": self.confidence}


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def t_interval(values: Iterable[float], confidence: float = CONFIDENCE) -> Interval:
    """Student t interval for the mean of independent observations.

    n == 0 gives no mean; n == 1 a mean without bounds; equal values a
    zero-width interval (exactly the value, with no rounding noise).
    Raises ValueError on a non-finite value or a confidence outside (0, 1).
    """
    import numpy as np

    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence!r}")
    x = np.asarray(list(values), dtype=float)
    if x.ndim != 1:
        raise ValueError("t_interval takes a flat sequence of numbers")
    n = int(x.size)
    if n == 0:
        return Interval(0, None, None, None, confidence)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"scores must be finite numbers, got {x[~np.isfinite(x)][0]!r}")
    if np.all(x == x[0]):
        value = float(x[0])
        if n == 1:
            return Interval(1, value, None, None, confidence)
        return Interval(n, value, value, value, confidence)
    # Scale into [-1, 1] first, so huge scores neither overflow the sum nor the squares.
    scale = float(np.max(np.abs(x)))
    y = x / scale
    mean_y = float(np.mean(y))
    mean = mean_y * scale
    if not math.isfinite(mean):
        return Interval(n, None, None, None, confidence)
    sd_y = float(np.std(y, ddof=1))
    from scipy.special import stdtrit

    t = float(stdtrit(n - 1, 0.5 + confidence / 2))
    half = t * sd_y / math.sqrt(n) * scale
    lo, hi = _finite(mean - half), _finite(mean + half)
    if lo is None or hi is None:
        return Interval(n, mean, None, None, confidence)
    # Rounding must never put the mean outside its own interval.
    return Interval(n, mean, min(lo, mean), max(hi, mean), confidence)


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


def paired_difference(
    new: Mapping[str, float], base: Mapping[str, float], confidence: float = CONFIDENCE
) -> Interval:
    """The mean of new - base over the instances both runs scored, with a t
    interval on those paired differences. Swapping the runs flips the sign
    exactly: mean -> -mean, (lo, hi) -> (-hi, -lo)."""
    common = sorted(new.keys() & base.keys())
    pairs = [(float(new[i]), float(base[i])) for i in common]
    if not all(math.isfinite(a) and math.isfinite(b) for a, b in pairs):
        raise ValueError("scores must be finite numbers")
    diffs = [a - b for a, b in pairs]
    if not all(math.isfinite(d) for d in diffs):  # scores near the float limit
        return Interval(len(diffs), None, None, None, confidence)
    return t_interval(diffs, confidence)
