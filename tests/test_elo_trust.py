"""Issue 30's ELO and judge cases: a judge's BaseException and bad
Generation fail that item like a scorer's and a provider's; `-x` stops
before a later stage is generated; references are checked at collection;
and the status lines say what happened, once."""

from __future__ import annotations

import re

import pytest
from elo_project import Project

BAD_JUDGE_PROVIDER = """

class NoText:
    kind, batch_size, model = "notext", None, "nt-1"

    def generate(self, requests):
        return [[Generation(text=None)] for _ in requests]

_plain = pytest_evalreplay_make_provider

def pytest_evalreplay_make_provider(config, kind):
    return NoText() if kind == "notext" else _plain(config, kind)
"""


def counted(out: str, word: str) -> int:
    """pytest's own count (its last line), which the summary line must agree with."""
    found = re.search(rf"(\d+) {word}\b", out.strip().splitlines()[-1])
    summary = re.search(rf"items, (\d+) {word}", out)
    assert found and summary and found.group(1) == summary.group(1), out
    return int(found.group(1))


def test_a_function_judge_raising_systemexit_fails_that_item_naming_the_judge(pytester):
    project = Project(pytester, seed="2", bad_value="None", judge="judge_exits")
    path = project.path / "test_elo.py"
    path.write_text(
        path.read_text().replace(
            "memo = EloEval",
            "def judge_exits(instance, candidate, reference):\n"
            "    if instance['id'] == 't001':\n"
            "        raise SystemExit(3)\n"
            "    return judge(instance, candidate, reference)\n\n"
            "memo = EloEval",
        )
    )
    result = project.run()
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "the judge raised SystemExit judging against" in out
    assert "site-packages" not in out and out.count("\n") < 400
    failed = project.metrics()["num_failed"]
    assert failed == counted(result.stdout, "failed") and failed > 0
    assert project.metrics()["num_missing"] == 0


def test_a_judge_provider_returning_text_none_fails_the_item_naming_the_bad_generation(pytester):
    project = Project(pytester, seed="4", judge="judges.llm('notext')")
    (project.path / "conftest.py").write_text((project.path / "conftest.py").read_text() + BAD_JUDGE_PROVIDER)
    result = project.run()
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "provider raised TypeError" not in out
    assert "the judge failed on" in out and "provider returned a bad Generation for rollout 0" in out
    failed = project.metrics()["num_failed"]
    assert failed == counted(result.stdout, "failed") and failed > 0


GRADED_CONFTEST = """
from pytest_evalreplay import Generation

class Sampler:
    kind, model = "sampler", "sampler-1"

    def generate(self, requests):
        return [[Generation(text="4") for _ in r.rollouts] for r in requests]

class NoText:
    kind, model = "notext", "nt-1"

    def generate(self, requests):
        return [[Generation(text=None)] for _ in requests]

def pytest_evalreplay_make_provider(config, kind):
    return {"sampler": Sampler, "notext": NoText}.get(kind, lambda: None)()
"""


def test_a_grader_returning_text_none_fails_the_item_naming_the_bad_generation(pytester):
    pytester.makeconftest(GRADED_CONFTEST)
    pytester.makepyfile(
        test_evals="from pytest_evalreplay import EvalTask, judges, scorers\n"
        "math = EvalTask('math', [{'id': 'q0'}], prompt='2+2? {id}',\n"
        "    scorer=scorers.graded(rubric=['says 4'], judge=judges.llm('notext', trials=1)))\n"
    )
    result = pytester.runpytest("--evalreplay-provider=sampler", "--evalreplay-output=run", "-p", "no:xdist")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "provider raised TypeError" not in out
    result.stdout.fnmatch_lines(
        ["*the grader on criterion 'says 4' failed: provider returned a bad Generation*"]
    )


def test_under_x_a_later_stages_requests_never_reach_the_provider(pytester):
    project = Project(pytester, seed="2", bad_value="0.7")  # t001, in stage 1, is judged badly
    result = project.run("-x", "-p", "no:xdist")
    assert result.returncode == 1, result.stdout + result.stderr
    assert {stage for _, stage, _ in project.log("calls.jsonl")} == {1}
    assert {r["stage"] for r in project.stage_records() if r["kind"] == "planned"} == {1}


def test_a_stages_requests_are_generated_after_its_plan_is_recorded(pytester):
    project = Project(pytester, seed="2")
    assert project.run("-p", "no:xdist").returncode == 0
    rows = project.journal_rows("memo")
    planned = {
        r["stage"]: n for n, r in enumerate(rows) if r.get("type") == "stage" and r["kind"] == "planned"
    }
    first_gen = {}
    for n, r in enumerate(rows):
        if r.get("type") == "gen":
            first_gen.setdefault(r["stage"], n)
    assert sorted(planned) == sorted(first_gen) == [1, 2, 3]
    assert all(planned[s] < first_gen[s] for s in planned)


FAILING_CANDIDATE = """

from pytest_evalreplay import GenerationError

class Failing(Candidate):
    kind = "failing"

    def generate(self, requests):
        out = super().generate(requests)
        return [GenerationError("no", retryable=False) if r.instance_id == "t001" else o
                for r, o in zip(requests, out)]

_plain = pytest_evalreplay_make_provider

def pytest_evalreplay_make_provider(config, kind):
    return Failing("good") if kind == "failing" else _plain(config, kind)
"""


def test_under_x_a_stage_whose_generation_failed_is_judged_only_up_to_the_failed_item(pytester):
    project = Project(pytester, seed="2")  # t001 is in stage 1
    (project.path / "conftest.py").write_text((project.path / "conftest.py").read_text() + FAILING_CANDIDATE)
    result = project.run("-x", "-p", "no:xdist", "--evalreplay-provider=failing")
    assert result.returncode == 1, result.stdout + result.stderr
    tasks = project.elo()["stages"][0]["task_ids"]
    judged = [tid for tid, _, _ in project.log("judge.jsonl")]
    assert set(judged) == set(tasks[: tasks.index("t001")])
    assert {stage for _, stage, _ in project.log("calls.jsonl")} == {1}


STOP_AT_STAGE_2 = """

def pytest_runtest_setup(item):
    if "[s2-" in item.name:
        item.session.shouldstop = "a peer was interrupted"
"""


def test_a_session_that_is_stopping_plans_and_generates_no_later_stage(pytester):
    project = Project(pytester, seed="2")
    (project.path / "conftest.py").write_text((project.path / "conftest.py").read_text() + STOP_AT_STAGE_2)
    result = project.run("-p", "no:xdist")
    out = result.stdout + result.stderr
    assert (
        "the session is stopping (-x, --maxfail or an interrupt), so stage 2 of 'memo' was not planned" in out
    )
    assert {stage for _, stage, _ in project.log("calls.jsonl")} == {1}
    assert {r["stage"] for r in project.stage_records() if r["kind"] == "planned"} == {1}


def test_chunks_by_stage_never_hold_two_stages():
    from pytest_evalreplay.numbers.planning import chunks

    keys = [(1, "a", 0), (1, "b", 0), (2, "c", 0), (2, "c", 1), (3, "d", 0)]
    assert chunks(keys, None) == [[(1, "a"), (1, "b"), (2, "c"), (3, "d")]]
    assert chunks(keys, None, by_stage=True) == [[(1, "a"), (1, "b")], [(2, "c")], [(3, "d")]]
    assert chunks(keys, 1, by_stage=True) == [[(1, "a")], [(1, "b")], [(2, "c")], [(3, "d")]]


def test_a_malformed_reference_line_is_a_collection_error_naming_the_line_and_the_reference(pytester):
    project = Project(pytester, seed="2")
    path = project.path / "refs" / "mid-predictions.jsonl"
    lines = path.read_text().splitlines()
    lines[3] = "{not json"
    path.write_text("\n".join(lines) + "\n")
    result = project.run("-p", "no:xdist")
    out = result.stdout + result.stderr
    assert result.returncode == 4, out
    assert f"reference 'mid': {path}:4: not valid JSON" in out
    assert "point Reference(predictions=...) of 'mid' in EloEval 'memo' elsewhere" in out
    assert "--evalreplay-predictions" not in out
    assert project.log("calls.jsonl") == []  # refused before anything was generated


def test_a_reference_without_an_answer_to_a_drawn_task_is_refused_naming_both(pytester):
    project = Project(pytester, seed="2")  # t001 is drawn in stage 1
    path = project.path / "refs" / "weak-predictions.jsonl"
    path.write_text("".join(x + "\n" for x in path.read_text().splitlines() if '"t001"' not in x))
    result = project.run("-p", "no:xdist")
    out = result.stdout + result.stderr
    assert result.returncode == 4, out
    assert (
        "reference 'weak' (" in out
        and "weak-predictions.jsonl) has no saved answer to task 't001', which " in out
    )
    assert "stage 1 of EloEval 'memo' drew" in out
    assert project.log("calls.jsonl") == []


def helper(project: Project, body: str) -> None:
    (project.path / "judgehelp.py").write_text(f"def verdict(mine, theirs):\n    return {body}\n")


def test_a_judge_helper_edit_under_resume_says_the_stage_was_judged_again_never_kept(pytester):
    project = Project(pytester, seed="3", judge_helper="True")
    helper(project, "0.5 if mine == theirs else float(mine)")
    assert project.run("-p", "no:xdist").returncode == 0
    helper(project, "0.0")  # every verdict changes: the rating moves
    result = project.run("--resume", "-p", "no:xdist")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "kept from the journal" not in result.stdout
    assert re.search(
        r"memo: stage 1/3 judged again: ELO [\d.]+ -> 500\.0 \(its verdicts changed\)", result.stdout
    )
    assert "memo: stage 2/3 planned afresh (the rating it starts from changed" in result.stdout
    # Nothing changed: the kept stages are said kept, once each.
    result = project.run("--resume", "-p", "no:xdist")
    assert result.stdout.count("memo: stage 1/3 kept from the journal: ELO 500.0") == 1, result.stdout


def test_an_interrupted_stage_planned_afresh_is_never_said_replayed(pytester):
    project = Project(pytester, seed="3", judge_helper="True")
    helper(project, "0.5 if mine == theirs else float(mine)")
    result = project.run("-p", "no:xdist", INTERRUPT_AT_CALL="5")  # stage 2's first request
    assert result.returncode == 2, result.stdout + result.stderr
    assert [(r["kind"], r.get("stage")) for r in project.stage_records()][-2:] == [
        ("complete", 1),
        ("planned", 2),
    ]
    helper(project, "0.0")
    result = project.run("--resume", "-p", "no:xdist")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "replayed from the journal" not in result.stdout
    assert "memo: stage 2/3 planned afresh (the rating it starts from changed" in result.stdout
    refs = [r["references"] for r in project.stage_records() if r["kind"] == "planned" and r["stage"] == 2]
    assert refs[-1] == project.elo()["stages"][1]["references"]


@pytest.mark.slow
def test_a_killed_elo_judging_leaves_an_unfinished_run_note(pytester):
    project = Project(pytester, seed="2")
    result = project.run(KILL_AT_JUDGE="22")  # every candidate generated, stage 3 judging killed
    assert result.returncode == -9, result.stdout + result.stderr
    result = project.run("--collect-only", "-p", "no:xdist")
    assert "memo: the output dir holds an unfinished run: --resume would reuse 12 results" in result.stdout, (
        result.stdout
    )


@pytest.mark.parametrize("resume", [False, True], ids=["plain", "resume"])
def test_a_link_planted_among_the_locks_fails_cleanly_claiming_no_reuse(pytester, resume):
    project = Project(pytester, seed="2")
    assert project.run("-p", "no:xdist").returncode == 0
    lock = project.out / ".evalreplay-locks" / "memo.stage-1.lock"
    (pytester.path / "elsewhere").write_text("x")
    lock.unlink()
    lock.symlink_to(pytester.path / "elsewhere")
    result = project.run("-p", "no:xdist", *(["--resume"] if resume else []))
    out = result.stdout + result.stderr
    assert result.returncode == 4, out
    assert f"{lock} is a symbolic link" in out and f"rm {lock}" in out
    assert "reused" not in result.stdout and "kept from the journal" not in out
    assert (pytester.path / "elsewhere").read_text() == "x"


def test_the_run_dir_is_printed_normalised(pytester):
    project = Project(pytester, seed="2")
    (project.path / "a").mkdir()
    result = project.run("-p", "no:xdist", "--evalreplay-output=a/../runs")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [x for x in result.stdout.splitlines() if x.startswith("run dir: ")]
    assert lines == [f"run dir: {project.path / 'runs'}"], lines
