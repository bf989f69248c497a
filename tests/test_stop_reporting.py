"""What the plugin says and collects (issue #18, cases 5, 8 and 9): a
collection needs no provider, the summary counts what was saved before an
interrupt, the header and the collection line say what will happen under
`--resume-stage` and `-n`, and a task imported into a second module stays
in the module that defines it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from echo_project import CONFTEST
from elo_project import Project

pytestmark = pytest.mark.filterwarnings("error")


EVALS = """
from pytest_evalreplay import EvalTask

scored = 0

def interrupting(text, instance):
    global scored
    scored += 1
    if scored == {interrupt_at}:
        raise KeyboardInterrupt
    return True

qa = EvalTask("qa", [{{"id": f"q{{i}}"}} for i in range(4)], prompt="Q {{id}}", scorer=interrupting)
"""


@pytest.fixture
def echo(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_evals=EVALS.format(interrupt_at=0))
    return pytester


def test_collect_only_needs_no_provider(echo):
    result = echo.runpytest("--evalreplay-output=run", "--collect-only", "-q")
    assert result.ret == 0, result.stdout.str()
    assert "test_evals.py::qa::q0[s1-r0]" in result.outlines
    assert "ERROR" not in result.stderr.str()
    result.stdout.fnmatch_lines(["evalreplay: 1 task, not planned: no provider chosen*"])


def test_a_resume_that_reuses_everything_needs_no_provider(echo):
    echo.runpytest("--evalreplay-output=run", "--evalreplay-provider=echo").assert_outcomes(passed=4)
    result = echo.runpytest("--evalreplay-output=run", "--resume")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["evalreplay: 1 task, 0 to run, 4 reused from the journal*"])
    result.stdout.fnmatch_lines(["qa: 4 instances, 4 items, 0 failed | 0 generated, 4 reused*"])


def test_a_resume_with_something_to_generate_still_needs_a_provider(echo):
    echo.runpytest("--evalreplay-output=run", "--evalreplay-provider=echo", "-k", "q0 or q1")
    result = echo.runpytest("--evalreplay-output=run", "--resume")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: no provider chosen*"])


def test_a_run_that_generates_still_needs_a_provider(echo):
    result = echo.runpytest("--evalreplay-output=run")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: no provider chosen*"])


def test_the_summary_counts_generations_saved_before_an_interrupt(echo):
    echo.makepyfile(test_evals=EVALS.format(interrupt_at=2))
    result = echo.runpytest_subprocess("--evalreplay-output=run", "--evalreplay-provider=echo", "-n0")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    # All 4 were generated in one call and saved; 1 was scored before the Ctrl-C.
    result.stdout.fnmatch_lines(["qa: 4 instances, 4 items, 0 failed, 3 missing | 4 generated, 0 reused*"])


@pytest.mark.slow  # pytest-xdist workers started
def test_the_collection_line_is_printed_under_xdist(echo):
    pytest.importorskip("xdist")
    result = echo.runpytest("--evalreplay-output=run", "--evalreplay-provider=echo", "-n", "2")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["evalreplay: 1 task, 4 to run"])


def test_the_header_names_the_resume_stage_mode(pytester):
    project = Project(pytester, seed="11")
    assert project.run().returncode == 0
    result = project.run("--resume-stage=2", "-v")
    assert "mode: resume from stage 2" in result.stdout, result.stdout
    result = project.run("--resume-stage", "-v")
    assert "mode: resume from the first incomplete stage" in result.stdout, result.stdout


def test_a_bare_resume_stage_with_every_stage_complete_reruns_nothing(pytester):
    project = Project(pytester, seed="11")
    assert project.run().returncode == 0
    asked = len(project.log("calls.jsonl"))
    result = project.run("--resume-stage")
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(project.log("calls.jsonl")) == asked
    assert "every stage is complete" in result.stdout


def test_compare_help_prints_single_percent_signs():
    out = subprocess.run(
        [sys.executable, "-m", "pytest_evalreplay", "compare", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "%%" not in out
    assert "90% interval" in " ".join(out.split())


SHARED = """
from pytest_evalreplay import EvalTask

arith = EvalTask("arith", [{"id": "a1"}, {"id": "a2"}], prompt="Q {id}", scorer="contains", target="x")
"""

IMPORTER = """
from test_home import arith

def test_uses_it():
    assert arith.name == "arith"
"""


@pytest.mark.parametrize("importer", ["test_a_first", "test_z_last"])
def test_an_imported_task_is_collected_in_the_module_that_defines_it(pytester, importer):
    pytester.makeconftest(CONFTEST)
    pytester.syspathinsert()
    pytester.makepyfile(test_home=SHARED, **{importer: IMPORTER})
    result = pytester.runpytest("--evalreplay-output=run", "--evalreplay-provider=echo", "--co", "-q")
    ids = [line for line in result.outlines if "::" in line]
    assert sorted(ids) == sorted(
        [
            "test_home.py::arith::a1[s1-r0]",
            "test_home.py::arith::a2[s1-r0]",
            f"{importer}.py::test_uses_it",
        ]
    )


def test_an_imported_task_whose_module_is_not_collected_runs_where_it_is_imported(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.syspathinsert()
    pytester.makepyfile(evals_lib=SHARED, test_user=IMPORTER.replace("test_home", "evals_lib"))
    result = pytester.runpytest("--evalreplay-output=run", "--evalreplay-provider=echo", "--co", "-q")
    ids = [line for line in result.outlines if "::" in line]
    assert "test_user.py::arith::a1[s1-r0]" in ids


def test_an_imported_task_is_collected_where_imported_when_only_that_module_is_selected(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.syspathinsert()
    pytester.makepyfile(test_home=SHARED, test_user=IMPORTER)
    result = pytester.runpytest(
        "--evalreplay-output=run", "--evalreplay-provider=echo", "--collect-only", "-q", "test_user.py"
    )
    ids = [line for line in result.outlines if "::" in line]
    assert "test_user.py::arith::a1[s1-r0]" in ids


@pytest.mark.parametrize("arg", ["--resume-stage=99", "--resume-stage"])
def test_resume_stage_without_an_elo_eval_is_a_usage_error(echo, arg):
    result = echo.runpytest("--evalreplay-output=run", "--evalreplay-provider=echo", arg)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*no multi-stage EloEval is selected*for plain tasks use --resume*"])
