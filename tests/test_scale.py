"""Scale without changed numbers (issue 13): a suite run under pytest-xdist
gives what a serial run gives, one task or several; workers under `--resume`
collect the same items and generate nothing twice; a fully resumed run (its
items deselected) reports the metrics, gate and Markdown report of the fresh
run. Timings live in benchmarks/, not here."""

from __future__ import annotations

import orjson
import pytest
from test_trust import CONFTEST

pytest.importorskip("xdist")

EVALS = """
from pytest_evalreplay import EvalTask, Gate

def score(text, instance):
    return float(int(instance["id"][1:]) % 3 != 0)

{tasks}
"""

TASK = (
    't{t} = EvalTask("t{t}", [{{"id": f"i{t}{{n:02d}}"}} for n in range({n})], prompt="Q {{id}}", '
    "scorer=score, num_samples=2, gate=Gate('score', min=0.5))\n"
)


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CALL_LOG", str(pytester.path / "calls.jsonl"))
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nevalreplay_provider = counting\naddopts = -p no:benchmark -p no:randomly\n")

    def make(tasks: int, n: int = 10) -> list[str]:
        pytester.makepyfile(
            test_evals=EVALS.format(tasks="".join(TASK.format(t=t, n=n) for t in range(tasks)))
        )
        return [f"t{t}" for t in range(tasks)]

    return make


def asked(pytester: pytest.Pytester) -> list[tuple[str, int]]:
    log = pytester.path / "calls.jsonl"
    calls = [orjson.loads(line) for line in log.read_bytes().splitlines()] if log.exists() else []
    return [(iid, r) for call in calls for iid, rollouts in call for r in rollouts]


def saved(pytester: pytest.Pytester, out: str, task: str) -> tuple[dict, list]:
    """A task's metrics.json without what depends on how the session went, and its predictions."""
    metrics = orjson.loads((pytester.path / out / f"{task}-metrics.json").read_bytes())
    for key in ("session", "run"):
        metrics.pop(key, None)
    rows = [
        orjson.loads(line)
        for line in (pytester.path / out / f"{task}-predictions.jsonl").read_bytes().splitlines()
    ]
    return metrics, sorted(rows, key=lambda r: (r["instance_id"], r.get("stage", 1)))


def report_numbers(pytester: pytest.Pytester, name: str) -> list[list[str]]:
    """The Markdown report's lines, less the columns of how the session went
    (what it generated, what it reused)."""
    lines = [line.split("|") for line in (pytester.path / name).read_text().splitlines()]
    header = next(cells for cells in lines if any(c.strip() == "generated" for c in cells))
    drop = {i for i, c in enumerate(header) if c.strip() in ("generated", "reused")}
    return [[c for i, c in enumerate(cells) if len(cells) != len(header) or i not in drop] for cells in lines]


@pytest.mark.slow
@pytest.mark.parametrize("tasks", [1, 4])
@pytest.mark.parametrize("dist", ["load", "worksteal"])
def test_an_xdist_run_saves_what_a_serial_run_saves(pytester, suite, tasks, dist):
    names = suite(tasks)
    pytester.runpytest("--evalreplay-output=serial").assert_outcomes(passed=tasks * 21)
    serial_asked = sorted(asked(pytester))
    (pytester.path / "calls.jsonl").unlink()
    result = pytester.runpytest(
        "--evalreplay-output=par", "-n", "2", f"--dist={dist}", "--evalreplay-batch-size=4"
    )
    result.assert_outcomes(passed=tasks * 21)
    parallel_asked = asked(pytester)
    assert len(parallel_asked) == len(set(parallel_asked)), "a rollout generated twice"
    assert sorted(parallel_asked) == serial_asked
    for name in names:
        assert saved(pytester, "par", name) == saved(pytester, "serial", name)


@pytest.mark.slow
def test_workers_collect_the_same_items_under_resume_and_generate_nothing_twice(pytester, suite):
    suite(2)
    pytester.runpytest("--evalreplay-output=run", "-k", "i001 or i003 or i101 or i103").assert_outcomes(
        passed=8
    )
    first = set(asked(pytester))
    result = pytester.runpytest("--evalreplay-output=run", "--resume", "-n", "2")
    assert "Different tests were collected" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=42 - 8, skipped=8)
    everything = asked(pytester)
    assert len(everything) == len(set(everything)) == 40
    assert first <= set(everything)
    for name in ("t0", "t1"):
        metrics, _ = saved(pytester, "run", name)
        assert metrics["num_items"] == 20 and metrics["num_missing"] == 0


def test_a_fully_resumed_run_reports_the_fresh_runs_metrics_gates_and_report(pytester, suite):
    names = suite(2)
    fresh = pytester.runpytest("--evalreplay-output=run", "--evalreplay-report=fresh.md")
    fresh.assert_outcomes(passed=42)
    before = {name: saved(pytester, "run", name) for name in names}
    resumed = pytester.runpytest("--evalreplay-output=run", "--resume", "--evalreplay-report=resumed.md")
    resumed.assert_outcomes(passed=2)  # the gates; every rollout item is deselected as reused
    resumed.stdout.fnmatch_lines(["*40 deselected*"])
    assert {name: saved(pytester, "run", name) for name in names} == before
    assert report_numbers(pytester, "resumed.md") == report_numbers(pytester, "fresh.md")
    assert asked(pytester) and len(asked(pytester)) == 40  # nothing asked again
