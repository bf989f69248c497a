"""Stage planning for ELO evaluation: which tasks each stage draws, which
references it judges against, the rating after each stage, and why choosing
references near the current rating pays (a seeded simulation).

`python tests/test_elo_planning.py` prints the adaptive-vs-uniform figures
quoted in docs/elo.md."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

import numpy as np
import pytest

from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.numbers.elo import fit as elo
from pytest_evalreplay.numbers.elo.fit import choose_references, cumulative_fits, fit_elo
from pytest_evalreplay.numbers.elo.table import Judgment, tabulate
from pytest_evalreplay.stages import draw_stage_tasks

POOL = [f"q{i:03d}" for i in range(50)]

# --- draw_stage_tasks ----------------------------------------------------------------------------


def test_stages_draw_disjoint_tasks_of_the_asked_sizes() -> None:
    stages = draw_stage_tasks(POOL, [10, 5, None], seed=1)
    assert [len(s) for s in stages] == [10, 5, 35]
    flat = [t for s in stages for t in s]
    assert sorted(flat) == POOL  # None took every task the earlier stages left
    assert len(set(flat)) == len(flat)


def test_the_draw_is_pinned() -> None:
    """The same seed draws the same tasks everywhere, forever: resumed and
    compared runs depend on it. A change here is a breaking change."""
    assert draw_stage_tasks(POOL[:10], [3, 2], seed=7) == [["q003", "q002", "q005"], ["q004", "q007"]]


def test_the_draw_is_the_same_in_another_process() -> None:
    code = (
        "from pytest_evalreplay.stages import draw_stage_tasks;"
        f"print(draw_stage_tasks({POOL!r}, [7, None], seed=42))"
    )
    # This process's string hashes are salted at random; the child's with a fixed salt.
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout == f"{draw_stage_tasks(POOL, [7, None], seed=42)}\n"


def test_the_draw_depends_on_the_seed_not_on_pool_order_or_later_stages() -> None:
    first = draw_stage_tasks(POOL, [8], seed=3)[0]
    assert draw_stage_tasks(POOL[::-1], [8], seed=3)[0] == first
    assert draw_stage_tasks(POOL, [8, 20, None], seed=3)[0] == first
    assert draw_stage_tasks(POOL, [8], seed=4)[0] != first


def test_every_task_is_equally_likely_to_be_drawn() -> None:
    hits = np.zeros(len(POOL))
    seeds = 2000
    for seed in range(seeds):
        for task in draw_stage_tasks(POOL, [10], seed=seed)[0]:
            hits[POOL.index(task)] += 1
    expected = seeds * 10 / len(POOL)  # 400 per task
    chi2 = float(np.sum((hits - expected) ** 2 / expected))
    assert chi2 < 85.4  # the 99.99% quantile of chi-square with 49 degrees of freedom


@pytest.mark.parametrize(
    ("sizes", "words"),
    [
        ([30, 30], ["stage 2 asks for 30 tasks", "only 20 of the pool's 50 remain", "at most 20"]),
        ([51], ["stage 1 asks for 51 tasks", "only 50"]),
        ([50, None], ["stage 2 takes every remaining pool task", "drew all 50"]),
        ([None, None], ["stage 2"]),
        ([0], ["stage 1: tasks=0"]),
        ([5, -1], ["stage 2: tasks=-1"]),
        ([2.5], ["stage 1: tasks=2.5"]),
        ([True], ["stage 1: tasks=True"]),
    ],
)
def test_impossible_stage_sizes_are_errors(sizes: list[object], words: list[str]) -> None:
    with pytest.raises(EvalReplayError) as info:
        draw_stage_tasks(POOL, sizes, seed=0)  # type: ignore[arg-type]
    for word in words:
        assert word in str(info.value)


def test_bad_pool_or_seed_is_an_error() -> None:
    with pytest.raises(EvalReplayError, match="'q001' twice"):
        draw_stage_tasks(["q001", "q002", "q001"], [1], seed=0)
    with pytest.raises(EvalReplayError, match="seed"):
        draw_stage_tasks(POOL, [1], seed="7")  # type: ignore[arg-type]


# --- choose_references ---------------------------------------------------------------------------

REFS = {"delta": 1450.0, "alpha": 1000.0, "echo": 1600.0, "charlie": 1300.0, "bravo": 1150.0}


def test_without_a_rating_or_k_every_reference_is_judged() -> None:
    everyone = ["alpha", "bravo", "charlie", "delta", "echo"]
    assert choose_references(REFS, None, 2) == everyone
    assert choose_references(REFS, 1320.0, None) == everyone


def test_the_k_nearest_references_nearest_first() -> None:
    assert choose_references(REFS, 1320.0, 2) == ["charlie", "delta"]
    assert choose_references(REFS, 2500.0, 3) == ["echo", "delta", "charlie"]
    assert choose_references(REFS, 1320.0, 9) == ["charlie", "delta", "bravo", "echo", "alpha"]


def test_ties_are_broken_by_name() -> None:
    refs = {"zed": 1100.0, "amy": 1300.0, "bob": 1300.0, "cid": 1500.0}
    assert choose_references(refs, 1200.0, 1) == ["amy"]  # amy, bob and zed are all 100 away
    assert choose_references(refs, 1200.0, 3) == ["amy", "bob", "zed"]


@pytest.mark.parametrize("k", [0, -2, 1.5, True, "3"])
def test_k_must_be_a_positive_int(k: object) -> None:
    with pytest.raises(EvalReplayError, match="positive int"):
        choose_references(REFS, 1300.0, k)  # type: ignore[arg-type]


def test_the_rating_must_be_finite() -> None:
    with pytest.raises(EvalReplayError, match="finite"):
        choose_references(REFS, float("nan"), 2)


# --- cumulative fits -----------------------------------------------------------------------------


def _staged_rows() -> list[Judgment]:
    rng = np.random.default_rng(0)
    rows = []
    for stage, tasks in enumerate(draw_stage_tasks(POOL, [10, 10, 10], seed=5), start=1):
        scores = elo.simulate_scores(rng, 1350.0, [REFS[n] for n in sorted(REFS)], len(tasks), 2)
        for t, task in enumerate(tasks):
            for j, name in enumerate(sorted(REFS)):
                rows.extend(Judgment(task, name, float(s), stage) for s in scores[t, j])
    return rows


def test_each_stage_is_fitted_on_the_stages_up_to_it() -> None:
    rows = _staged_rows()
    fits = cumulative_fits(rows, REFS, n_boot=200)
    assert len(fits) == 3
    for stage, fit in enumerate(fits, start=1):
        upto = [r for r in rows if r.stage <= stage]
        assert fit == fit_elo(tabulate(upto, REFS), n_boot=200)
        assert fit.num_tasks == 10 * stage
    assert fits[2].se < fits[1].se < fits[0].se  # type: ignore[operator]


def test_a_stage_without_judgments_repeats_the_fit_before_it() -> None:
    rows = [r for r in _staged_rows() if r.stage != 2]
    fits = cumulative_fits(rows, REFS, num_stages=4, n_boot=0)
    assert len(fits) == 4 and fits[1] == fits[0] and fits[3] == fits[2]
    empty = cumulative_fits([], REFS, num_stages=2)
    assert [f.rating for f in empty] == [None, None]
    with pytest.raises(EvalReplayError, match=r"stages are 1\.\.2"):
        cumulative_fits(rows, REFS, num_stages=2)


# --- adaptive vs uniform references --------------------------------------------------------------

WIDE = {f"m{e}": float(e) for e in range(800, 2001, 150)}  # 9 references, 800..2000
FIRST_STAGE = 12  # tasks, judged against every reference: 108 pairs
LATER_STAGES = 2  # each with 108 more pairs: 12 tasks x 9 references, or 36 tasks x 3


def run_budget(policy: str, truth: float, seed: int) -> elo.EloFit:
    """One 3-stage evaluation of a candidate rated `truth`, 324 judged pairs in all.

    "adaptive": stages 2-3 judge 36 tasks each against the 3 references nearest
    the rating so far; "uniform": every stage judges 12 tasks against all 9;
    "random": stages 2-3 judge 36 tasks each against 3 references drawn at random.
    """
    rng = np.random.default_rng(seed)
    later = FIRST_STAGE * len(WIDE) // 3
    sizes = [FIRST_STAGE] + [FIRST_STAGE if policy == "uniform" else later] * LATER_STAGES
    stages = draw_stage_tasks([f"q{i:03d}" for i in range(sum(sizes))], sizes, seed=seed)
    rows: list[Judgment] = []
    fit = None
    for number, tasks in enumerate(stages, start=1):
        if number == 1 or policy == "uniform":
            refs = choose_references(WIDE, None, None)
        elif policy == "adaptive":
            refs = choose_references(WIDE, fit.rating if fit else None, 3)
        else:
            refs = sorted(rng.choice(sorted(WIDE), size=3, replace=False))
        scores = elo.simulate_scores(rng, truth, [WIDE[r] for r in refs], len(tasks))
        rows += [
            Judgment(task, ref, float(scores[t, j, 0]), number)
            for t, task in enumerate(tasks)
            for j, ref in enumerate(refs)
        ]
        fit = fit_elo(tabulate(rows, WIDE), n_boot=0)
    assert fit is not None
    return fit


def compare_policies(reps: int, seed: int = 0) -> Mapping[str, tuple[float, float]]:
    """Mean SE and root-mean-square error of each policy over `reps` candidates
    rated uniformly in 1000..1800, on the same candidates and judge seeds."""
    truths = np.random.default_rng(seed).uniform(1000, 1800, size=reps)
    out = {}
    for policy in ("uniform", "random", "adaptive"):
        fits = [run_budget(policy, float(t), seed * 100_000 + i) for i, t in enumerate(truths)]
        assert all(f.bound is None and f.se is not None and f.rating is not None for f in fits)
        ses = np.array([f.se for f in fits], dtype=float)
        err = np.array([f.rating for f in fits], dtype=float) - truths
        out[policy] = (float(ses.mean()), float(np.sqrt(np.mean(err**2))))
    return out


def test_adaptive_references_give_a_smaller_se_on_the_same_budget() -> None:
    result = compare_policies(reps=60)
    assert result["adaptive"][0] < 0.9 * result["uniform"][0]
    assert result["adaptive"][0] < 0.9 * result["random"][0]


if __name__ == "__main__":
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    figures = compare_policies(reps)
    print(f"{reps} candidates rated uniformly in 1000..1800; 9 references 800..2000; 324 judged pairs each")
    for policy, (se, rmse) in figures.items():
        ratio = se / figures["uniform"][0]
        print(f"{policy:>9}: mean SE {se:6.2f}  RMSE {rmse:6.2f}  SE ratio to uniform {ratio:.3f}")
