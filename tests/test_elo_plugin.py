"""Multi-stage ELO evals as pytest users meet them: items per (task, stage,
rollout), stage plans in the journal, --resume after a SIGKILL mid-stage,
--resume-stage, xdist, replay, LLM judges and the ELO gate. Runs are in
process but for the kills and xdist (real `python -m pytest` processes)."""

from __future__ import annotations

import orjson
import pytest
from elo_project import Project, same_metrics


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Project:
    project = Project(tmp_path_factory.mktemp("uninterrupted"))
    result = project.run()
    assert result.returncode == 0, result.stdout + result.stderr
    return project


def test_one_item_per_task_stage_and_rollout_and_k_selects_a_stage(pytester):
    project = Project(pytester, seed="3")
    result = project.run("--collect-only")
    ids = [x for x in result.stdout.splitlines() if "::" in x]
    assert len(ids) == 12
    assert all(
        x.startswith("test_elo.py::memo::t") and x.endswith(("[s1-r0]", "[s2-r0]", "[s3-r0]")) for x in ids
    )
    result = project.run("--collect-only", "-k", "s2")
    assert len([x for x in result.stdout.splitlines() if "::" in x]) == 4


def test_the_run_dir_holds_the_rating_per_stage_and_the_plan(uninterrupted):
    elo = uninterrupted.elo()
    assert elo["rating"] is not None and elo["ci95"][0] < elo["rating"] < elo["ci95"][1]
    stages = elo["stages"]
    assert [s["stage"] for s in stages] == [1, 2, 3]
    assert stages[0]["references"] == ["mid", "strong", "weak"]
    assert len(stages[1]["references"]) == 2 and len(stages[2]["references"]) == 1
    assert stages[1]["prior_rating"] == pytest.approx(stages[0]["rating"])
    assert all(s["complete"] for s in stages)
    assert sum(len(s["task_ids"]) for s in stages) == 12
    assert len({t for s in stages for t in s["task_ids"]}) == 12  # drawn without replacement
    assert uninterrupted.metrics()["metrics"] == {"elo": elo["rating"]}
    kinds = [(r["kind"], r.get("stage")) for r in uninterrupted.stage_records()]
    assert kinds == [
        ("seed", None),
        ("planned", 1),
        ("complete", 1),
        ("planned", 2),
        ("complete", 2),
        ("planned", 3),
        ("complete", 3),
    ]


def test_a_seed_drawn_once_is_recorded_and_a_resumed_run_collects_the_same_items(uninterrupted, tmp_path):
    ids = [x for x in uninterrupted.run("--collect-only").stdout.splitlines() if "::" in x]
    seed = uninterrupted.stage_records()[0]["seed"]
    assert uninterrupted.elo()["seed"] == seed
    again = [x for x in uninterrupted.run("--collect-only").stdout.splitlines() if "::" in x]
    assert ids == again


def test_sigkill_in_stage_2_then_resume_replays_its_plan_and_ends_as_the_uninterrupted_run(
    pytester, uninterrupted
):
    project = Project(pytester)
    # The seed is drawn (seed=None), so pin this project's draw to the uninterrupted run's.
    seed = uninterrupted.stage_records()[0]["seed"]
    project.write(seed=str(seed))
    stage1 = 4 * 3  # stage 1: 4 tasks x 3 references
    result = project.run(KILL_AT_JUDGE=str(stage1 + 3))
    assert result.returncode == -9, result.stdout + result.stderr
    records = project.stage_records()
    assert [r["kind"] for r in records][-2:] == ["complete", "planned"] and records[-1]["stage"] == 2
    planned = records[-1]
    asked_before = project.log("calls.jsonl")
    result = project.run("--resume")
    assert result.returncode == 0, result.stdout + result.stderr
    # Stage 1 is kept: its plan and generations are reused (its function judge
    # is called again: cheap, and what it calls may have changed).
    stage1_tasks = set(uninterrupted.elo()["stages"][0]["task_ids"])
    asked_again = project.log("calls.jsonl")[len(asked_before) :]
    assert not {tid for tid, _, _ in asked_again} & stage1_tasks, "stage 1's candidate was asked again"
    assert "memo: stage 1/3 kept from the journal: ELO" in result.stdout
    assert "memo: stage 2/3 replayed from the journal: 4 tasks vs 2 references" in result.stdout
    assert [r for r in project.stage_records() if r["kind"] == "planned" and r["stage"] == 2] == [planned]
    assert same_metrics(project.metrics(), uninterrupted.metrics())
    for name in ("memo-predictions.jsonl", "memo-requests.jsonl"):
        assert (project.out / name).read_bytes() == (uninterrupted.out / name).read_bytes()


def test_sigkill_with_no_seed_then_resume_keeps_the_drawn_plan(pytester):
    project = Project(pytester)
    result = project.run(KILL_AT_JUDGE="14")
    assert result.returncode == -9
    seed = project.stage_records()[0]["seed"]
    planned = [r for r in project.stage_records() if r["kind"] == "planned"]
    result = project.run("--resume")
    assert result.returncode == 0, result.stdout + result.stderr
    assert project.elo()["seed"] == seed
    after = [r for r in project.stage_records() if r["kind"] == "planned"]
    assert after[: len(planned)] == planned


def test_a_stage_with_no_judged_pair_stays_incomplete(pytester):
    project = Project(pytester)
    project.write(judge="lambda instance, candidate, reference: 0.7", stages="[Stage(tasks=4)]")
    result = project.run()
    assert result.returncode == 1, result.stdout + result.stderr  # every verdict is a judging failure
    assert "stage 1 has no judged pair and stays incomplete" in result.stdout
    assert [r["kind"] for r in project.stage_records()] == ["seed", "planned"]
    stage = project.elo()["stages"][0]
    assert (stage["complete"], stage["judged"]) == (False, 0)
    assert project.elo()["rating"] is None


def test_resume_stage_keeps_earlier_stages_and_plans_the_rest_afresh(pytester):
    project = Project(pytester, seed="11")
    assert project.run().returncode == 0
    before = project.elo()
    asked = len(project.log("calls.jsonl"))
    project.write(
        seed="11", stages="[Stage(tasks=4), Stage(tasks=4, references=3), Stage(tasks=4, references=1)]"
    )
    result = project.run("--resume-stage=2")
    assert result.returncode == 0, result.stdout + result.stderr
    after = project.elo()
    assert after["stages"][0] == before["stages"][0]
    assert len(after["stages"][1]["references"]) == 3
    stage1 = set(before["stages"][0]["task_ids"])
    assert not {tid for tid, _, _ in project.log("calls.jsonl")[asked:]} & stage1
    assert "4 skipped" in result.stdout  # stage 1's items, reused


def test_resume_stage_plans_that_stage_again_when_nothing_changed(pytester):
    project = Project(pytester, seed="11")
    assert project.run().returncode == 0
    planned = [r for r in project.stage_records() if r["kind"] == "planned"]
    asked = len(project.log("calls.jsonl"))
    result = project.run("--resume-stage=2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "memo: stage 2/3 planned afresh (--resume-stage=2)" in result.stdout
    again = [r for r in project.stage_records() if r["kind"] == "planned"][len(planned) :]
    assert [r["stage"] for r in again] == [2, 3]
    stage2 = set(project.elo()["stages"][1]["task_ids"])
    assert {tid for tid, _, _ in project.log("calls.jsonl")[asked:]} == stage2 | set(
        project.elo()["stages"][2]["task_ids"]
    )


def test_resume_stage_refuses_when_an_earlier_stage_is_incomplete(pytester):
    project = Project(pytester, seed="11")
    assert project.run(KILL_AT_JUDGE="5").returncode == -9
    result = project.run("--resume-stage=2")
    assert result.returncode == 4
    assert "--resume-stage=2: 'memo' cannot keep stage 1: it is not complete" in result.stderr
    assert "use --resume-stage=1" in result.stderr


def test_resume_stage_without_n_continues_at_the_first_incomplete_stage(pytester):
    project = Project(pytester, seed="5")
    assert project.run(KILL_AT_JUDGE="16").returncode == -9
    result = project.run("--resume-stage")
    assert result.returncode == 0, result.stdout + result.stderr
    assert all(s["complete"] for s in project.elo()["stages"])


def test_a_changed_stage_config_starts_that_stage_fresh_and_says_what_changed(pytester):
    project = Project(pytester, seed="2")
    assert project.run().returncode == 0
    project.write(
        seed="2", stages="[Stage(tasks=4), Stage(tasks=4, references=2), Stage(tasks=4, references=2)]"
    )
    result = project.run("--resume")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "memo: stage 3/3 planned afresh (config changed: stages.3.references)" in result.stdout
    assert len(project.elo()["stages"][2]["references"]) == 2


def test_a_bad_verdict_is_a_judging_failure_never_a_loss(pytester):
    project = Project(pytester, seed="1", bad_value="0.7")
    result = project.run()
    assert result.returncode == 1
    assert "the judge returned 0.7; return 1 (win), 0.5 (tie) or 0 (loss)" in result.stdout
    metrics = project.metrics()
    assert metrics["num_failed"] == 1 and metrics["failed"][0].startswith("t001[")
    assert project.elo()["num_judgments"] == sum(s["judged"] for s in project.elo()["stages"])


def test_xdist_gives_the_same_plans_and_rating_as_a_serial_run(tmp_path, uninterrupted):
    pytest.importorskip("xdist")
    project = Project(tmp_path)
    project.write(seed=str(uninterrupted.stage_records()[0]["seed"]))
    result = project.run("-n", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert same_metrics(project.metrics(), uninterrupted.metrics())
    asked = [tuple(x[:2]) for x in project.log("calls.jsonl")]
    assert len(asked) == len(set(asked)) == 12
    # Each stage driven (judged) once, by one worker; the journal says which run drove it.
    assert len(project.log("judge.jsonl")) == 4 * 3 + 4 * 2 + 4 * 1
    assert [r["unit"] for r in project.journal_rows("memo") if r["type"] == "done"] == [
        "stage-1",
        "stage-2",
        "stage-3",
    ]


def test_replaying_an_elo_run_dir_gives_the_same_rating_with_no_seed(pytester, uninterrupted):
    project = Project(pytester)
    result = project.run(
        f"--evalreplay-predictions={uninterrupted.out}", f"--evalreplay-output={pytester.path / 're'}"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    replayed = orjson.loads((pytester.path / "re" / "memo-metrics.json").read_bytes())
    assert replayed["elo"]["rating"] == uninterrupted.elo()["rating"]
    assert replayed["elo"]["seed"] == uninterrupted.elo()["seed"]
    assert [s["task_ids"] for s in replayed["elo"]["stages"]] == [
        s["task_ids"] for s in uninterrupted.elo()["stages"]
    ]


def test_an_llm_judge_is_journaled_never_asked_again_and_replays_without_a_model(pytester):
    project = Project(pytester, seed="4", judge="judges.llm('judgemodel')")
    result = project.run()
    assert result.returncode == 0, result.stdout + result.stderr
    asked = project.log("judge-model.jsonl")
    assert len(asked) == (4 * 3 + 4 * 2 + 4 * 1) * 2  # items x references x 2 position-swapped trials
    assert (project.out / "memo-judge-predictions.jsonl").exists()
    assert (project.out / "memo-judge-requests.jsonl").exists()
    rating = project.elo()["rating"]
    judge_rows = [
        orjson.loads(x) for x in (project.out / "memo-judge-predictions.jsonl").read_bytes().splitlines()
    ]
    assert {r["model"] for r in judge_rows} == {"judge-1"}
    # Each verdict recorded once: read from the judge's raw reply into the item's score row.
    scores = [r for r in project.journal_rows("memo") if r["type"] == "score"]
    assert len(scores) == 12 and all("judgments" in r and "scores" not in r for r in scores)
    assert not [r for r in project.journal_rows("memo-judge") if r["type"] == "score"]
    replay = project.run(
        f"--evalreplay-predictions={project.out}", f"--evalreplay-output={pytester.path / 're'}"
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert len(project.log("judge-model.jsonl")) == len(asked)
    # The journal as the previous version wrote it (each score row also held the
    # mean verdicts; done facts were files) still resumes to the same verdicts.
    old = [
        {**r, "scores": {k: sum(v) / len(v) for k, v in r["judgments"].items()}}
        if r["type"] == "score"
        else r
        for r in project.journal_rows("memo")
        if r["type"] != "done"
    ]
    (project.out / "memo-journal.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in old))
    assert project.run("--resume").returncode == 0
    assert len(project.log("judge-model.jsonl")) == len(asked)
    assert project.elo()["rating"] == rating
    assert [r for r in project.journal_rows("memo") if r["type"] == "score"] == [
        r for r in old if r["type"] == "score"
    ]
    assert orjson.loads((pytester.path / "re" / "memo-metrics.json").read_bytes())["elo"]["rating"] == rating


def test_the_elo_gate_pairs_with_a_baseline_over_shared_tasks(pytester):
    project = Project(pytester, seed="9", gate="Gate('elo', min=800, max_drop=50)")
    assert project.run("--evalreplay-baseline=base.json", "--evalreplay-update-baseline").returncode == 0
    baseline = orjson.loads((pytester.path / "base.json").read_bytes())
    assert baseline["tasks"]["memo"]["elo"]["table"]["tasks"]
    result = project.run("--evalreplay-baseline=base.json", "--evalreplay-model=bad")
    assert result.returncode == 1
    assert "gate memo: FAIL" in result.stdout and "dropped" in result.stdout


def test_each_reference_answer_is_read_once_a_session(pytester, monkeypatch):
    """#34: the answers read to check the references at collection serve the
    judging too (each saved row decoded once, not again per stage)."""
    import importlib

    from elo_project import POOL, REFERENCES

    # sys.modules' module: an earlier in-process run may have left the package attribute stale
    elojudge = importlib.import_module("pytest_evalreplay.run.elojudge")
    reads: list[tuple[int, str]] = []
    real = elojudge.first_answer

    def counted(index, prompt_key, stage):
        reads.append((id(index), prompt_key))
        return real(index, prompt_key, stage)

    monkeypatch.setattr(elojudge, "first_answer", counted)
    result = Project(pytester).run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(reads) == len(set(reads)) == len(POOL) * len(REFERENCES)


def test_a_pool_task_s_prompt_is_built_once_for_all_references(pytester, monkeypatch):
    """#34: reading the references' answers builds each drawn task's request
    once, not once per reference (the prompt is the same for all of them)."""
    import collections
    import importlib

    from elo_project import POOL, REFERENCES

    task = importlib.import_module("pytest_evalreplay.task")
    calls: collections.Counter[str] = collections.Counter()
    real = task.EvalTask.request

    def counted(self, instance, *args, **kwargs):
        calls[instance["id"]] += 1
        return real(self, instance, *args, **kwargs)

    monkeypatch.setattr(task.EvalTask, "request", counted)
    result = Project(pytester).run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(REFERENCES) >= 3 and set(calls) == {row["id"] for row in POOL}
    # collection's rendering, the candidate's generation and the references' one lookup
    assert max(calls.values()) <= 3, calls
