"""An EloEval run is driven forward, stage by stage: plan -> generate ->
judge -> complete. These are the cases that broke when items pulled stages
into existence: edits that re-judge a stage, stopping, stale verdicts, the
counts on resume, and bad definitions."""

from __future__ import annotations

import math

import orjson
import pytest
from elo_project import REFERENCES, Project

from pytest_evalreplay import EloEval, EvalTask, Reference, Stage
from pytest_evalreplay.model import EvalReplayError


def refs(**elos: float) -> str:
    ratings = {name: elo for name, (elo, _) in REFERENCES.items()} | elos
    return (
        "{"
        + ", ".join(f"{n!r}: Reference({e}, 'refs/{n}-predictions.jsonl')" for n, e in ratings.items())
        + "}"
    )


@pytest.mark.parametrize(
    "edit",
    [
        {"references": refs(weak=950)},  # a known rating
        {"bad_value": "None  # a comment in the judge"},  # the judge's source
    ],
    ids=["reference-rating", "judge-source"],
)
def test_an_edit_that_changes_a_stage_fingerprint_rejudges_without_failing_equal_verdicts(pytester, edit):
    project = Project(pytester, seed="3")
    assert project.run().returncode == 0
    project.write(seed="3", **edit)
    result = project.run("--resume")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no verdicts were recorded" not in result.stdout
    clean = Project(pytester, at="clean", seed="3", **edit)
    assert clean.run().returncode == 0
    assert project.elo()["rating"] == clean.elo()["rating"]


def test_ctrl_c_in_the_provider_stops_an_elo_eval(pytester):
    project = Project(pytester, seed="3")
    result = project.run(INTERRUPT_AT_CALL="2")
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(project.log("calls.jsonl")) == 2  # nothing asked after the interrupt
    assert project.log("judge.jsonl") == []  # nothing judged
    assert not [r for r in project.stage_records() if r["kind"] == "complete"]
    result = project.run("--resume")
    assert result.returncode == 0, result.stdout + result.stderr
    assert all(s["complete"] for s in project.elo()["stages"])


def test_x_stops_after_the_first_failed_item_and_judges_no_later_stage(pytester):
    project = Project(pytester, seed="2", bad_value="0.7")  # t001 is in stage 1; its verdicts are bad
    result = project.run("-x")
    assert result.returncode == 1, result.stdout + result.stderr
    assert {r["stage"] for r in project.stage_records() if r["kind"] == "planned"} == {1}
    stages = project.elo()["stages"]
    assert "t001" in stages[0]["task_ids"]
    judged = {tid for tid, _, _ in project.log("judge.jsonl")}
    assert judged == set(stages[0]["task_ids"])


def test_resume_after_a_prompt_edit_says_how_many_were_regenerated_because_their_request_changed(pytester):
    project = Project(pytester, seed="3")
    assert project.run().returncode == 0
    project.write(seed="3", prompt="Question: {q}")
    for path in (project.path / "refs").glob("*-requests.jsonl"):  # the references answer the new prompt
        path.write_text(path.read_text().replace('"Q: ', '"Question: '))
    result = project.run("--resume")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "12 regenerated (request changed)" in result.stdout


def test_a_function_judge_is_called_again_on_kept_stages_so_no_stale_verdict_stays(pytester):
    (pytester.path / "judgehelp.py").write_text(
        "def verdict(mine, theirs):\n    return 0.5 if mine == theirs else float(mine)\n"
    )
    project = Project(pytester, seed="3", judge_helper="True")
    assert project.run().returncode == 0
    # The helper now says the candidate loses every pair: every verdict changes.
    (pytester.path / "judgehelp.py").write_text("def verdict(mine, theirs):\n    return 0.0\n")
    result = project.run("--resume")
    assert result.returncode == 0, result.stdout + result.stderr
    clean = Project(pytester, at="clean", seed="3", judge_helper="True")
    (clean.path / "judgehelp.py").write_text("def verdict(mine, theirs):\n    return 0.0\n")
    assert clean.run().returncode == 0
    assert project.elo()["rating"] == clean.elo()["rating"]
    assert [s["references"] for s in project.elo()["stages"]] == [
        s["references"] for s in clean.elo()["stages"]
    ]


def test_an_llm_judges_verdicts_are_reused_only_from_the_same_judge_model(pytester):
    project = Project(pytester, seed="4", judge="judges.llm('judgemodel')")
    assert project.run().returncode == 0
    asked = len(project.log("judge-model.jsonl"))
    assert project.run("--resume").returncode == 0
    assert len(project.log("judge-model.jsonl")) == asked  # same judge: nothing asked again
    result = project.run("--resume", JUDGE_MODEL="judge-2")  # the same judge kind, serving another model
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        len(project.log("judge-model.jsonl")) == 2 * asked
    )  # another judge model: every verdict asked again


def test_a_task_named_like_an_elo_evals_judge_files_is_a_collection_error(pytester):
    project = Project(pytester, seed="3", judge="judges.llm('judgemodel')")
    path = project.path / "test_elo.py"
    path.write_text(
        path.read_text() + "\nclash = EvalTask('memo-judge', [{'id': 'a', 'q': 'x'}], prompt='{q}')\n"
    )
    result = project.run()
    assert result.returncode in (2, 4), result.stdout + result.stderr
    out = result.stdout + result.stderr
    assert "'memo-judge'" in out and "memo" in out and "rename" in out


def test_a_hand_edited_plan_naming_an_unknown_reference_names_the_journal_line(pytester):
    project = Project(pytester, seed="3")
    result = project.run(KILL_AT_JUDGE="14")  # stage 2 planned, not complete
    assert result.returncode == -9
    journal = project.out / "memo-journal.jsonl"
    lines = journal.read_bytes().splitlines()
    at = next(n for n, x in enumerate(lines) if b'"planned"' in x and b'"stage":2' in x)
    row = orjson.loads(lines[at])
    row["references"] = ["ref-zzz"]
    lines[at] = orjson.dumps(row)
    journal.write_bytes(b"\n".join(lines) + b"\n")
    result = project.run("--resume")
    out = result.stdout + result.stderr
    assert "internal error" not in out and "INTERNALERROR" not in out
    assert f"memo-journal.jsonl:{at + 1}" in out and "ref-zzz" in out


POOL = [{"id": "a", "q": "x"}]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seed": 2**64}, "seed"),
        ({"seed": -5}, "seed"),
        ({"seed": True}, "seed"),
    ],
)
def test_bad_elo_seeds_are_refused_where_the_eval_is_defined(tmp_path, kwargs, message):
    pool = EvalTask("p", POOL, prompt="{q}", scorer=lambda text, inst: 1.0)
    ref = tmp_path / "r.jsonl"
    ref.write_text("")
    with pytest.raises(EvalReplayError, match=message):
        EloEval(
            "e",
            pool=pool,
            references={"r": Reference(1000, ref)},
            stages=[Stage()],
            judge=lambda i, a, b: 1,
            **kwargs,
        )


@pytest.mark.parametrize("elo", [math.inf, -math.inf, math.nan])
def test_a_reference_rating_must_be_finite(elo):
    with pytest.raises(EvalReplayError, match="finite"):
        Reference(elo, "r.jsonl")


def test_a_stage_asking_for_more_tasks_than_the_pool_has_says_so_plainly():
    from pytest_evalreplay.stages import draw_stage_tasks

    with pytest.raises(EvalReplayError) as err:
        draw_stage_tasks(["a"], [5], seed=1)
    assert str(err.value) == "stage 1 asks for 5 tasks but the pool has only 1; ask for at most 1"
    with pytest.raises(EvalReplayError) as err:
        draw_stage_tasks(["a", "b", "c"], [2, 5], seed=1)
    assert str(err.value) == (
        "stage 2 asks for 5 tasks but only 1 of the pool's 3 remain after stage 1; ask for at most 1"
    )


def test_unreadable_judge_replies_are_counted_judging_failures_never_silent_ties(pytester):
    project = Project(pytester, seed="4", judge="judges.llm('judgemodel')")
    result = project.run("--evalreplay-max-attempts=2", JUDGE_REPLY="I cannot decide.")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "unreadable verdict: 'I cannot decide.'" in result.stdout
    metrics = project.metrics()
    stage = metrics["elo"]["stages"][0]
    assert stage["judged"] == 0 and stage["ties"] == 0
    assert stage["unreadable"] == 4  # one per item: its first unreadable reply fails it
    assert "0 (4 unreadable replies)" in result.stdout
    assert metrics["num_failed"] == 12 and metrics["elo"]["rating"] is None
    assert not [r for r in project.stage_records() if r["kind"] == "complete"]
    # Each request was asked again once (the attempt cap), then failed.
    asked = project.log("judge-model.jsonl")
    assert asked and all(asked.count(x) == 2 for x in asked)


def test_unreadable_replies_kept_as_ties_when_the_judge_says_so_are_still_counted(pytester):
    project = Project(pytester, seed="4", judge="judges.llm('judgemodel', unreadable='tie')")
    result = project.run(JUDGE_REPLY="I cannot decide.")
    assert result.returncode == 0, result.stdout + result.stderr
    stages = project.elo()["stages"]
    assert stages[0]["ties"] == stages[0]["unreadable"] == 4 * 3 * 2  # tasks x references x trials
    assert "24 (24 unreadable replies)" in result.stdout  # the stage table


def test_verdicts_in_the_journal_are_judged_again_not_trusted_on_resume(pytester):
    project = Project(pytester, seed="3")
    assert project.run().returncode == 0
    rating = project.elo()["rating"]
    journal = project.out / "memo-journal.jsonl"
    rows = [orjson.loads(x) for x in journal.read_bytes().splitlines()]
    for row in rows:  # every verdict turned into a win, by hand
        if row["type"] == "score" and row.get("judgments"):
            row["judgments"] = {ref: [1.0 for _ in v] for ref, v in row["judgments"].items()}
            row["scores"] = dict.fromkeys(row["judgments"], 1.0)
    journal.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    result = project.run("--resume")
    assert result.returncode == 0, result.stdout + result.stderr
    assert project.elo()["rating"] == rating
