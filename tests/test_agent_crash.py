"""A real SIGKILL mid-episode: the child pytest's provider kills its own
process when asked for turn 2, after every turn 1 and its tool result were
journaled. `--resume` asks the model only for the turns not journaled, and
the transcripts are byte-identical to an uninterrupted run's.

Each run is a real `python -m pytest` process (a signal to an in-process
pytester run would kill the test session too)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from agent_project import AGENT, CONFTEST, INI
from subprocess_pytest import PYTEST, child_env

LOG = 'log.write(" ".join(r.instance_id for r in requests) + "\\n")'
KILLING_CONFTEST = CONFTEST.replace(
    LOG,
    LOG
    + """
        turn = os.environ.get("KILL_AT_TURN")
        if turn and any(r.instance_id.endswith("|t" + turn) for r in requests):
            os.kill(os.getpid(), signal.SIGKILL)  # the log is closed: written""",
).replace("import re\n", "import os\nimport re\nimport signal\n")


def project(root: Path) -> Path:
    root.mkdir()
    (root / "conftest.py").write_text(KILLING_CONFTEST)
    (root / "pytest.ini").write_text(INI)
    (root / "test_sums.py").write_text(AGENT)
    return root


def run(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    command = [*PYTEST, "-q", "-p", "no:randomly", "--evalreplay-output=run", *args]
    return subprocess.run(
        command, cwd=root, env=child_env(drop=("KILL_",), **env), capture_output=True, text=True, timeout=120
    )


def asked(root: Path) -> list[str]:
    """The turns the model was asked for since the last call, and the log emptied."""
    log = root / "calls.log"
    turns = log.read_text().split() if log.exists() else []
    log.unlink(missing_ok=True)
    return turns


@pytest.mark.slow
def test_a_sigkill_mid_episode_resumes_asking_only_the_turns_not_journaled(tmp_path):
    assert LOG in CONFTEST  # the kill hooks into the model's call log
    clean = project(tmp_path / "clean")
    result = run(clean)
    assert result.returncode == 0, result.stdout + result.stderr
    every_turn = sorted(asked(clean))
    assert every_turn == sorted(f"q{i}|r0|t{t}" for i in range(6) for t in (1, 2))

    killed = project(tmp_path / "killed")
    result = run(killed, KILL_AT_TURN="2")
    assert result.returncode == -signal.SIGKILL, result.stdout + result.stderr
    before_kill = asked(killed)
    assert sorted(before_kill) == every_turn  # turn 2 was asked for, never answered
    assert not (killed / "run" / "sums-transcripts.jsonl").exists()

    result = run(killed, "--resume")
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(asked(killed)) == sorted(f"q{i}|r0|t2" for i in range(6))
    clean_transcripts = (clean / "run" / "sums-transcripts.jsonl").read_bytes()
    assert (killed / "run" / "sums-transcripts.jsonl").read_bytes() == clean_transcripts
    assert clean_transcripts.count(b"\n") == 6
