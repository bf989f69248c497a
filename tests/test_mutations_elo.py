"""The bootstrap interval's small-sample expansion (elo_bootstrap.py): with T
tasks the plain percentile interval is too narrow (its resampling variance is (T-1)/T of
the true one), so fit_elo and compare_ratings move the 2.5% level to where a
normal quantile matches a t quantile with T-1 degrees of freedom scaled by
sqrt(T/(T-1)) (Hesterberg's expanded percentile interval). Each expected value
is computed here independently, from scipy.stats and the bootstrap replicates
themselves, so a one-line change of the expansion (its degrees of freedom, its
scale, the level it expands, the task count it uses) fails a test."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from pytest_evalreplay.numbers.elo import bootstrap as elo_bootstrap
from pytest_evalreplay.numbers.elo import fit as elo
from pytest_evalreplay.numbers.elo.bootstrap import bootstrap_ratings
from pytest_evalreplay.numbers.elo.fit import compare_ratings, fit_elo
from pytest_evalreplay.numbers.elo.table import JudgmentTable, tabulate

REFS = {"r1000": 1000.0, "r1200": 1200.0, "r1400": 1400.0, "r1600": 1600.0}
N_BOOT = 4000


def expanded(tail: float, tasks: int) -> float:
    """The tail level that stands for `tail` with `tasks` tasks, written out afresh."""
    return float(stats.norm.cdf(stats.t.ppf(tail, tasks - 1) * math.sqrt(tasks / (tasks - 1))))


def table(tasks: int, seed: int, truth: float = 1300.0) -> JudgmentTable:
    rng = np.random.default_rng(seed)
    scores = elo.simulate_scores(rng, truth, list(REFS.values()), tasks, 3, task_correlation=0.5)
    names = list(REFS)
    rows = [
        (f"t{t}", names[j], s)
        for t, per_task in enumerate(scores.tolist())
        for j, per_ref in enumerate(per_task)
        for s in per_ref
    ]
    return tabulate(rows, REFS)


@pytest.mark.parametrize(("tasks", "level"), [(2, 1.70e-72), (3, 6.83e-8), (5, 9.54e-4), (10, 8.55e-3)])
def test_the_expanded_tail_is_far_below_2_5_percent_at_few_tasks(tasks: int, level: float) -> None:
    assert elo_bootstrap.expanded_tail(0.025, tasks) == pytest.approx(expanded(0.025, tasks), rel=1e-9)
    assert elo_bootstrap.expanded_tail(0.025, tasks) == pytest.approx(level, rel=0.05)


def test_the_expansion_fades_as_tasks_grow() -> None:
    tails = [elo_bootstrap.expanded_tail(0.025, t) for t in (2, 3, 5, 10, 40, 200, 5000)]
    assert tails == sorted(tails) and all(t < 0.025 for t in tails)
    assert tails[-1] == pytest.approx(0.025, abs=2e-4)


@pytest.mark.parametrize("tasks", [4, 5, 8])
def test_a_few_tasks_bootstrap_interval_is_the_expanded_percentiles_of_the_replicates(tasks: int) -> None:
    t = table(tasks, seed=tasks)
    fit = fit_elo(t, n_boot=N_BOOT, seed=7)
    assert fit.interval == "bootstrap" and fit.bound is None and fit.num_tasks == tasks
    boot = bootstrap_ratings([t], N_BOOT, seed=7)[0]
    tail = expanded(0.025, tasks)
    lo, hi = np.quantile(boot, [tail, 1 - tail])
    assert fit.ci95 == pytest.approx((lo, hi), abs=1e-6)
    plain_lo, plain_hi = np.quantile(boot, [0.025, 0.975])
    assert lo < plain_lo - 1 and hi > plain_hi + 1  # widened on both sides, not just moved


def test_the_widening_is_larger_with_fewer_tasks() -> None:
    def widening(tasks: int) -> float:
        t = table(tasks, seed=1)
        boot = bootstrap_ratings([t], N_BOOT, seed=2)[0]
        lo, hi = fit_elo(t, n_boot=N_BOOT, seed=2).ci95
        assert lo is not None and hi is not None
        plain_lo, plain_hi = np.quantile(boot, [0.025, 0.975])
        return (hi - lo) / (plain_hi - plain_lo)

    few, many = widening(4), widening(60)
    assert few > 1.3 and 1.0 < many < 1.08 and few > many


def test_the_paired_comparison_uses_the_same_expansion_for_its_interval_and_p_value() -> None:
    tasks, seed = 5, 11
    cur, base = table(tasks, seed=1, truth=1250.0), table(tasks, seed=2, truth=1350.0)
    comparison = compare_ratings(cur, base, n_boot=N_BOOT, seed=seed)
    boot = bootstrap_ratings([cur, base], N_BOOT, seed=seed)
    drops = boot[1] - boot[0]
    tail = expanded(0.025, tasks)
    assert comparison.ci95 == pytest.approx(tuple(np.quantile(drops, [tail, 1 - tail])), abs=1e-6)
    share = (1 + np.count_nonzero(drops <= 0)) / (N_BOOT + 1)
    z = stats.norm.ppf(share) / math.sqrt(tasks / (tasks - 1))
    assert comparison.p_value == pytest.approx(stats.t.cdf(z, tasks - 1), rel=1e-9)
    assert comparison.p_value > share  # a few tasks make a drop less certain, never more


@pytest.mark.parametrize("tasks", [3, 5, 30])
@pytest.mark.parametrize("p", [0.001, 0.025, 0.3])
def test_the_p_value_mapping_inverts_the_interval_expansion(tasks: int, p: float) -> None:
    """So that p < 0.025 goes with an interval that excludes 0."""
    expanded_p = elo_bootstrap.expanded_tail(p, tasks)
    # scipy 1.10 inverts the t distribution to about 2.5e-9: 1e-6 still kills a mutated mapping
    assert elo_bootstrap.unexpanded_tail(expanded_p, tasks) == pytest.approx(p, rel=1e-6)
