"""Gate items as CI sees them: `<file>::<task>::gate`, baselines, budgets."""

from __future__ import annotations

import orjson
import pytest

pytestmark = pytest.mark.filterwarnings("error")

CONFTEST = """
import os
from pytest_evalreplay import Generation, GenerationError

class Oracle:
    '''Right on every instance except those listed in WRONG; fails those in BROKEN.'''
    kind = "oracle"
    model = "oracle-1"

    def generate(self, requests):
        wrong = set(os.environ.get("WRONG", "").split(","))
        broken = set(os.environ.get("BROKEN", "").split(","))
        out = []
        for r in requests:
            if r.instance_id in broken:
                out.append(GenerationError("server error", retryable=False))
            else:
                text = "no" if r.instance_id in wrong else "yes"
                out.append([Generation(text=text, finish_reason="stop") for _ in r.rollouts])
        return out

def pytest_evalreplay_make_provider(config, kind):
    return Oracle() if kind == "oracle" else None
"""

EVALS = """
from pytest_evalreplay import EvalTask, Gate

qa = EvalTask("qa", [{{"id": f"i{{n:02d}}", "target": "yes"}} for n in range(40)], prompt="{{id}}",
              scorer="exact_match", gate=Gate("exact_match", {gate}))
"""


@pytest.fixture
def suite(pytester: pytest.Pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nevalreplay_provider = oracle\n")

    def make(gate: str = "min=0.5") -> None:
        pytester.makepyfile(test_evals=EVALS.format(gate=gate))

    return make


def run(pytester, monkeypatch, wrong=(), broken=(), *args):
    monkeypatch.setenv("WRONG", ",".join(wrong))
    monkeypatch.setenv("BROKEN", ",".join(broken))
    return pytester.runpytest("--evalreplay-output=run", *args)


def test_gate_item_is_collected_after_the_task(pytester, suite):
    suite()
    result = pytester.runpytest("--collect-only", "-q")
    ids = [line for line in result.outlines if "::" in line]
    assert ids[-1] == "test_evals.py::qa::gate"
    assert len(ids) == 41


def test_gate_passes_and_fails_on_min(pytester, suite, monkeypatch):
    suite("min=0.8")
    run(pytester, monkeypatch, [f"i{n:02d}" for n in range(5)]).assert_outcomes(passed=41)
    result = run(pytester, monkeypatch, [f"i{n:02d}" for n in range(10)])
    result.assert_outcomes(passed=40, failed=1)
    result.stdout.fnmatch_lines(
        ["*gate qa: FAIL exact_match=0.7500; min 0.8*", "*exact_match 0.7500 is below min 0.8*"]
    )


def test_failure_budget(pytester, suite, monkeypatch):
    suite("min=0.5")
    result = run(pytester, monkeypatch, (), ["i00", "i01"])
    result.assert_outcomes(passed=38, failed=3)
    result.stdout.fnmatch_lines(["*2 of 40 items failed (5.0%), over the failure budget 0.0%*"])
    result = run(pytester, monkeypatch, (), ["i00", "i01"], "--evalreplay-failure-budget=0.05")
    result.assert_outcomes(passed=39, failed=2)


def test_baseline_update_then_a_regression_fails_the_gate(pytester, suite, monkeypatch):
    suite("max_drop=0.05")
    baseline = pytester.path / "baseline.json"
    run(pytester, monkeypatch, (), (), "--evalreplay-baseline=baseline.json", "--evalreplay-update-baseline")
    doc = orjson.loads(baseline.read_bytes())
    assert doc["format"] == "evalreplay-baseline/1"
    assert doc["tasks"]["qa"]["metrics"] == {"exact_match": 1.0}
    assert doc["tasks"]["qa"]["metric"] == "exact_match"
    assert len(doc["tasks"]["qa"]["scores"]) == 40

    run(pytester, monkeypatch, ["i00"], (), "--evalreplay-baseline=baseline.json").assert_outcomes(passed=41)
    result = run(
        pytester, monkeypatch, [f"i{n:02d}" for n in range(12)], (), "--evalreplay-baseline=baseline.json"
    )
    result.assert_outcomes(passed=40, failed=1)
    result.stdout.fnmatch_lines(["*exact_match dropped 0.3000 below the baseline over 40 paired instances*"])


def test_gate_without_baseline_passes_with_a_note(pytester, suite, monkeypatch):
    suite("max_drop=0.05")
    result = run(pytester, monkeypatch)
    result.assert_outcomes(passed=41)
    result.stdout.fnmatch_lines(["*note: max_drop not checked: no baseline*"])


def test_gate_alone_judges_the_last_run_and_resume_feeds_it(pytester, suite, monkeypatch):
    suite("min=0.9")
    run(pytester, monkeypatch, ["i00"]).assert_outcomes(passed=41)
    run(pytester, monkeypatch, ["i00"], (), "-k", "gate").assert_outcomes(passed=1, deselected=40)
    result = run(pytester, monkeypatch, ["i00"], (), "--resume")
    result.assert_outcomes(passed=1, deselected=40)
    result.stdout.fnmatch_lines(["*gate qa: PASS exact_match=0.9750*"])


def test_gate_in_junit_and_markdown(pytester, suite, monkeypatch):
    suite("min=0.99")
    run(pytester, monkeypatch, ["i03"], (), "--junitxml=out.xml", "--evalreplay-report=r.md")
    xml = (pytester.path / "out.xml").read_text()
    assert 'name="gate"' in xml and "below min 0.99" in xml
    md = (pytester.path / "r.md").read_text()
    assert "| qa | **FAIL** | exact_match=0.9750; min 0.99;" in md


def test_update_baseline_needs_a_file(pytester, suite):
    suite()
    result = pytester.runpytest("--evalreplay-update-baseline")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--evalreplay-update-baseline needs --evalreplay-baseline=FILE*"])


def test_gate_runs_on_the_worker_of_its_task_under_xdist(pytester, suite, monkeypatch):
    pytest.importorskip("xdist")
    suite("min=0.9")
    result = run(pytester, monkeypatch, ["i00"], (), "-n", "2", "-p", "no:benchmark")
    result.assert_outcomes(passed=41)
    result.stdout.fnmatch_lines(["*gate qa: PASS exact_match=0.9750*"])
