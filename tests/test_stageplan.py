"""The stage re-plan policy of an EloEval (numbers/elo/stageplan.py), called
directly on plain data: which stage a resumed run plans afresh from, what it
says of each stage, when a recorded plan stands, and which seed draws the
tasks. The plugin-level cases are in tests/test_elo_plugin.py and
tests/test_elo_resume_rules.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalreplay.journal.stagelog import StageLog, StageRecord
from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.numbers.elo.stageplan import (
    check_kept_stages,
    choose_seed,
    replan_from,
    replays,
    same_rating,
    stage_of_first_incomplete,
)

FPS = ["f1", "f2", "f3"]
CONFIGS = [{"stage": 1, "tasks": 4}, {"stage": 2, "tasks": 4}, {"stage": 3, "tasks": 4}]


def record(stage: int, complete: bool = True, fp: str | None = None, run: str = "old") -> StageRecord:
    return StageRecord(
        stage=stage,
        task_ids=[f"t{stage}"],
        references=["mid", "weak"],
        prior_rating=None if stage == 1 else 1000.0 + stage,
        fingerprint=fp or FPS[stage - 1],
        config={"stage": stage, "tasks": 5} if fp else dict(CONFIGS[stage - 1]),
        run=run,
        lineno=stage,
        complete=complete,
        rating=1100.0 + stage if complete else None,
        se=40.0 if complete else None,
    )


def log(*records: StageRecord) -> StageLog:
    return StageLog(seed=7, stages={r.stage: r for r in records})


def plan(journal: StageLog, resuming: bool = True, resume_stage: int | None = None) -> tuple[int, list[str]]:
    first, lines = replan_from("memo", 3, resuming, resume_stage, journal, FPS, CONFIGS, lambda s: 10 * s)
    return first, [line.text for line in lines]


def test_kept_and_replayed_stages_are_said_once_the_run_drove_them() -> None:
    _, lines = replan_from(
        "memo", 3, True, None, log(record(1), record(2, complete=False)), FPS, CONFIGS, lambda s: 1
    )
    assert [(line.stage, line.provisional) for line in lines] == [(1, True), (2, True), (3, False)]


def test_a_fresh_run_plans_every_stage_and_says_nothing() -> None:
    assert plan(log(record(1), record(2)), resuming=False) == (1, [])


def test_resume_keeps_complete_stages_replays_a_started_one_and_waits_for_the_rest() -> None:
    first, lines = plan(log(record(1), record(2, complete=False)))
    assert first == 4
    assert lines == [
        "memo: stage 1/3 kept from the journal: ELO 1101.0 +- 40 (10 judged pairs)",
        "memo: stage 2/3 replayed from the journal: 1 tasks vs 2 references [mid, weak]",
        "memo: stage 3/3 not started yet",
    ]


def test_resume_plans_afresh_from_the_first_changed_stage_saying_what_changed() -> None:
    first, lines = plan(log(record(1), record(2, fp="other"), record(3)))
    assert first == 2
    assert lines[1:] == [
        "memo: stage 2/3 planned afresh (config changed: tasks)",
        "memo: stage 3/3 planned afresh (stage 2 changed)",
    ]


def test_resume_stage_n_keeps_the_stages_before_it_and_plans_the_rest_afresh() -> None:
    first, lines = plan(log(record(1), record(2), record(3)), resume_stage=2)
    assert first == 2
    assert lines[1:] == [
        "memo: stage 2/3 planned afresh (--resume-stage=2)",
        "memo: stage 3/3 planned afresh (--resume-stage=2)",
    ]


@pytest.mark.parametrize(
    ("journal", "first"),
    [
        (log(), 1),
        (log(record(1), record(2, complete=False)), 2),
        (log(record(1), record(2), record(3)), 4),
        (log(record(1, fp="other"), record(2), record(3)), 1),  # complete, but its configuration changed
        (log(record(1), record(2), record(3, fp="other")), 3),
    ],
)
def test_the_first_incomplete_stage_is_the_first_not_complete_with_its_current_fingerprint(
    journal: StageLog, first: int
) -> None:
    assert stage_of_first_incomplete(journal, FPS) == first


def test_a_bare_resume_stage_starts_at_a_stage_whose_configuration_changed() -> None:
    first, lines = plan(log(record(1), record(2, fp="other"), record(3)), resume_stage=0)
    assert first == 2
    assert lines[1] == "memo: stage 2/3 planned afresh (--resume-stage=2)"


def test_a_bare_resume_stage_with_every_stage_complete_says_it_has_nothing_to_run() -> None:
    first, lines = plan(log(record(1), record(2), record(3)), resume_stage=0)
    assert first == 4
    assert lines[0] == "memo: every stage is complete: --resume-stage has nothing to run again"


def test_resume_stage_beyond_the_last_stage_is_refused() -> None:
    with pytest.raises(EvalReplayError, match=r"^--resume-stage=4: 'memo' has only 3 stages$"):
        plan(log(record(1), record(2), record(3)), resume_stage=4)


@pytest.mark.parametrize(
    ("journal", "why"),
    [
        (log(record(1)), "it was never planned"),
        (log(record(1), record(2, complete=False)), "it is not complete"),
        (log(record(1), record(2, fp="other")), "its configuration changed (config changed: tasks)"),
    ],
)
def test_resume_stage_refuses_to_keep_a_stage_that_cannot_be_kept(journal: StageLog, why: str) -> None:
    with pytest.raises(EvalReplayError) as err:
        check_kept_stages("memo", journal, FPS, CONFIGS, 3)
    assert str(err.value) == (
        f"--resume-stage=3: 'memo' cannot keep stage 2: {why}; "
        "use --resume-stage=2 (or --resume) to run it again"
    )


def test_kept_stages_that_are_complete_and_unchanged_pass() -> None:
    check_kept_stages("memo", log(record(1), record(2)), FPS, CONFIGS, 3)


def decide(rec: StageRecord | None, run_id: str = "now", first_fresh: int = 4, resumes: bool = True, **kw):
    args = {"prior": rec.prior_rating if rec else None, "fingerprint": "f2", "task_ids": ["t2"]} | kw
    return replays(rec, 2, run_id, first_fresh, resumes, args["prior"], args["fingerprint"], args["task_ids"])


def test_a_recorded_plan_replays_when_resumed_with_the_same_rating_fingerprint_and_tasks() -> None:
    assert decide(record(2)) == "replay"
    assert decide(None) == "afresh"
    assert decide(record(2), resumes=False) == "afresh"  # a plain run plans every stage
    assert decide(record(2, run="now"), resumes=False) == "replay"  # this run's own plan stands
    assert decide(record(2), first_fresh=2) == "afresh"  # re-planned from this stage
    assert decide(record(2), fingerprint="other") == "afresh"
    assert decide(record(2), task_ids=["t9"]) == "afresh"
    assert decide(record(2), prior=1500.0) == "rating changed"
    assert decide(record(2), prior=1002.0 + 1e-9) == "replay"  # float noise of a re-fit


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6))
def test_a_rating_is_the_same_as_itself_and_never_as_none(rating: float) -> None:
    assert same_rating(rating, rating) and same_rating(None, None)
    assert not same_rating(rating, None) and not same_rating(None, rating)
    assert not same_rating(rating, rating + 1.0)


def test_the_seed_is_the_evals_own_then_recorded_then_saved_then_the_runs() -> None:
    asked: list[str] = []

    def lookup(name: str, seed: int | None):
        return lambda: asked.append(name) or seed

    assert choose_seed("memo", 1, lookup("recorded", 2), lookup("saved", 3), None, 4) == 1
    assert asked == []  # its own seed: the journal and saved run are not read
    assert choose_seed("memo", None, lookup("recorded", 2), lookup("saved", 3), None, 4) == 2
    assert asked == ["recorded"]
    assert choose_seed("memo", None, lookup("recorded", None), lookup("saved", 3), None, 4) == 3
    assert choose_seed("memo", None, lookup("recorded", None), lookup("saved", None), None, 4) == 4
    assert choose_seed("memo", None, lookup("recorded", None), lookup("saved", 3), "1/2", 4) == 3


def test_a_shard_without_a_seed_to_share_is_refused() -> None:
    with pytest.raises(
        EvalReplayError, match=r"--evalreplay-shard=1/2 would draw its own: give it EloEval\(seed"
    ):
        choose_seed("memo", None, lambda: None, lambda: None, "1/2", 4)
