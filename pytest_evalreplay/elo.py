"""The rating of a candidate model from pairwise judgments against references of known rating.

The model is Bradley-Terry with the references' ratings held fixed, on the
Elo scale: P(candidate beats reference j) = 1 / (1 + 10 ** ((elo_j - r) / 400)),
a tie counting as half a win. Only the candidate's rating r is fitted, so the
fit is a 1-D concave maximisation on counts aggregated per reference, solved
by a safeguarded Newton iteration that runs on many rows of counts at once:
the bootstrap's refits are the same call on a (B x J) matrix.

The interval resamples tasks, not judgments: the rollouts of one task, and its
judgments against each reference, share the task's difficulty, so they are not
independent, and a row-level bootstrap (or the Fisher standard error) would
call the rating more precise than it is. See docs/elo.md for the statistics.

Everything here is plain functions over plain data. numpy and scipy are
imported at the top: this module is imported only when an `EloEval` exists.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Literal, NamedTuple

import numpy as np
from scipy import special

from pytest_evalreplay.model import EvalReplayError

SCALE = 400.0  # Elo points per factor of 10 in the odds
SLOPE = math.log(10.0) / SCALE  # the logistic slope per Elo point
DEFAULT_MARGIN = 400.0  # how far beyond the references' range a rating may go (10:1 odds)
DEFAULT_BOOTSTRAP = 1000
_Z95 = 1.959963984540054  # two-sided 95% normal quantile
# A one-sided 95% profile-likelihood limit: the log-likelihood falls by half the
# chi-square(1) 0.90 quantile (= 1.6449 ** 2 / 2).
_PROFILE_DROP = 2.705543454095404 / 2
# A sweep (every judgment won, or every one lost) has probability exp(loglik(r)),
# so the exact one-sided 95% limit is where the log-likelihood equals log(0.05).
_SWEEP_DROP = -math.log(0.05)
_WIDE = 10_000.0  # search range beyond the references for unclamped maxima and limits
_TOL = 1e-7  # Elo points
_MAX_ITER = 200
_BOOTSTRAP_CELLS = 4_000_000  # weight-matrix entries per bootstrap chunk (32 MB of float64)

Bound = Literal["upper", "lower"]
IntervalKind = Literal["bootstrap", "fisher", "exact", "profile"]


class Judgment(NamedTuple):
    """One judged pair: the candidate's score against one reference on one task."""

    task_id: str
    reference: str
    score: float  # 1 win, 0.5 tie, 0 loss
    stage: int = 1


@dataclass(frozen=True)
class ReferenceCounts:
    """The candidate's record against one reference."""

    name: str
    elo: float
    wins: int
    ties: int
    losses: int

    @property
    def n(self) -> int:
        return self.wins + self.ties + self.losses

    @property
    def score(self) -> float | None:
        """The candidate's mean score against this reference (a tie is half a win)."""
        return (self.wins + 0.5 * self.ties) / self.n if self.n else None


@dataclass(frozen=True, eq=False)
class JudgmentTable:
    """Judgments aggregated per (task, reference): everything the fit and the
    task bootstrap need. Tasks and references are sorted by name, so the table
    (and every interval drawn from it) does not depend on the order of the rows."""

    task_ids: tuple[str, ...]  # T
    references: tuple[str, ...]  # J: the references judged at least once
    elos: np.ndarray  # (J,) their fixed ratings
    outcomes: np.ndarray  # (T, J, 3) int64: losses, ties, wins

    @property
    def score_sums(self) -> np.ndarray:
        """(T, J): the candidate's summed scores, a tie counting half."""
        return self.outcomes[..., 2] + 0.5 * self.outcomes[..., 1]

    @property
    def counts(self) -> np.ndarray:
        """(T, J): judged pairs."""
        return self.outcomes.sum(axis=2).astype(float)

    @property
    def num_judgments(self) -> int:
        return int(self.outcomes.sum())

    def reference_counts(self) -> tuple[ReferenceCounts, ...]:
        totals = self.outcomes.sum(axis=0)
        return tuple(
            ReferenceCounts(name, float(elo), wins=int(w), ties=int(t), losses=int(lo))
            for name, elo, (lo, t, w) in zip(self.references, self.elos, totals, strict=True)
        )

    def select(self, task_ids: Iterable[str]) -> JudgmentTable:
        """The table restricted to `task_ids` (each must be in the table), and to
        the references judged on them."""
        index = {t: i for i, t in enumerate(self.task_ids)}
        keep = sorted(set(task_ids))
        outcomes = self.outcomes[np.array([index[t] for t in keep], dtype=np.intp)]
        return _judged_table(keep, self.references, self.elos, outcomes)


def _judged_table(
    task_ids: Sequence[str], references: Sequence[str], elos: np.ndarray, outcomes: np.ndarray
) -> JudgmentTable:
    """The table of the tasks and references with at least one judgment."""
    tasks = np.flatnonzero(outcomes.sum(axis=(1, 2)))
    refs = np.flatnonzero(outcomes.sum(axis=(0, 2)))
    return JudgmentTable(
        task_ids=tuple(task_ids[i] for i in tasks),
        references=tuple(references[j] for j in refs),
        elos=np.asarray(elos, dtype=float)[refs],
        outcomes=np.ascontiguousarray(outcomes[np.ix_(tasks, refs)]),
    )


@dataclass(frozen=True)
class EloFit:
    """A fitted rating and how far to trust it.

    `rating` is None when nothing was judged. `bound` is "upper" ("lower")
    when the likelihood still rises at the top (bottom) of the allowed range,
    the references' range widened by the margin: the candidate won (lost)
    every judgment, or nearly, and the references cannot say how much better
    (worse) it is. Then `rating` is that edge, `se` is None, and `ci95` is a
    one-sided 95% limit: (lower limit, None) or (None, upper limit).
    Otherwise `se` is the Fisher standard error and `ci95` the 95% interval
    `interval` names (a bootstrap over tasks by default); an end of the
    bootstrap interval that reaches the allowed range's edge is None.
    """

    rating: float | None
    se: float | None
    ci95: tuple[float | None, float | None]
    bound: Bound | None
    interval: IntervalKind | None
    counts: tuple[ReferenceCounts, ...]
    num_tasks: int
    note: str | None = None

    @property
    def num_judgments(self) -> int:
        return sum(c.n for c in self.counts)


@dataclass(frozen=True)
class EloComparison:
    """A current run against a baseline over the tasks both judged (refitted on those alone)."""

    num_tasks: int
    current: float | None
    baseline: float | None
    drop: float | None  # baseline - current
    p_value: float  # one-sided, for "current is lower"; 1.0 when nothing is shared
    ci95: tuple[float | None, float | None]  # of the drop


# --- aggregation -------------------------------------------------------------------------------


def _check_references(references: Mapping[str, float]) -> dict[str, float]:
    if not references:
        raise EvalReplayError("no references: an ELO evaluation needs at least one reference with a rating")
    checked: dict[str, float] = {}
    for name, elo in references.items():
        if not isinstance(name, str) or not name:
            raise EvalReplayError(f"reference name {name!r} must be a non-empty string")
        try:
            value = float(elo)
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value) or isinstance(elo, bool):
            raise EvalReplayError(f"reference {name!r} has rating {elo!r}; give a finite number, e.g. 1200")
        checked[name] = value
    return checked


def tabulate(rows: Iterable[Sequence[Any]], references: Mapping[str, float]) -> JudgmentTable:
    """Aggregate judged rows (task id, reference name, score, [stage]) into a table.

    A score must be 1 (win), 0.5 (tie) or 0 (loss): anything else is the judge's
    bug, and counting it as something would hide it.
    """
    elo_of = _check_references(references)
    rows = rows if isinstance(rows, Sequence) else list(rows)
    if not rows:
        return JudgmentTable((), (), np.zeros(0), np.zeros((0, 0, 3), dtype=np.int64))
    names = sorted(elo_of)
    ref_index = {name: j for j, name in enumerate(names)}
    tasks = list(map(itemgetter(0), rows))
    unique_tasks = list(dict.fromkeys(tasks))
    odd = next((t for t in unique_tasks if not isinstance(t, str)), None)
    if odd is not None:
        raise EvalReplayError(f"task id {odd!r} in the judgment rows must be a string")
    sorted_tasks = sorted(unique_tasks)
    task_index = {t: i for i, t in enumerate(sorted_tasks)}
    task_codes = np.fromiter(map(task_index.__getitem__, tasks), dtype=np.int64, count=len(rows))
    try:
        ref_codes = np.fromiter(map(ref_index.__getitem__, map(itemgetter(1), rows)), np.int64, len(rows))
    except (KeyError, TypeError):
        at = next(i for i, row in enumerate(rows) if not isinstance(row[1], str) or row[1] not in ref_index)
        raise EvalReplayError(
            f"judgment row {at} (task {rows[at][0]!r}) names reference {rows[at][1]!r}, which is not among "
            f"the references ({', '.join(names)}); judge only against the configured references"
        ) from None
    scores = np.array(list(map(itemgetter(2), rows)), dtype=object)
    outcome = np.full(len(rows), -1, dtype=np.int64)
    for code, value in enumerate((0.0, 0.5, 1.0)):
        outcome[scores == value] = code
    bad = np.flatnonzero(outcome < 0)
    if bad.size:
        at = int(bad[0])
        raise EvalReplayError(
            f"judgment row {at} (task {rows[at][0]!r}, reference {rows[at][1]!r}) has score {rows[at][2]!r}; "
            "a pairwise judge returns 1 (win), 0.5 (tie) or 0 (loss)"
        )
    num_tasks, num_refs = len(sorted_tasks), len(names)
    cell = (task_codes * num_refs + ref_codes) * 3 + outcome
    outcomes = np.bincount(cell, minlength=num_tasks * num_refs * 3).reshape(num_tasks, num_refs, 3)
    return _judged_table(sorted_tasks, names, np.array([elo_of[n] for n in names]), outcomes)


# --- the fit -------------------------------------------------------------------------------------


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


def _information(ratings: np.ndarray, counts: np.ndarray, elos: np.ndarray) -> np.ndarray:
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


def _one_sided_limit(
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


def _check_bootstrap(n_boot: int, seed: int) -> None:
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 0:
        raise EvalReplayError(f"n_boot={n_boot!r}: give the number of bootstrap resamples, an int >= 0")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise EvalReplayError(f"seed={seed!r}: give an int >= 0")


def _task_weights(num_tasks: int, n_boot: int, seed: int) -> Iterator[np.ndarray]:
    """Bootstrap resamples of the tasks as chunks of a (B x T) multinomial weight matrix:
    row b says how often resample b drew each task."""
    rng = np.random.Generator(np.random.PCG64(seed))
    chunk = max(1, _BOOTSTRAP_CELLS // max(num_tasks, 1))
    for start in range(0, n_boot, chunk):
        rows = min(chunk, n_boot - start)
        draws = rng.integers(0, num_tasks, size=(rows, num_tasks))
        draws += (np.arange(rows) * num_tasks)[:, None]
        yield np.bincount(draws.ravel(), minlength=rows * num_tasks).reshape(rows, num_tasks).astype(float)


def bootstrap_ratings(
    tables: Sequence[JudgmentTable],
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    margin: float = DEFAULT_MARGIN,
) -> np.ndarray:
    """(len(tables), B) refitted ratings over the same B resamples of the tasks.

    The tables must list the same tasks (in the same, sorted, order); sharing
    the resamples is what pairs two runs.
    """
    _check_bootstrap(n_boot, seed)
    num_tasks = len(tables[0].task_ids)
    if any(t.task_ids != tables[0].task_ids for t in tables):
        raise ValueError("bootstrap_ratings: the tables must hold the same tasks")
    # Every table's score sums and counts side by side: one pass over each chunk of weights.
    columns = np.concatenate([m for t in tables for m in (t.score_sums, t.counts)], axis=1)
    edges = np.cumsum([0] + [len(t.references) for t in tables for _ in range(2)])
    ranges = [rating_range(t.elos, margin) for t in tables]
    out = np.empty((len(tables), n_boot))
    done = 0
    for weights in _task_weights(num_tasks, n_boot, seed):
        sums = weights @ columns
        for i, (table, (lo, hi)) in enumerate(zip(tables, ranges, strict=True)):
            s, n = sums[:, edges[2 * i] : edges[2 * i + 1]], sums[:, edges[2 * i + 1] : edges[2 * i + 2]]
            out[i, done : done + len(weights)] = solve_ratings(s, n, table.elos, lo, hi)[0]
        done += len(weights)
    return out


def _expanded_tail(tail: float, num_tasks: int) -> float:
    """The bootstrap tail probability that stands for `tail` with `num_tasks` tasks.

    A percentile interval uses a normal quantile and a resampling variance that
    is (T-1)/T of the true one, so with few tasks it is too narrow. The expanded
    percentile interval (Hesterberg 2015) moves each level to where a normal
    quantile matches a t quantile with T-1 degrees of freedom, scaled by sqrt(T/(T-1)).
    """
    t = float(special.stdtrit(num_tasks - 1, tail)) * math.sqrt(num_tasks / (num_tasks - 1))
    return float(special.ndtr(t))


def _unexpanded_tail(share: float, num_tasks: int) -> float:
    """The inverse of `_expanded_tail`: a one-sided p-value from a bootstrap share."""
    z = float(special.ndtri(share)) / math.sqrt(num_tasks / (num_tasks - 1))
    return float(special.stdtr(num_tasks - 1, z))


def _percentile_interval(boot: np.ndarray, num_tasks: int) -> tuple[float, float]:
    tail = _expanded_tail(0.025, num_tasks)
    lo, hi = np.quantile(boot, [tail, 1 - tail])
    return float(lo), float(hi)


def _open_ends(lo: float, hi: float, low_edge: float, high_edge: float) -> tuple[float | None, float | None]:
    return (None if lo <= low_edge else lo), (None if hi >= high_edge else hi)


def fit_elo(
    table: JudgmentTable, *, n_boot: int = DEFAULT_BOOTSTRAP, seed: int = 0, margin: float = DEFAULT_MARGIN
) -> EloFit:
    """The candidate's rating from a table, with its Fisher SE and a 95% interval.

    The interval is an expanded percentile bootstrap over tasks (`n_boot`
    resamples, seeded); with `n_boot=0`, or a single task, the Fisher (Wald)
    interval. At a bound, a one-sided limit instead (see `EloFit`).
    """
    _check_bootstrap(n_boot, seed)
    counts = table.reference_counts()
    num_tasks = len(table.task_ids)
    if table.num_judgments == 0:
        return EloFit(None, None, (None, None), None, None, counts, num_tasks, "no judged pairs: no rating")
    s_all = table.score_sums.sum(axis=0, keepdims=True)
    n_all = table.counts.sum(axis=0, keepdims=True)
    lo, hi = rating_range(table.elos, margin)
    ratings, codes = solve_ratings(s_all, n_all, table.elos, lo, hi)
    rating, code = float(ratings[0]), int(codes[0])
    if code:
        limit, kind = _one_sided_limit(s_all, n_all, table.elos, code)
        record = f"scored {s_all.sum():g} of {n_all.sum():g} judged pairs"
        if code > 0:
            limit = min(limit, hi)
            note = (
                f"{record}: the rating is above what the references measure, reported at the upper edge "
                f"{hi:.0f} (top reference + {margin:g}); 95% lower limit {limit:.0f} ({kind})"
            )
            return EloFit(rating, None, (limit, None), "upper", kind, counts, num_tasks, note)
        limit = max(limit, lo)
        note = (
            f"{record}: the rating is below what the references measure, reported at the lower edge "
            f"{lo:.0f} (bottom reference - {margin:g}); 95% upper limit {limit:.0f} ({kind})"
        )
        return EloFit(rating, None, (None, limit), "lower", kind, counts, num_tasks, note)
    se = float(1.0 / math.sqrt(_information(ratings, n_all, table.elos)[0]))
    if n_boot == 0 or num_tasks < 2:
        note = None if n_boot == 0 else "one task: a Fisher interval, blind to correlation within the task"
        ci = _open_ends(rating - _Z95 * se, rating + _Z95 * se, lo, hi)
        return EloFit(rating, se, ci, None, "fisher", counts, num_tasks, note)
    boot = bootstrap_ratings([table], n_boot, seed, margin)[0]
    ci = _open_ends(*_percentile_interval(boot, num_tasks), lo, hi)
    note = f"{num_tasks} tasks: the bootstrap interval is rough with so few" if num_tasks < 10 else None
    return EloFit(rating, se, ci, None, "bootstrap", counts, num_tasks, note)


def cumulative_fits(
    rows: Iterable[Sequence[Any]],
    references: Mapping[str, float],
    *,
    num_stages: int | None = None,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    margin: float = DEFAULT_MARGIN,
) -> list[EloFit]:
    """The fit after each stage: entry s-1 uses the rows of stages 1..s.

    Rows are (task id, reference, score, stage) (`Judgment`s). Stages run
    1..num_stages (default: the highest stage in the rows); a stage with no
    rows repeats the fit before it.
    """
    rows = list(rows)
    stages = np.array([row[3] for row in rows], dtype=np.int64)
    last = num_stages if num_stages is not None else int(stages.max(initial=0))
    if stages.size and (stages.min() < 1 or stages.max() > last):
        raise EvalReplayError(f"judgment stages run {stages.min()}..{stages.max()}; stages are 1..{last}")
    fits: list[EloFit] = []
    for stage in range(1, last + 1):
        if fits and not np.any(stages == stage):
            fits.append(fits[-1])
            continue
        upto = [row for row, st in zip(rows, stages, strict=True) if st <= stage]
        fits.append(fit_elo(tabulate(upto, references), n_boot=n_boot, seed=seed, margin=margin))
    return fits


def compare_ratings(
    current: JudgmentTable,
    baseline: JudgmentTable,
    *,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    margin: float = DEFAULT_MARGIN,
) -> EloComparison:
    """How far the current run's rating dropped below the baseline's, paired over shared tasks.

    Both runs are refitted on the tasks both judged, and those tasks are
    resampled together, so a task that is hard for both moves both ratings
    alike and cancels from the drop. The p-value, one-sided for "current is
    lower", is the bootstrap share of drops <= 0 (with the +1 correction,
    never 0), mapped through the same small-sample expansion as the interval,
    so that p < 0.025 goes with an interval above 0. Fewer than 2 shared
    tasks cannot show a significant drop: p = 1.
    """
    _check_bootstrap(n_boot, seed)
    if n_boot == 0:
        raise EvalReplayError("compare_ratings needs bootstrap resamples: n_boot >= 1")
    shared = set(current.task_ids) & set(baseline.task_ids)
    cur, base = current.select(shared), baseline.select(shared)
    if cur.num_judgments == 0 or base.num_judgments == 0:
        return EloComparison(len(shared), None, None, None, 1.0, (None, None))
    r_cur = fit_elo(cur, n_boot=0, margin=margin).rating
    r_base = fit_elo(base, n_boot=0, margin=margin).rating
    assert r_cur is not None and r_base is not None
    drop = r_base - r_cur
    if len(shared) < 2:
        return EloComparison(len(shared), r_cur, r_base, drop, 1.0, (None, None))
    boot = bootstrap_ratings([cur, base], n_boot, seed, margin)
    drops = boot[1] - boot[0]
    share = (1 + np.count_nonzero(drops <= 0)) / (n_boot + 1)
    p_value = _unexpanded_tail(float(share), len(shared))
    return EloComparison(len(shared), r_cur, r_base, drop, p_value, _percentile_interval(drops, len(shared)))


def simulate_scores(
    rng: np.random.Generator,
    rating: float,
    elos: Sequence[float] | np.ndarray,
    num_tasks: int,
    per_pair: int = 1,
    *,
    tie_rate: float = 0.2,
    task_correlation: float = 0.0,
) -> np.ndarray:
    """(num_tasks, J, per_pair) scores of a judge that follows the model: for
    sizing a budget, and for checking the fit's error bars against a known truth.

    Each judgment's expected score is exactly the Bradley-Terry probability of
    `rating` against that reference. Ties take `tie_rate * 4p(1-p)` of the
    mass (most at even odds). With probability `task_correlation` a judgment
    reuses its task's shared uniform draw instead of its own, so judgments of
    one task agree more often than chance, as they do when a task is easy or
    hard for the candidate, while each judgment's distribution stays the same.
    """
    if not 0 <= tie_rate <= 0.5 or not 0 <= task_correlation <= 1:
        raise ValueError("tie_rate must lie in [0, 0.5] and task_correlation in [0, 1]")
    e = np.asarray(elos, dtype=float)
    p = special.expit(SLOPE * (rating - e))[None, :, None]
    tie = tie_rate * 4 * p * (1 - p)
    win = p - tie / 2
    shape = (num_tasks, len(e), per_pair)
    own = rng.random(shape)
    shared = rng.random(num_tasks)[:, None, None]
    u = np.where(rng.random(shape) < task_correlation, shared, own)
    return np.where(u < win, 1.0, np.where(u < win + tie, 0.5, 0.0))


# --- stage planning ------------------------------------------------------------------------------


def choose_references(references: Mapping[str, float], rating: float | None, k: int | None) -> list[str]:
    """The references a stage judges against.

    Without a rating or a k: every reference, sorted by name. Otherwise the k
    whose rating is nearest the candidate's (the most informative: a judgment
    carries most information at even odds), nearest first, ties by name.
    """
    elo_of = _check_references(references)
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise EvalReplayError(f"references={k!r}: give the number of references per stage, a positive int")
    if k is None or rating is None:
        return sorted(elo_of)
    if not math.isfinite(rating):
        raise EvalReplayError(f"rating {rating!r} is not a finite number")
    return sorted(elo_of, key=lambda name: (abs(elo_of[name] - rating), name))[:k]


# --- JSON ----------------------------------------------------------------------------------------


def _finite(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def fit_to_json(fit: EloFit) -> dict[str, Any]:
    """The `elo` block's fit pieces for metrics.json and the baseline: strict JSON (no NaN, no inf)."""
    return {
        "rating": _finite(fit.rating),
        "se": _finite(fit.se),
        "ci95": [_finite(fit.ci95[0]), _finite(fit.ci95[1])],
        "bound": fit.bound,
        "interval": fit.interval,
        "num_tasks": fit.num_tasks,
        "num_judgments": fit.num_judgments,
        "references": [
            {"name": c.name, "elo": _finite(c.elo), "wins": c.wins, "ties": c.ties, "losses": c.losses}
            for c in fit.counts
        ],
        "note": fit.note,
    }


def table_to_json(table: JudgmentTable) -> dict[str, Any]:
    """Per-task counts, enough to refit and to pair a later run with this one:
    {"references": {name: elo}, "tasks": {task id: {reference: [wins, ties, losses]}}}."""
    tasks: dict[str, dict[str, list[int]]] = {}
    for i, task in enumerate(table.task_ids):
        cells = {
            ref: [int(w), int(t), int(lo)]
            for ref, (lo, t, w) in zip(table.references, table.outcomes[i], strict=True)
            if lo or t or w
        }
        if cells:
            tasks[task] = cells
    return {"references": dict(zip(table.references, map(float, table.elos), strict=True)), "tasks": tasks}


def table_from_json(data: Any, source: str) -> JudgmentTable:
    """The inverse of `table_to_json`; `source` (a file, and where in it) names bad input."""
    if not isinstance(data, Mapping) or not isinstance(data.get("tasks"), Mapping):
        raise EvalReplayError(f"{source}: expected {{'references': {{...}}, 'tasks': {{...}}}}")
    references = data.get("references")
    if not isinstance(references, Mapping):
        raise EvalReplayError(f"{source}: 'references' must map each reference name to its rating")
    try:
        elo_of = _check_references(references)
    except EvalReplayError as exc:
        raise EvalReplayError(f"{source}: {exc}") from None
    names = sorted(elo_of)
    ref_index = {name: j for j, name in enumerate(names)}
    task_ids = sorted(data["tasks"])
    outcomes = np.zeros((len(task_ids), len(names), 3), dtype=np.int64)
    for i, task in enumerate(task_ids):
        cells = data["tasks"][task]
        if not isinstance(task, str) or not isinstance(cells, Mapping):
            raise EvalReplayError(f"{source}: task {task!r} must map references to [wins, ties, losses]")
        for ref, record in cells.items():
            valid = (
                isinstance(record, list)
                and len(record) == 3
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in record)
            )
            if not valid:
                raise EvalReplayError(
                    f"{source}: task {task!r}, reference {ref!r}: {record!r} is not [wins, ties, losses] "
                    "(three counts >= 0)"
                )
            if ref not in ref_index:
                raise EvalReplayError(f"{source}: task {task!r} names reference {ref!r}, which has no rating")
            outcomes[i, ref_index[ref]] = record[::-1]
    return _judged_table(task_ids, names, np.array([elo_of[n] for n in names]), outcomes)
