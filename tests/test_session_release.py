"""At the session's end the plugin drops every run's per-item state (the
journal indexes, decisions and results) before pytest's last garbage
collection, so that collection does not walk it (issue #34)."""

from __future__ import annotations

import pytest

CONFTEST = """
import gc
from pathlib import Path

from pytest_evalreplay import Generation


class Echo:
    kind, model = "echo", "echo-1"

    def generate(self, requests):
        return [[Generation("ok") for _ in r.rollouts] for r in requests]


def pytest_evalreplay_make_provider(config, kind):
    return Echo()


def pytest_unconfigure(config):
    # A conftest's hook runs after the plugin's and before pytest's own, which collects.
    alive = [type(o).__name__ for o in gc.get_objects()]
    names = ("JournalIndex", "TaskRecorder", "TaskRun", "GenRef")
    Path("alive.txt").write_text(" ".join(f"{n}={alive.count(n)}" for n in names))
"""

TASK = """
from pytest_evalreplay import EvalTask

t = EvalTask("t", [{"id": f"q{i}"} for i in range(30)], prompt="{id}", scorer=lambda text, i: 1.0)
"""


@pytest.mark.slow  # a subprocess: in process, gc.get_objects() would see the outer session's objects too
def test_the_runs_state_is_gone_before_pytests_last_collection(pytester: pytest.Pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_t=TASK)
    result = pytester.runpytest_subprocess("--evalreplay-provider=echo", "-p", "no:randomly")
    result.assert_outcomes(passed=30)
    assert (pytester.path / "alive.txt").read_text() == "JournalIndex=0 TaskRecorder=0 TaskRun=0 GenRef=0"
