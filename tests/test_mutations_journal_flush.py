"""A failed attempt is durable before its retry is asked: a provider fails
retryably, then the process is SIGKILLed inside the retry's provider call. The
journal file must hold the failed attempt, so `--resume` continues the attempt
count instead of starting it again. A real `python -m pytest` process: a
signal to an in-process pytester run would kill the test session too."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from subprocess_pytest import PYTEST, child_env

from pytest_evalreplay.journal.index import JournalIndex

CONFTEST = """
import os, signal
from pytest_evalreplay import Generation, GenerationError

class Flaky:
    kind, model, batch_size = "flaky", "m1", None
    calls = 0

    def generate(self, requests):
        Flaky.calls += 1
        with open(os.environ["CALL_LOG"], "a") as fh:
            fh.write(f"{Flaky.calls}\\n")
        if Flaky.calls == 2 and os.environ.get("KILL_ON_RETRY"):
            os.kill(os.getpid(), signal.SIGKILL)
        return [GenerationError("server busy", retryable=True) for r in requests]

def pytest_evalreplay_make_provider(config, kind):
    return Flaky() if kind == "flaky" else None
"""

EVALS = """
from pytest_evalreplay import EvalTask

t = EvalTask("t", [{"id": "q0"}, {"id": "q1"}], prompt="Q {id}", scorer=lambda text, inst: 1.0)
"""

KEYS = [(1, "q0", 0), (1, "q1", 0)]


def run(path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    cmd = [*PYTEST, "--evalreplay-provider=flaky", f"--evalreplay-output={path / 'out'}", "-q", *args]
    env = child_env(("KILL_",), CALL_LOG=str(path / "calls.log"), **env)
    return subprocess.run(cmd, cwd=path, env=env, capture_output=True, text=True, timeout=120)


def attempts(path: Path) -> dict[tuple[int, str, int], list[tuple[int, bool]]]:
    index = JournalIndex.read(path / "out", "t")
    return {
        key: [(ref.failure.attempt, ref.failure.final) for ref in index.fails.get(key, [])] for key in KEYS
    }


@pytest.mark.slow  # two pytest processes: about 2-3 s
def test_a_failed_attempt_is_in_the_journal_before_its_retry_is_asked(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_evals.py").write_text(EVALS)
    killed = run(tmp_path, "--evalreplay-max-attempts=3", KILL_ON_RETRY="1")
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert (tmp_path / "calls.log").read_text().split() == ["1", "2"]  # killed inside the retry
    assert attempts(tmp_path) == {key: [(1, False)] for key in KEYS}

    resumed = run(tmp_path, "--resume", "--evalreplay-max-attempts=2")
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert "2 failed" in resumed.stdout
    # One more attempt each, counted on from the journal's: attempt 2 is the last under the cap.
    assert attempts(tmp_path) == {key: [(1, False), (2, True)] for key in KEYS}
