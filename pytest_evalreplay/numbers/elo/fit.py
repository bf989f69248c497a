"""The rating of a candidate model from pairwise judgments against references
of known rating: what the rest of the package asks of the ELO statistics.

Here: the fit after each stage (`fit_elo`, `cumulative_fits`), the paired
comparison with a baseline (`compare_ratings`), the references a stage judges
against, a simulated judge for sizing budgets, and the JSON pieces that
metrics.json and the baseline keep. Beneath it, each with one job:
`elo_table` aggregates the judged rows per (task, reference), `elo_solve`
holds the Bradley-Terry likelihood with the references' ratings fixed and its
Newton solver, `elo_bootstrap` resamples tasks (not judgments: a task's
judgments share its difficulty) and expands the percentile interval for few
tasks. See docs/elo.md for the statistics.

Everything here is plain functions over plain data. numpy and scipy are
imported at the top: these modules are imported only when an `EloEval` exists.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy import special

from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.numbers.elo.bootstrap import (
    DEFAULT_BOOTSTRAP,
    bootstrap_ratings,
    check_bootstrap,
    percentile_interval,
    unexpanded_tail,
)
from pytest_evalreplay.numbers.elo.solve import (
    DEFAULT_MARGIN,
    SLOPE,
    information,
    one_sided_limit,
    rating_range,
    solve_ratings,
)
from pytest_evalreplay.numbers.elo.table import (
    JudgmentTable,
    ReferenceCounts,
    check_references,
    judged_table,
    tabulate,
)

_Z95 = 1.959963984540054  # two-sided 95% normal quantile

Bound = Literal["upper", "lower"]
IntervalKind = Literal["bootstrap", "fisher", "exact", "profile"]


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
    check_bootstrap(n_boot, seed)
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
        limit, kind = one_sided_limit(s_all, n_all, table.elos, code)
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
    se = float(1.0 / math.sqrt(information(ratings, n_all, table.elos)[0]))
    if n_boot == 0 or num_tasks < 2:
        note = None if n_boot == 0 else "one task: a Fisher interval, blind to correlation within the task"
        ci = _open_ends(rating - _Z95 * se, rating + _Z95 * se, lo, hi)
        return EloFit(rating, se, ci, None, "fisher", counts, num_tasks, note)
    boot = bootstrap_ratings([table], n_boot, seed, margin)[0]
    ci = _open_ends(*percentile_interval(boot, num_tasks), lo, hi)
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
    check_bootstrap(n_boot, seed)
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
    p_value = unexpanded_tail(float(share), len(shared))
    return EloComparison(len(shared), r_cur, r_base, drop, p_value, percentile_interval(drops, len(shared)))


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
    elo_of = check_references(references)
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
        elo_of = check_references(references)
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
    return judged_table(task_ids, names, np.array([elo_of[n] for n in names]), outcomes)
