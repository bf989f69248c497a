"""scorers.graded(rubric, judge) through the plugin, with a deterministic
in-process judge: a score per criterion, verdicts journaled, not asked again
on --resume, served from the run dir on replay (the judge raising if asked),
and an unreadable reply a scoring failure quoting it, never a 0."""

from __future__ import annotations

import re

import orjson
import pytest

from pytest_evalreplay import EvalReplayError, EvalTask, judges, scorers

pytestmark = pytest.mark.filterwarnings("error")

CONFTEST = """
import os
from pytest_evalreplay import Generation

ANSWERS = {"q0": "4, thank you", "q1": "5", "q2": "4", "q3": "I do not know"}

class Sampler:
    kind, model = "sampler", "sampler-1"

    def generate(self, requests):
        return [[Generation(text=ANSWERS[r.instance_id]) for _ in r.rollouts] for r in requests]

class Grader:
    '''Says YES when the criterion's keyword (its last word) is in the answer.'''
    kind, model = "grader", "grader-1"

    def generate(self, requests):
        if os.environ.get("GRADER_RAISES"):
            raise RuntimeError("the grader was asked during a replay")
        out = []
        with open("grader-calls.log", "a") as log:
            for r in requests:
                log.write(r.instance_id + "\\n")
                answer = r.context.split("[Answer]\\n")[1].split("\\n\\n[Criterion]")[0]
                keyword = r.context.split("[Criterion]\\n")[1].split("\\n")[0].split()[-1]
                if "know" in answer and os.environ.get("MUMBLE"):
                    reply = "hmm, hard to say"
                else:
                    reply = "[[YES]]" if keyword in answer else "[[NO]]"
                out.append([Generation(text=reply)])
        return out

def pytest_evalreplay_make_provider(config, kind):
    return {"sampler": Sampler, "grader": Grader}.get(kind, lambda: None)()
"""

EVALS = """
from pytest_evalreplay import EvalTask, judges, scorers

rubric = {rubric}
math = EvalTask("math", [{{"id": i}} for i in ("q0", "q1", "q2", "q3")], prompt="What is 2+2? ({{id}})",
                scorer=scorers.graded(rubric=rubric, judge=judges.llm("grader", trials=1)))
"""

RUBRIC = {"correct": "The answer says 4", "polite": "The answer says thank"}


@pytest.fixture
def suite(pytester: pytest.Pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nevalreplay_provider = sampler\nevalreplay_max_attempts = 2\n")

    def make(rubric: dict[str, str] = RUBRIC) -> None:
        pytester.makepyfile(test_evals=EVALS.format(rubric=rubric))

    return make


def calls(pytester: pytest.Pytester) -> list[str]:
    log = pytester.path / "grader-calls.log"
    return log.read_text().split() if log.exists() else []


def scores(pytester: pytest.Pytester, run: str = "run") -> dict[str, dict[str, float]]:
    rows = (pytester.path / run / "math-predictions.jsonl").read_bytes().splitlines()
    return {r["instance_id"]: r["scores"] for r in map(orjson.loads, rows)}


WANT = {
    "q0": {"correct": 1.0, "polite": 1.0},
    "q1": {"correct": 0.0, "polite": 0.0},
    "q2": {"correct": 1.0, "polite": 0.0},
    "q3": {"correct": 0.0, "polite": 0.0},
}


def test_a_score_per_criterion_journaled_and_not_asked_again_on_resume(pytester, suite):
    suite()
    result = pytester.runpytest("--evalreplay-output=run")
    result.assert_outcomes(passed=4)
    assert scores(pytester) == WANT
    doc = orjson.loads((pytester.path / "run" / "math-metrics.json").read_bytes())
    assert doc["metrics"] == {"correct": 0.5, "polite": 0.25}
    assert sorted(calls(pytester)) == sorted(f"{q}|r0|{c}|t0" for q in WANT for c in RUBRIC)
    assert (pytester.path / "run" / "math-judge-predictions.jsonl").is_file()
    asked = len(calls(pytester))
    assert pytester.runpytest("--evalreplay-output=run", "--resume").ret == 0  # reused: deselected
    assert len(calls(pytester)) == asked, "a resumed run asked the grader again"
    assert scores(pytester) == WANT
    # a new criterion: only its verdicts are asked for
    suite({**RUBRIC, "short": "The answer is at most a word, say 4"})
    assert pytester.runpytest("--evalreplay-output=run", "--resume").ret == 0
    assert sorted(calls(pytester)[asked:]) == [f"{q}|r0|short|t0" for q in WANT]
    assert scores(pytester)["q2"] == {"correct": 1.0, "polite": 0.0, "short": 1.0}


def test_replay_serves_the_saved_verdicts_without_asking_the_judge(pytester, suite, monkeypatch):
    suite()
    pytester.runpytest("--evalreplay-output=run").assert_outcomes(passed=4)
    monkeypatch.setenv("GRADER_RAISES", "1")
    result = pytester.runpytest("--evalreplay-output=again", "--evalreplay-predictions=run")
    result.assert_outcomes(deselected=4)
    assert scores(pytester, "again") == WANT
    # a changed rubric asks what was never saved: those rollouts fail, naming the miss, never a 0
    suite({"correct": "The answer says 4", "kind": "The answer says please"})
    result = pytester.runpytest("--evalreplay-output=changed", "--evalreplay-predictions=run")
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines(["*the grader on criterion 'kind' failed:*"])


def test_an_unreadable_reply_is_a_scoring_failure_quoting_it(pytester, suite, monkeypatch):
    suite()
    monkeypatch.setenv("MUMBLE", "1")
    result = pytester.runpytest("--evalreplay-output=run")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*q3*unreadable verdict: 'hmm, hard to say'*"])
    assert "q3" not in scores(pytester) or not scores(pytester)["q3"]
    assert calls(pytester).count("q3|r0|correct|t0") == 2  # asked again under the attempt cap


@pytest.mark.parametrize(
    ("rubric", "judge", "message"),
    [
        ({}, judges.llm("grader"), "scorers.graded(rubric=...) is empty: give at least one criterion"),
        ("be good", judges.llm("grader"), "must be a dict {criterion name: what it asks} or a list"),
        (
            {"ok": ""},
            judges.llm("grader"),
            "criterion 'ok': '' must be a non-empty name and a non-empty text",
        ),
        (RUBRIC, lambda i, a, b: 1.0, "scorers.graded(judge=...) must be judges.llm(...)"),
        (
            RUBRIC,
            judges.llm("grader", pattern=r"(YES|NO)"),
            "scorers.graded asks with its own prompt and reads [[YES]] / [[NO]]: give judges.llm(...) "
            "no template, pattern or unreadable",
        ),
    ],
)
def test_bad_rubrics_and_judges_are_refused_naming_them(rubric, judge, message):
    with pytest.raises(EvalReplayError, match=re.escape(message)):
        scorers.graded(rubric=rubric, judge=judge)


def test_a_rubric_given_as_a_list_names_scores_by_their_text():
    grader = scorers.graded(["says 4", "is polite"], judges.llm("grader"))
    assert [name for name, _ in grader.rubric] == ["says 4", "is polite"]


def test_evaluate_outside_pytest_refuses_a_graded_task():
    task = EvalTask("g", [{"id": "a"}], prompt="{id}", scorer=scorers.graded(RUBRIC, judges.llm("grader")))
    with pytest.raises(EvalReplayError, match="grades in a pytest session"):
        task.evaluate(provider=None)  # type: ignore[arg-type]


@pytest.mark.slow
def test_under_xdist_the_grades_are_the_same(pytester, suite):
    suite()
    result = pytester.runpytest("--evalreplay-output=run", "-n", "2")
    result.assert_outcomes(passed=4)
    assert scores(pytester) == WANT
    asked = len(calls(pytester))
    assert pytester.runpytest("--evalreplay-output=run", "--resume", "-n", "2").ret == 0
    assert len(calls(pytester)) == asked


@pytest.mark.parametrize("reply", ["[[YES]] [[NO]]", "[[no]] ... [[ yes ]]"])
def test_a_grade_reply_saying_both_yes_and_no_is_unreadable(reply):
    """Issue #30 case 5: `[[YES]] [[NO]]` was read as NO (the last marker won)."""
    from pytest_evalreplay.rubric import unreadable_reason

    graded = scorers.graded(rubric=["is polite"], judge=judges.llm("grader"))
    assert graded.read(reply) is None
    assert graded.read("[[YES]], I repeat: [[yes]]") == 1.0
    assert f"conflicting grades NO, YES: {reply!r}" in unreadable_reason(reply)
