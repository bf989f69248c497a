"""The task bootstrap: refits of a rating over resamples of the tasks, and the
small-sample expansion that turns its replicates into an interval or a p-value.

Tasks, not judgments, are resampled: the rollouts of one task, and its
judgments against each reference, share the task's difficulty, so they are not
independent, and a row-level bootstrap (or the Fisher standard error) would
call the rating more precise than it is. Kept apart from the fit because the
point fit and the paired comparison both draw on it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
from scipy import special

from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.numbers.elo.solve import DEFAULT_MARGIN, rating_range, solve_ratings
from pytest_evalreplay.numbers.elo.table import JudgmentTable

DEFAULT_BOOTSTRAP = 1000
_BOOTSTRAP_CELLS = 4_000_000  # weight-matrix entries per bootstrap chunk (32 MB of float64)


def check_bootstrap(n_boot: int, seed: int) -> None:
    """Refuse a resample count or seed the generator would take wrongly (a bool, a negative)."""
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
    check_bootstrap(n_boot, seed)
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


def expanded_tail(tail: float, num_tasks: int) -> float:
    """The bootstrap tail probability that stands for `tail` with `num_tasks` tasks.

    A percentile interval uses a normal quantile and a resampling variance that
    is (T-1)/T of the true one, so with few tasks it is too narrow. The expanded
    percentile interval (Hesterberg 2015) moves each level to where a normal
    quantile matches a t quantile with T-1 degrees of freedom, scaled by sqrt(T/(T-1)).
    """
    t = float(special.stdtrit(num_tasks - 1, tail)) * math.sqrt(num_tasks / (num_tasks - 1))
    return float(special.ndtr(t))


def unexpanded_tail(share: float, num_tasks: int) -> float:
    """The inverse of `expanded_tail`: a one-sided p-value from a bootstrap share."""
    z = float(special.ndtri(share)) / math.sqrt(num_tasks / (num_tasks - 1))
    return float(special.stdtr(num_tasks - 1, z))


def percentile_interval(boot: np.ndarray, num_tasks: int) -> tuple[float, float]:
    tail = expanded_tail(0.025, num_tasks)
    lo, hi = np.quantile(boot, [tail, 1 - tail])
    return float(lo), float(hi)
