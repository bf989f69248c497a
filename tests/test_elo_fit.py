"""The ELO fit: aggregation, the maximum-likelihood rating, its bounds, the
task bootstrap, the paired comparison and the JSON pieces, checked against
closed forms, a brute-force optimiser and seeded simulations with a known truth."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, special

from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.numbers.elo import bootstrap as elo_bootstrap
from pytest_evalreplay.numbers.elo import fit as elo
from pytest_evalreplay.numbers.elo import solve as elo_solve
from pytest_evalreplay.numbers.elo.fit import EloFit, fit_elo
from pytest_evalreplay.numbers.elo.table import Judgment, JudgmentTable, ReferenceCounts, tabulate

REFS = {"r1000": 1000.0, "r1150": 1150.0, "r1300": 1300.0, "r1450": 1450.0, "r1600": 1600.0}
NAMES = sorted(REFS)
LO, HI = 1000.0 - elo_solve.DEFAULT_MARGIN, 1600.0 + elo_solve.DEFAULT_MARGIN


def score_rows(scores: np.ndarray, names: Sequence[str] = NAMES) -> list[tuple[str, str, float]]:
    """Rows from a (T, J, K) score array: task t judged K times against each reference."""
    return [
        (f"t{t:04d}", names[j], score)
        for t, per_task in enumerate(scores.tolist())
        for j, per_ref in enumerate(per_task)
        for score in per_ref
    ]


def count_rows(counts: Mapping[str, tuple[int, int, int]], tasks: int = 3) -> list[Judgment]:
    """Rows with the given (wins, ties, losses) per reference, dealt over `tasks` tasks."""
    rows = []
    for ref, record in counts.items():
        for score, n in zip((1.0, 0.5, 0.0), record, strict=True):
            rows.extend(Judgment(f"t{len(rows) % tasks}", ref, score) for _ in range(n))
    return rows


def raw_loglik(r: float, rows: Sequence[Sequence[Any]]) -> float:
    z = np.array([elo_solve.SLOPE * (r - REFS[row[1]]) for row in rows])
    y = np.array([row[2] for row in rows], dtype=float)
    return float(np.sum(y * special.log_expit(z) + (1 - y) * special.log_expit(-z)))


def simulated_table(
    rng: np.random.Generator, truth: float, tasks: int, per_pair: int, **kw: float
) -> JudgmentTable:
    scores = elo.simulate_scores(rng, truth, [REFS[n] for n in NAMES], tasks, per_pair, **kw)
    return tabulate(score_rows(scores), REFS)


# --- aggregation ---------------------------------------------------------------------------------


def test_tabulate_counts_per_task_and_reference() -> None:
    rows = [
        ("b", "r1000", 1.0),
        ("a", "r1000", 0.5),
        ("a", "r1300", 0),
        ("a", "r1000", 1),
        ("b", "r1300", 0.0),
    ]
    table = tabulate(rows, REFS)
    assert table.task_ids == ("a", "b")
    assert table.references == ("r1000", "r1300")  # only the references judged
    assert table.elos.tolist() == [1000.0, 1300.0]
    assert table.score_sums.tolist() == [[1.5, 0.0], [1.0, 0.0]]
    assert table.counts.tolist() == [[2.0, 1.0], [1.0, 1.0]]
    assert table.num_judgments == 5
    assert table.reference_counts() == (
        ReferenceCounts("r1000", 1000.0, wins=2, ties=1, losses=0),
        ReferenceCounts("r1300", 1300.0, wins=0, ties=0, losses=2),
    )
    assert table.reference_counts()[0].score == pytest.approx(2.5 / 3)


def test_tabulate_is_independent_of_row_order() -> None:
    rows = count_rows({"r1000": (3, 1, 2), "r1450": (1, 2, 4)}, tasks=4)
    a, b = tabulate(rows, REFS), tabulate(rows[::-1], REFS)
    assert a.task_ids == b.task_ids and a.references == b.references
    assert np.array_equal(a.outcomes, b.outcomes)


@pytest.mark.parametrize(
    ("row", "words"),
    [
        (("t", "nobody", 1.0), ["reference 'nobody'", "r1000, r1150"]),
        (("t", ["r1000"], 1.0), ["reference ['r1000']"]),
        (("t", "r1000", 0.7), ["score 0.7", "1 (win), 0.5 (tie) or 0 (loss)"]),
        (("t", "r1000", math.nan), ["score nan"]),
        (("t", "r1000", "1"), ["score '1'"]),
        (("t", "r1000", None), ["score None"]),
        ((7, "r1000", 1.0), ["task id 7", "string"]),
    ],
)
def test_tabulate_rejects_bad_rows(row: tuple[object, ...], words: list[str]) -> None:
    with pytest.raises(EvalReplayError) as info:
        tabulate([("ok", "r1000", 1.0), row], REFS)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(
    ("refs", "words"),
    [({}, "no references"), ({"a": math.inf}, "reference 'a'"), ({"a": "x"}, "finite number")],
)
def test_references_must_be_rated(refs: dict[str, object], words: str) -> None:
    with pytest.raises(EvalReplayError, match=words):
        tabulate([], refs)  # type: ignore[arg-type]


# --- the fit -------------------------------------------------------------------------------------


def test_no_rows_is_no_rating() -> None:
    fit = fit_elo(tabulate([], REFS))
    assert (fit.rating, fit.se, fit.ci95, fit.bound) == (None, None, (None, None), None)
    assert fit.num_tasks == 0 and fit.num_judgments == 0
    assert fit.note is not None and "no rating" in fit.note


def test_single_reference_has_the_closed_form() -> None:
    # One reference: the rating solves p(r) = mean score, r = elo + 400 log10(S / (N - S)).
    fit = fit_elo(tabulate(count_rows({"r1300": (6, 2, 2)}), REFS), n_boot=0)
    assert fit.rating == pytest.approx(1300 + 400 * math.log10(7 / 3), abs=1e-6)
    p = 0.7
    assert fit.se == pytest.approx(1 / (elo_solve.SLOPE * math.sqrt(10 * p * (1 - p))), rel=1e-6)


def test_all_ties_rate_at_the_references() -> None:
    single = fit_elo(tabulate(count_rows({"r1150": (0, 5, 0)}), REFS), n_boot=0)
    assert single.rating == pytest.approx(1150.0, abs=1e-6) and single.bound is None
    spread = fit_elo(tabulate(count_rows({"r1000": (0, 4, 0), "r1600": (0, 4, 0)}), REFS), n_boot=0)
    assert spread.rating == pytest.approx(1300.0, abs=1e-6)


def test_fit_matches_brute_force_on_raw_rows() -> None:
    rng = np.random.default_rng(3)
    rows = score_rows(elo.simulate_scores(rng, 1380.0, [REFS[n] for n in NAMES], 30, 2))
    fit = fit_elo(tabulate(rows, REFS), n_boot=0)
    best = optimize.minimize_scalar(lambda r: -raw_loglik(r, rows), bounds=(LO, HI), method="bounded")
    assert fit.rating == pytest.approx(best.x, abs=1e-3)
    # The SE is the inverse root of the curvature of the log-likelihood at the optimum.
    assert fit.rating is not None
    h = 1e-2
    curvature = (
        raw_loglik(fit.rating + h, rows) - 2 * raw_loglik(fit.rating, rows) + raw_loglik(fit.rating - h, rows)
    )
    assert fit.se == pytest.approx(1 / math.sqrt(-curvature / h**2), rel=1e-4)


def test_vectorised_solver_matches_a_scalar_root_finder() -> None:
    rng = np.random.default_rng(11)
    e = np.array([REFS[n] for n in NAMES])
    counts = rng.integers(0, 6, size=(300, 5)).astype(float)
    sums = np.floor(rng.random((300, 5)) * (2 * counts + 1)) / 2  # 0 .. N in halves
    ratings, codes = elo_solve.solve_ratings(sums, counts, e, LO, HI)
    for s, n, r, code in zip(sums, counts, ratings, codes, strict=True):
        if n.sum() == 0:
            assert math.isnan(r)
            continue

        def score(x: float, s: np.ndarray = s, n: np.ndarray = n) -> float:
            return float(np.sum(s - n * special.expit(elo_solve.SLOPE * (x - e))))

        if score(HI) >= 0:
            assert (r, code) == (HI, 1)
        elif score(LO) <= 0:
            assert (r, code) == (LO, -1)
        else:
            assert code == 0 and r == pytest.approx(optimize.brentq(score, LO, HI, xtol=1e-9), abs=1e-5)


def test_all_wins_is_an_upper_bound_with_an_exact_lower_limit() -> None:
    counts = {"r1000": (4, 0, 0), "r1450": (3, 0, 0)}
    fit = fit_elo(tabulate(count_rows(counts), REFS))
    assert (fit.rating, fit.bound, fit.se, fit.interval) == (1450.0 + 400, "upper", None, "exact")
    limit, open_end = fit.ci95
    assert open_end is None and limit is not None and limit < 1450.0 + 400
    # At the limit, winning all 7 has probability 5%.
    p = special.expit(elo_solve.SLOPE * (limit - np.array([1000.0, 1450.0])))
    assert 4 * math.log(p[0]) + 3 * math.log(p[1]) == pytest.approx(math.log(0.05), abs=1e-6)
    assert fit.note is not None and "scored 7 of 7" in fit.note and "lower limit" in fit.note


def test_all_losses_is_a_lower_bound_with_an_exact_upper_limit() -> None:
    fit = fit_elo(tabulate(count_rows({"r1150": (0, 0, 9)}), REFS))
    assert (fit.rating, fit.bound, fit.se) == (1150.0 - 400, "lower", None)  # the judged references' range
    open_end, limit = fit.ci95
    assert open_end is None and limit is not None
    sweep_loglik = 9 * math.log(1 - special.expit(elo_solve.SLOPE * (limit - 1150.0)))
    assert sweep_loglik == pytest.approx(math.log(0.05))


def test_a_rating_beyond_the_range_is_clamped_with_a_profile_limit() -> None:
    # 200 wins and a tie against the top reference: the maximum is finite but far above it.
    fit = fit_elo(tabulate(count_rows({"r1600": (200, 1, 0)}), REFS))
    assert (fit.rating, fit.bound, fit.interval) == (2000.0, "upper", "profile")
    assert fit.ci95 == (2000.0, None)  # the limit lies beyond the range: capped at its edge
    rows = count_rows({"r1600": (8, 1, 0)})
    near = fit_elo(tabulate(rows, REFS))
    limit = near.ci95[0]
    assert near.bound == "upper" and limit is not None and 1600 < limit < 2000
    # The log-likelihood 95% one-sided drop from the unclamped maximum, 1600 + 400 log10(8.5 / 0.5).
    peak = 1600 + 400 * math.log10(8.5 / 0.5)
    assert raw_loglik(peak, rows) - raw_loglik(limit, rows) == pytest.approx(1.644854**2 / 2)


def test_margin_sets_the_range() -> None:
    fit = fit_elo(tabulate(count_rows({"r1300": (5, 0, 0)}), REFS), margin=100.0)
    assert fit.rating == 1400.0
    with pytest.raises(EvalReplayError, match="margin"):
        fit_elo(tabulate(count_rows({"r1300": (5, 0, 0)}), REFS), margin=0.0)


def test_one_task_gets_a_fisher_interval_and_says_so() -> None:
    fit = fit_elo(tabulate(count_rows({"r1300": (5, 3, 4)}, tasks=1), REFS))
    assert fit.interval == "fisher" and fit.note is not None and "one task" in fit.note
    assert fit.rating is not None and fit.se is not None
    assert fit.ci95 == pytest.approx((fit.rating - 1.959964 * fit.se, fit.rating + 1.959964 * fit.se))


# --- bootstrap -----------------------------------------------------------------------------------


def test_bootstrap_weights_resample_tasks() -> None:
    chunks = list(elo_bootstrap._task_weights(7, 25, seed=4))
    weights = np.vstack(chunks)
    assert weights.shape == (25, 7)
    assert np.all(weights.sum(axis=1) == 7)  # each resample draws T tasks
    assert np.array_equal(weights, np.vstack(list(elo_bootstrap._task_weights(7, 25, seed=4))))
    assert not np.array_equal(weights, np.vstack(list(elo_bootstrap._task_weights(7, 25, seed=5))))


def test_bootstrap_equals_refitting_each_resample() -> None:
    table = simulated_table(np.random.default_rng(8), 1250.0, 12, 2)
    boot = elo_bootstrap.bootstrap_ratings([table], n_boot=20, seed=1)[0]
    weights = np.vstack(list(elo_bootstrap._task_weights(12, 20, seed=1)))
    for w, r in zip(weights, boot, strict=True):
        rows = [
            (f"{task}#{copy}", ref, score)
            for task, times in zip(table.task_ids, w.astype(int), strict=True)
            for copy in range(times)
            for ref, (lo, ti, wi) in zip(
                table.references, table.outcomes[table.task_ids.index(task)], strict=True
            )
            for score, n in ((1.0, wi), (0.5, ti), (0.0, lo))
            for _ in range(n)
        ]
        assert fit_elo(tabulate(rows, REFS), n_boot=0).rating == pytest.approx(r, abs=1e-6)


def test_bootstrap_interval_is_seeded() -> None:
    table = simulated_table(np.random.default_rng(9), 1420.0, 25, 2)
    a, b, c = fit_elo(table, seed=3), fit_elo(table, seed=3), fit_elo(table, seed=4)
    assert a == b
    assert a.ci95 != c.ci95 and a.rating == c.rating
    assert a.interval == "bootstrap"
    lo, hi = a.ci95
    assert lo is not None and hi is not None and lo < a.rating < hi  # type: ignore[operator]


def test_the_interval_covers_the_truth_95_percent_of_the_time() -> None:
    """Statistical validity: 200 seeded evaluations of a candidate of known rating
    against 5 references (1000..1600), 40 tasks x 2 judgments per reference, ties
    about 20% at even odds, and judgments of one task correlated. The task
    bootstrap's 95% interval must cover the truth 92-98% of the time; the
    Fisher interval, blind to the correlation, covers clearly less."""
    rng = np.random.default_rng(2027)
    reps = 200
    truths = rng.uniform(1100, 1500, size=reps)
    covered = fisher_covered = 0
    errors, ses, boot_sds = [], [], []
    for rep, truth in enumerate(truths):
        fit = fit_elo(simulated_table(rng, truth, 40, 2, task_correlation=0.5), seed=rep)
        assert fit.rating is not None and fit.se is not None and fit.bound is None
        lo, hi = fit.ci95
        assert lo is not None and hi is not None
        covered += lo <= truth <= hi
        fisher_covered += abs(fit.rating - truth) <= 1.959964 * fit.se
        errors.append(fit.rating - truth)
        ses.append(fit.se)
        boot_sds.append((hi - lo) / (2 * 1.959964))
    err = np.array(errors)
    assert 0.92 <= covered / reps <= 0.98
    assert fisher_covered / reps < 0.92
    assert abs(err.mean()) < np.mean(ses)  # no bias beyond one SE ...
    assert abs(err.mean()) < 3 * err.std() / math.sqrt(reps)  # ... nor any the 200 runs can detect
    # ... and the bootstrap's spread is the estimate's real spread.
    assert np.mean(boot_sds) == pytest.approx(err.std(), rel=0.2)


def test_without_task_correlation_the_fisher_se_is_the_real_spread() -> None:
    rng = np.random.default_rng(77)
    truths = rng.uniform(1100, 1500, size=200)
    fits = [fit_elo(simulated_table(rng, t, 40, 2, tie_rate=0.0), n_boot=0) for t in truths]
    err = np.array([f.rating for f in fits]) - truths  # type: ignore[operator]
    ses = np.array([f.se for f in fits], dtype=float)
    assert np.mean(np.abs(err) <= 1.959964 * ses) == pytest.approx(0.95, abs=0.03)
    assert np.mean(ses) == pytest.approx(err.std(), rel=0.15)


# --- paired comparison ---------------------------------------------------------------------------


def test_comparing_a_run_with_itself_shows_no_drop() -> None:
    table = simulated_table(np.random.default_rng(5), 1300.0, 20, 2)
    cmp = elo.compare_ratings(table, table)
    assert (cmp.num_tasks, cmp.drop, cmp.p_value, cmp.ci95) == (20, 0.0, 1.0, (0.0, 0.0))
    assert cmp.current == cmp.baseline == fit_elo(table, n_boot=0).rating


def test_comparison_uses_only_shared_tasks() -> None:
    rng = np.random.default_rng(6)
    current = tabulate(score_rows(elo.simulate_scores(rng, 1300.0, list(REFS.values()), 30, 1)), REFS)
    baseline = tabulate(score_rows(elo.simulate_scores(rng, 1350.0, list(REFS.values()), 20, 1)), REFS)
    cmp = elo.compare_ratings(current, baseline, n_boot=200)
    shared = current.select(baseline.task_ids)
    assert cmp.num_tasks == 20
    assert cmp.current == fit_elo(shared, n_boot=0).rating
    assert cmp.drop == pytest.approx(cmp.baseline - cmp.current)  # type: ignore[operator]


def test_comparison_without_enough_shared_tasks_cannot_fail_a_gate() -> None:
    table = tabulate(count_rows({"r1300": (9, 0, 1)}, tasks=1), REFS)
    other = tabulate([("elsewhere", "r1300", 0.0)], REFS)
    none = elo.compare_ratings(table, other)
    assert (none.num_tasks, none.drop, none.p_value) == (0, None, 1.0)
    weaker = tabulate(count_rows({"r1300": (1, 0, 9)}, tasks=1), REFS)
    one = elo.compare_ratings(weaker, table)
    assert one.num_tasks == 1 and one.drop is not None and one.drop > 0 and one.p_value == 1.0
    with pytest.raises(EvalReplayError, match="n_boot"):
        elo.compare_ratings(table, table, n_boot=0)


def test_paired_p_value_is_calibrated_and_has_power() -> None:
    """Under no change, p < 0.05 about 5% of the time; a real 100-point drop is found."""
    rng = np.random.default_rng(31)
    elos = list(REFS.values())

    def run(truth: float) -> JudgmentTable:
        return tabulate(score_rows(elo.simulate_scores(rng, truth, elos, 40, 2)), REFS)

    null = [elo.compare_ratings(run(1300.0), run(1300.0), n_boot=200, seed=i).p_value for i in range(200)]
    assert 0.01 <= np.mean(np.array(null) < 0.05) <= 0.10
    drops = [elo.compare_ratings(run(1250.0), run(1350.0), n_boot=200, seed=i) for i in range(50)]
    assert np.mean([d.p_value < 0.05 for d in drops]) >= 0.8
    assert np.mean([d.ci95[0] <= 100 <= d.ci95[1] for d in drops]) >= 0.85  # type: ignore[operator]


# --- JSON ----------------------------------------------------------------------------------------


def _finite_or_none(value: object) -> bool:
    if isinstance(value, dict):
        return all(_finite_or_none(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite_or_none(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


@pytest.mark.parametrize(
    "rows",
    [
        [],
        count_rows({"r1000": (5, 0, 0)}),
        count_rows({"r1600": (0, 0, 5)}),
        count_rows({"r1300": (4, 2, 3), "r1450": (2, 1, 5)}, tasks=6),
        count_rows({"r1300": (4, 2, 3)}, tasks=1),
    ],
)
def test_fit_json_is_strict(rows: list[Judgment]) -> None:
    fit = fit_elo(tabulate(rows, REFS), n_boot=100)
    block = elo.fit_to_json(fit)
    assert _finite_or_none(block)
    assert set(block) >= {"rating", "se", "ci95", "bound", "references"}
    assert len(block["ci95"]) == 2
    assert orjson.loads(orjson.dumps(block)) == block
    assert [r["name"] for r in block["references"]] == [c.name for c in fit.counts]


def test_nan_never_reaches_json() -> None:
    fit = EloFit(math.nan, math.inf, (-math.inf, math.nan), None, "fisher", (), 0)
    block = elo.fit_to_json(fit)
    assert block["rating"] is None and block["se"] is None and block["ci95"] == [None, None]


def test_table_json_round_trips() -> None:
    table = simulated_table(np.random.default_rng(12), 1200.0, 8, 3)
    data = orjson.loads(orjson.dumps(elo.table_to_json(table)))
    back = elo.table_from_json(data, "baseline.json: tasks.duel.elo")
    assert back.task_ids == table.task_ids and back.references == table.references
    assert np.array_equal(back.outcomes, table.outcomes) and np.array_equal(back.elos, table.elos)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ([], "expected"),
        ({"tasks": {}}, "'references'"),
        ({"references": {"a": 1000}, "tasks": {"t": {"a": [1, 2]}}}, "[wins, ties, losses]"),
        ({"references": {"a": 1000}, "tasks": {"t": {"a": [1, -2, 0]}}}, "three counts"),
        ({"references": {"a": 1000}, "tasks": {"t": {"b": [1, 0, 0]}}}, "reference 'b'"),
        ({"references": {"a": None}, "tasks": {}}, "reference 'a'"),
    ],
)
def test_table_json_rejects_bad_data(data: object, words: str) -> None:
    with pytest.raises(EvalReplayError) as info:
        elo.table_from_json(data, "base.json")
    assert str(info.value).startswith("base.json: ") and words in str(info.value)


# --- properties ----------------------------------------------------------------------------------

records = st.tuples(st.integers(0, 25), st.integers(0, 25), st.integers(0, 25))
count_maps = st.dictionaries(st.sampled_from(NAMES), records, min_size=1).filter(
    lambda d: sum(map(sum, d.values())) > 0
)


def _fit(counts: Mapping[str, tuple[int, int, int]]) -> EloFit:
    return fit_elo(tabulate(count_rows(counts), REFS), n_boot=0)


@settings(max_examples=100, deadline=None)
@given(count_maps, st.data())
def test_rating_is_monotone_in_wins(counts: dict[str, tuple[int, int, int]], data: st.DataObject) -> None:
    """Turning a loss into a tie or a win, or a tie into a win, never lowers the rating."""
    ref = data.draw(st.sampled_from(sorted(counts)))
    w, t, lo = counts[ref]
    moves = [m for m, ok in (("loss-tie", lo), ("loss-win", lo), ("tie-win", t)) if ok]
    if not moves:
        return
    move = data.draw(st.sampled_from(moves))
    better = dict(counts)
    better[ref] = {
        "loss-tie": (w, t + 1, lo - 1),
        "loss-win": (w + 1, t, lo - 1),
        "tie-win": (w + 1, t - 1, lo),
    }[move]
    before, after = _fit(counts), _fit(better)
    assert before.rating is not None and after.rating is not None
    assert after.rating >= before.rating - 1e-6
    if before.bound is None and after.bound is None:
        assert after.rating > before.rating


@settings(max_examples=100, deadline=None)
@given(count_maps)
def test_rating_is_finite_and_in_range(counts: dict[str, tuple[int, int, int]]) -> None:
    fit = _fit(counts)
    lo, hi = elo_solve.rating_range([REFS[name] for name, record in counts.items() if sum(record)])
    assert fit.rating is not None and lo <= fit.rating <= hi
    wins_only = all(t == lo == 0 for _, t, lo in counts.values())
    losses_only = all(w == t == 0 for w, t, _ in counts.values())
    if wins_only:
        assert (fit.bound, fit.rating, fit.se, fit.ci95[1]) == ("upper", hi, None, None)
        assert fit.ci95[0] is not None and fit.ci95[0] <= hi
    elif losses_only:
        assert (fit.bound, fit.rating, fit.se, fit.ci95[0]) == ("lower", lo, None, None)
        assert fit.ci95[1] is not None and fit.ci95[1] >= lo
    if fit.bound is None:
        assert fit.se is not None and math.isfinite(fit.se) and fit.se > 0
        assert all(end is None or math.isfinite(end) for end in fit.ci95)
    else:
        assert fit.se is None


@settings(max_examples=40, deadline=None)
@given(count_maps, st.randoms(use_true_random=False))
def test_fit_is_invariant_under_permuting_rows(
    counts: dict[str, tuple[int, int, int]], random: object
) -> None:
    rows = count_rows(counts, tasks=5)
    shuffled = list(rows)
    random.shuffle(shuffled)  # type: ignore[attr-defined]
    assert fit_elo(tabulate(shuffled, REFS), n_boot=50) == fit_elo(tabulate(rows, REFS), n_boot=50)
