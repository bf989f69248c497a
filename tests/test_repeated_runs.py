"""Repeated plain runs on one output dir (issue #30, case 13): each run
compacts what it superseded, so the task journal and an agent task's turns
journal stay the size the first run left, and a later `--resume` still
reuses every result."""

from __future__ import annotations

import pytest
from agent_project import AGENT, CONFTEST, INI

PLAIN = """
from pytest_evalreplay import EvalTask

plain = EvalTask("plain", [{"id": f"p{i}"} for i in range(5)], prompt="What is {id}?",
                 scorer=lambda text, instance: 1.0, num_samples=2)
"""

# The agent suite's model answers a plain prompt (a string context) too.
BOTH = CONFTEST.replace(
    "            last = r.context[-1]\n",
    "            if isinstance(r.context, str):\n"
    "                out.append([Generation(f'{r.context} ok') for _ in r.rollouts])\n"
    "                continue\n"
    "            last = r.context[-1]\n",
)

JOURNALS = ("plain-journal.jsonl", "sums-journal.jsonl", "sums-turns-journal.jsonl")


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(BOTH)
    pytester.makeini(INI)
    pytester.makepyfile(test_sums=AGENT, test_plain=PLAIN)
    return pytester


def sizes(pytester: pytest.Pytester) -> dict[str, int]:
    return {name: (pytester.path / "run" / name).stat().st_size for name in JOURNALS}


def test_repeated_plain_runs_keep_every_journal_the_size_the_first_left(project):
    seen = []
    for _ in range(3):
        project.runpytest("--evalreplay-output=run").assert_outcomes(passed=16)
        seen.append(sizes(project))
    assert seen[1] == seen[0]
    assert seen[2] == seen[0]
    (project.path / "calls.log").unlink()
    result = project.runpytest("--evalreplay-output=run", "--resume")
    result.assert_outcomes(passed=6)  # an agent's episodes re-run, every turn answered from the journal
    result.stdout.fnmatch_lines(
        ["plain: * | 0 generated, 10 reused | *", "sums: * | 0 generated, 6 reused | *"], consecutive=True
    )
    assert not (project.path / "calls.log").exists()


@pytest.mark.slow
def test_the_repeated_runs_benchmark_runs_small(capsys: pytest.CaptureFixture[str]) -> None:
    """The benchmark drives agent_overhead's projects: a change there must not break it unseen."""
    pytest.importorskip("benchmarks.repeated_runs")
    from benchmarks.repeated_runs import main

    main(["--episodes", "5", "--items", "50", "--runs", "2", "--pairs", "1"])
    out = capsys.readouterr().out
    assert "agent task, 5 episodes x 10 turns: 2 plain runs on one output dir" in out
    assert "plain task, 50 items: 2 plain runs on one output dir" in out
    assert out.count("journals : first") == 2
