"""The Bradley-Terry likelihood of a candidate's rating against references of
fixed rating, and its maximisation.

P(candidate beats reference j) = 1 / (1 + 10 ** ((elo_j - r) / 400)), a tie
counting as half a win. Only r is fitted, so the fit is a 1-D concave
maximisation on counts aggregated per reference, solved by a safeguarded
Newton iteration that runs on many rows of counts at once: the bootstrap's
refits are the same call on a (B x J) matrix. Split from the fit's reporting
(`elo.py`) because this is the numerical core, shared by the point fit, the
bootstrap and the one-sided limits at a bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import special

from pytest_evalreplay.model import EvalReplayError

SCALE = 400.0  # Elo points per factor of 10 in the odds
SLOPE = math.log(10.0) / SCALE  # the logistic slope per Elo point
DEFAULT_MARGIN = 400.0  # how far beyond the references' range a rating may go (10:1 odds)
# A one-sided 95% profile-likelihood limit: the log-likelihood falls by half the
# chi-square(1) 0.90 quantile (= 1.6449 ** 2 / 2).
_PROFILE_DROP = 2.705543454095404 / 2
# A sweep (every judgment won, or every one lost) has probability exp(loglik(r)),
# so the exact one-sided 95% limit is where the log-likelihood equals log(0.05).
_SWEEP_DROP = -math.log(0.05)
_WIDE = 10_000.0  # search range beyond the references for unclamped maxima and limits
_TOL = 1e-7  # Elo points
_MAX_ITER = 200


def rating_range(elos: Sequence[float] | np.ndarray, margin: float = DEFAULT_MARGIN) -> tuple[float, float]:
    """Where a rating may lie: the references' range widened by `margin` on each side."""
    if not math.isfinite(margin) or margin <= 0:
        raise EvalReplayError(f"margin {margin!r} must be a finite number > 0")
    e = np.asarray(elos, dtype=float)
    return float(e.min()) - margin, float(e.max()) + margin


def _win_prob(ratings: np.ndarray, elos: np.ndarray) -> np.ndarray:
    return special.expit(SLOPE * (ratings[:, None] - elos[None, :]))


def _loglik(rating: float, score_sums: np.ndarray, counts: np.ndarray, elos: np.ndarray) -> float:
    z = SLOPE * (rating - elos)
    return float(np.sum(score_sums * special.log_expit(z) + (counts - score_sums) * special.log_expit(-z)))


def information(ratings: np.ndarray, counts: np.ndarray, elos: np.ndarray) -> np.ndarray:
    """Fisher information about each rating, per Elo point squared."""
    p = _win_prob(ratings, elos)
    return SLOPE**2 * np.sum(counts * p * (1.0 - p), axis=1)


def solve_ratings(
    score_sums: np.ndarray, counts: np.ndarray, elos: np.ndarray, lo: float, hi: float
) -> tuple[np.ndarray, np.ndarray]:
    """The maximum-likelihood rating of each row of (B, J) score sums and counts, within [lo, hi].

    Returns the ratings (NaN for a row with no judgments) and an int8 code per
    row: +1 at `hi` with the likelihood still rising, -1 at `lo` likewise, 0
    inside. Safeguarded Newton: each row keeps a bracket on which the score
    function changes sign and bisects whenever a Newton step leaves it.
    """
    s = np.atleast_2d(np.asarray(score_sums, dtype=float))
    n = np.atleast_2d(np.asarray(counts, dtype=float))
    e = np.asarray(elos, dtype=float)
    rows = s.shape[0]
    ratings = np.full(rows, np.nan)
    codes = np.zeros(rows, dtype=np.int8)
    total = n.sum(axis=1)
    judged = total > 0
    # The score function sum(S - N p) is decreasing in r: its sign at the ends decides the bound.
    at_hi = judged & (np.sum(s - n * _win_prob(np.full(rows, hi), e), axis=1) >= 0)
    at_lo = judged & ~at_hi & (np.sum(s - n * _win_prob(np.full(rows, lo), e), axis=1) <= 0)
    ratings[at_hi], codes[at_hi] = hi, 1
    ratings[at_lo], codes[at_lo] = lo, -1
    inside = np.flatnonzero(judged & ~at_hi & ~at_lo)
    if inside.size:
        ratings[inside] = _newton(s[inside], n[inside], e, lo, hi)
    return ratings, codes


def _newton(s: np.ndarray, n: np.ndarray, e: np.ndarray, lo: float, hi: float) -> np.ndarray:
    a = np.full(s.shape[0], lo)
    b = np.full(s.shape[0], hi)
    total = n.sum(axis=1)
    mean = np.clip(s.sum(axis=1) / total, 1e-6, 1 - 1e-6)
    # Start where one reference at the counts' mean rating would put the candidate.
    r = np.clip((n @ e) / total + SCALE * np.log10(mean / (1 - mean)), lo, hi)
    active = np.arange(s.shape[0])  # the rows still moving
    for _ in range(_MAX_ITER):
        x = r[active]
        p = _win_prob(x, e)
        g = np.sum(s[active] - n[active] * p, axis=1)
        h = np.sum(n[active] * p * (1 - p), axis=1)
        a[active] = np.where(g > 0, x, a[active])
        b[active] = np.where(g < 0, x, b[active])
        with np.errstate(divide="ignore", invalid="ignore"):
            step = x + g / (SLOPE * h)
        step = np.where((step >= a[active]) & (step <= b[active]), step, 0.5 * (a[active] + b[active]))
        r[active] = step
        active = active[np.abs(step - x) > _TOL]
        if active.size == 0:
            break
    return r


def one_sided_limit(
    score_sums: np.ndarray, counts: np.ndarray, elos: np.ndarray, side: int
) -> tuple[float, str]:
    """A one-sided 95% limit for a rating whose maximum lies beyond the allowed range.

    `side` +1: a lower limit (the likelihood peaks above); -1: an upper limit.
    For a sweep the limit is exact (the rating at which the sweep has
    probability 5%); otherwise it is the profile-likelihood limit around the
    unclamped maximum.
    """
    s, n = score_sums.sum(axis=0), counts.sum(axis=0)
    wide_lo, wide_hi = float(elos.min()) - _WIDE, float(elos.max()) + _WIDE
    sweep = bool(np.all(s == n)) if side > 0 else bool(np.all(s == 0))
    if sweep:
        peak, drop, kind = (wide_hi if side > 0 else wide_lo), _SWEEP_DROP, "exact"
        top = 0.0  # the log-likelihood of a sweep tends to 0 as the rating runs off
    else:
        peak = float(solve_ratings(s, n, elos, wide_lo, wide_hi)[0][0])
        drop, kind = _PROFILE_DROP, "profile"
        top = _loglik(peak, s, n, elos)

    def excess(r: float) -> float:
        return top - _loglik(r, s, n, elos) - drop

    far = wide_lo if side > 0 else wide_hi
    from scipy import optimize  # only at a bound; importing it costs more than a second

    return float(optimize.brentq(excess, far, peak, xtol=1e-6)), kind
