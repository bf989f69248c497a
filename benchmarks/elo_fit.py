"""How fast the ELO fit gets a rating and its interval from a million judged rows.

A seeded synthetic evaluation (10,000 tasks x 5 references x 20 judgments, a
candidate rated 1350, ties and correlation within tasks) gives 1,000,000
judged rows as Python tuples, what the plugin would hold. Side by side, the
median of --repeats runs of each:

- ours: `tabulate` the rows, then `fit_elo`: the rating, its Fisher SE and a
  95% interval from 1,000 bootstrap refits over tasks (--boot).
- raw: the Chatbot Arena way, a logistic regression on the raw rows (one row
  per judgment, a tie as half a win): the rows to arrays, then
  scipy.optimize.minimize (L-BFGS-B, analytic gradient) on their
  log-likelihood. scikit-learn's LogisticRegression would be the usual tool,
  but it has no offset term, so it cannot hold the references' ratings fixed;
  this is the same likelihood it would maximise.
- raw with an interval: the raw fit refitted on bootstrap resamples of the
  tasks; --raw-boot of them are timed and the time scaled to --boot.

Goal: ours, interval included, under 1 second.

    python benchmarks/elo_fit.py                # 1,000,000 rows
    python benchmarks/elo_fit.py --tasks 1000   # a quick check
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import optimize, special

from pytest_evalreplay.numbers.elo import fit as elo

REFERENCES = {"ref1000": 1000.0, "ref1150": 1150.0, "ref1300": 1300.0, "ref1450": 1450.0, "ref1600": 1600.0}
TRUTH = 1350.0


def make_rows(tasks: int, per_pair: int, seed: int) -> list[tuple[str, str, float]]:
    names = sorted(REFERENCES)
    rng = np.random.default_rng(seed)
    scores = elo.simulate_scores(
        rng, TRUTH, [REFERENCES[n] for n in names], tasks, per_pair, task_correlation=0.3
    )
    task_ids = [f"task{t:06d}" for t in range(tasks)]
    return [
        (task_ids[t], names[j], s)
        for t in range(tasks)
        for j in range(len(names))
        for s in scores[t, j].tolist()
    ]


def raw_arrays(rows: list[tuple[str, str, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: its task's index, its reference's rating, the score."""
    index: dict[str, int] = {}
    tasks = np.fromiter((index.setdefault(r[0], len(index)) for r in rows), np.int64, len(rows))
    offsets = np.fromiter((REFERENCES[r[1]] for r in rows), float, len(rows))
    scores = np.fromiter((r[2] for r in rows), float, len(rows))
    return tasks, offsets, scores


def raw_fit(offsets: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None) -> float:
    """The maximum-likelihood rating on raw rows: a logistic regression with the
    references' ratings as fixed offsets (the mean loss, in logits, for conditioning)."""
    w = np.ones_like(scores) if weights is None else weights
    total = w.sum()

    def loss(x: np.ndarray) -> tuple[float, np.ndarray]:
        z = x[0] - elo.SLOPE * offsets
        value = -np.sum(w * (scores * special.log_expit(z) + (1 - scores) * special.log_expit(-z))) / total
        grad = -np.sum(w * (scores - special.expit(z))) / total
        return float(value), np.array([grad])

    start = np.array([elo.SLOPE * float(np.mean(offsets))])
    result = optimize.minimize(
        loss, start, jac=True, method="L-BFGS-B", options={"gtol": 1e-12, "ftol": 1e-15}
    )
    return float(result.x[0] / elo.SLOPE)


@dataclass(frozen=True)
class Timing:
    """Median wall and CPU seconds. On a busy machine the CPU time is the better
    guide to the wall time on a quiet one (the work is single-threaded but for BLAS)."""

    wall: float
    cpu: float

    def __add__(self, other: Timing) -> Timing:
        return Timing(self.wall + other.wall, self.cpu + other.cpu)

    def __mul__(self, factor: float) -> Timing:
        return Timing(self.wall * factor, self.cpu * factor)

    def __str__(self) -> str:
        return f"{self.wall:.3f} (CPU {self.cpu:.3f})"


def timed(fn: Callable[[], Any], repeats: int) -> tuple[Timing, Any]:
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return Timing(statistics.median(walls), statistics.median(cpus)), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--per-pair", type=int, default=20, help="judgments per task and reference")
    parser.add_argument("--boot", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--raw-boot", type=int, default=3, help="raw bootstrap refits actually timed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rows = make_rows(args.tasks, args.per_pair, args.seed)
    print(f"{len(rows):,} judged rows: {args.tasks:,} tasks x {len(REFERENCES)} references x {args.per_pair}")

    t_tab, table = timed(lambda: elo.tabulate(rows, REFERENCES), args.repeats)
    t_point, point = timed(lambda: elo.fit_elo(table, n_boot=0), args.repeats)
    t_fit, fit = timed(lambda: elo.fit_elo(table, n_boot=args.boot, seed=args.seed), args.repeats)
    ours = t_tab + t_fit

    t_arrays, (task_of, offsets, scores) = timed(lambda: raw_arrays(rows), args.repeats)
    t_raw_fit, raw_rating = timed(lambda: raw_fit(offsets, scores), args.repeats)
    raw = t_arrays + t_raw_fit

    rng = np.random.default_rng(args.seed)

    def raw_refit() -> float:
        drawn = np.bincount(rng.integers(0, args.tasks, size=args.tasks), minlength=args.tasks)
        return raw_fit(offsets, scores, drawn[task_of].astype(float))

    t_refit, _ = timed(raw_refit, args.raw_boot)
    raw_with_interval = raw + t_refit * args.boot

    lo, hi = fit.ci95
    print(
        f"rating {fit.rating:.3f}, Fisher SE {fit.se:.3f}, 95% interval [{lo:.3f}, {hi:.3f}], truth {TRUTH:g}"
    )
    print(f"raw-row fit: {raw_rating:.3f} (differs from ours by {abs(raw_rating - point.rating):.2g})")
    print(f"\nmedian of {args.repeats}, wall seconds (CPU seconds); load average {os.getloadavg()[0]:.1f}")
    print(f"  ours: tabulate {t_tab} + fit and {args.boot} bootstrap refits {t_fit} = {ours}")
    print(f"        (the point fit and SE alone: {t_point})")
    print(f"  raw:  rows to arrays {t_arrays} + one fit {t_raw_fit} = {raw}")
    print(
        f"  raw with an interval: {raw_with_interval} "
        f"({args.boot} refits at {t_refit} each, {args.raw_boot} timed)"
    )
    print(
        f"\nours / raw fit (no interval): {ours.wall / raw.wall:.2f}x the time "
        f"(CPU {ours.cpu / raw.cpu:.2f}x)"
    )
    print(f"raw with an interval / ours: {raw_with_interval.wall / ours.wall:.0f}x the time")
    verdict = "met" if ours.wall < 1 else "NOT met"
    print(f"goal, ours under 1 s with its interval: {verdict} ({ours.wall:.3f} s wall, {ours.cpu:.3f} s CPU)")


if __name__ == "__main__":
    main()
