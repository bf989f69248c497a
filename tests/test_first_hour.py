"""The first hour with the plugin: status where pytest users look, options
the pytest way, comparing two runs, baselines that say where they came from,
and the CI wiring (pytester runs)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import orjson
import pytest

CONFTEST = """
import os
from pytest_evalreplay import Generation

class Quiz:
    kind, batch_size = "quiz", None

    def __init__(self, model):
        self.model = model

    def generate(self, requests):
        wrong = set(os.environ.get("WRONG", "").split(","))
        return [[Generation(text="no" if r.instance_id in wrong else "yes", finish_reason="stop",
                            prompt_tokens=7, completion_tokens=2) for _ in r.rollouts] for r in requests]

def pytest_evalreplay_make_provider(config, kind):
    return Quiz(config.getoption("evalreplay_model") or "quiz-1") if kind == "quiz" else None
"""

EVALS = """
from pytest_evalreplay import EvalTask, Gate
t = EvalTask("t", [{"id": f"q{n}", "question": f"Is {n} fine?"} for n in range(6)],
             prompt="{question}\\nAnswer yes or no.", scorer=lambda text, i: float(text == "yes"),
             gate=Gate("score", min=0.9))
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nevalreplay_provider = quiz\n")
    pytester.makepyfile(test_evals=EVALS)
    return pytester


def test_the_header_and_the_collection_line_say_what_will_happen(project):
    result = project.runpytest("--evalreplay-output=run", "--evalreplay-model=m7")
    result.stdout.fnmatch_lines(
        [
            "evalreplay: provider: quiz, model: m7, output: */run, mode: fresh for what is selected",
            "evalreplay: 1 task, 6 to run",
        ]
    )
    result = project.runpytest("--evalreplay-output=run", "--evalreplay-model=m7", "--resume")
    result.stdout.fnmatch_lines(
        ["*mode: resume", "evalreplay: 1 task, 0 to run, 6 reused from the journal (deselected)"]
    )


def test_a_plain_run_without_evals_shows_nothing_of_the_plugin(pytester):
    pytester.makepyfile("def test_x():\n    assert True\n")
    result = pytester.runpytest()
    shown = [x for x in result.outlines if "evalreplay" in x and not x.startswith("plugins:")]
    assert shown == []


def test_the_summary_gives_the_run_dir_intervals_and_tokens(project):
    result = project.runpytest("--evalreplay-output=run")
    result.stdout.fnmatch_lines(
        [
            "run dir: */run",
            "t: 6 instances, 6 items, 0 failed | 6 generated, 0 reused | score=1.0000 [[]1.0000, 1.0000[]] "
            "| tokens: 42 prompt + 12 completion generated",
        ]
    )
    doc = orjson.loads((project.path / "run" / "t-metrics.json").read_bytes())
    assert doc["tokens"] == {"prompt": 42, "completion": 12}
    assert doc["session"]["tokens"]["generated"] == {"prompt": 42, "completion": 12}


def test_replay_prints_no_generation_rate(project):
    project.runpytest("--evalreplay-output=run").assert_outcomes(passed=7)
    result = project.runpytest("--evalreplay-predictions=run", "--evalreplay-output=again")
    result.assert_outcomes(passed=1, deselected=6)
    assert "tok/s" not in result.stdout.str()


def test_junit_properties_never_hold_the_string_none(project):
    project.makeconftest(CONFTEST.replace('finish_reason="stop",', "finish_reason=None,"))
    project.runpytest("--evalreplay-output=run", "--junitxml=out.xml")
    values = [p.get("value") for p in ET.parse(project.path / "out.xml").iter("property")]
    assert values and "None" not in values


def test_ini_paths_are_relative_to_the_ini_file_not_the_working_directory(project, monkeypatch):
    project.makeini("[pytest]\nevalreplay_provider = quiz\nevalreplay_output = results/run\n")
    sub = project.mkdir("sub")
    monkeypatch.chdir(sub)
    result = project.runpytest(str(project.path))
    result.assert_outcomes(passed=7)
    assert (project.path / "results" / "run" / "t-metrics.json").exists()
    assert not (sub / "results").exists()


def test_compare_shows_metric_differences_and_the_flipped_instances(project, monkeypatch):
    project.runpytest("--evalreplay-output=base").assert_outcomes(passed=7)
    monkeypatch.setenv("WRONG", "q1,q4")
    result = project.runpytest(
        "--evalreplay-output=new", "--evalreplay-compare=base", "--evalreplay-report=r.md"
    )
    result.assert_outcomes(passed=6, failed=1)
    text = result.stdout.str()
    assert "-0.3333" in text  # the score's difference
    lines = [x for x in result.outlines if "q1" in x or "q4" in x]
    assert lines and all("Is " in x or "q" in x for x in lines)
    report = (project.path / "r.md").read_text()
    assert "q1" in report and "q4" in report
    # The gate failed on its min, not on a drop from a baseline: no pointer to a comparison.
    assert "what changed" not in text


def test_the_report_goes_to_the_github_step_summary(project, monkeypatch):
    summary = project.path / "step-summary.md"
    summary.write_text("earlier steps\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = project.runpytest("--evalreplay-output=run", "--evalreplay-report=report.md")
    result.stdout.fnmatch_lines(["evalreplay: report appended to $GITHUB_STEP_SUMMARY*"])
    text = summary.read_text()
    assert text.startswith("earlier steps\n") and "# evalreplay summary" in text
    assert "| t | 6 | 0 | 0 | 6 | 0 | score=1.0000" in text


def test_a_baseline_says_where_it_came_from_in_the_gate_message(project, monkeypatch):
    project.makepyfile(test_evals=EVALS.replace('Gate("score", min=0.9)', 'Gate("score", max_drop=0.1)'))
    project.runpytest(
        "--evalreplay-output=run", "--evalreplay-baseline=b.json", "--evalreplay-update-baseline"
    )
    source = orjson.loads((project.path / "b.json").read_bytes())["tasks"]["t"]["source"]
    assert source["model"] == "quiz-1" and source["run"] and source["date"]
    monkeypatch.setenv("WRONG", "q0,q1,q2,q3,q4")
    result = project.runpytest("--evalreplay-output=run", "--evalreplay-baseline=b.json")
    result.stdout.fnmatch_lines(
        [f"*baseline 1.0000 (model quiz-1, run {source['run'][:8]}, {source['date']}*"]
    )
