"""A real SIGKILL mid-episode: the child pytest's provider kills its own
process when asked for turn 2, after every turn 1 and its tool result were
journaled. `--resume` asks the model only for the turns not journaled, and
the transcripts are byte-identical to an uninterrupted run's.

Each run is a real `python -m pytest` process (a signal to an in-process
pytester run would kill the test session too)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from agent_project import AGENT, CONFTEST, INI
from subprocess_pytest import PYTEST, child_env, openai_args, reap_group

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


STUB_AGENT = r"""
from pytest_evalreplay import EvalTask
from pytest_evalreplay.agent import tool_message

ECHO = {"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}


def echo(text):
    return text.upper()


def solve(instance, llm):
    # Even instances: one tool round (2 turns); odd ones ask again (4 turns).
    messages = [{"role": "user", "content": instance["q"]}]
    rounds = 1 + instance["n"] % 2
    while True:
        turn = llm.chat(messages, tools=[ECHO], temperature=0)
        messages.append(turn.message)
        if turn.tool_calls:
            for call in turn.tool_calls:
                messages.append(tool_message(call, llm.tool(call, echo)))
            continue
        rounds -= 1
        if not rounds:
            return turn.text
        messages.append({"role": "user", "content": instance["q"] + "-again"})


agent = EvalTask("agent", [{"id": f"q{n}", "n": n, "q": f"word{n}"} for n in range(6)], agent=solve,
                 scorer=lambda text, inst: inst["q"].upper() in text, max_turns=6)
"""


def stub_project(root: Path) -> Path:
    root.mkdir()
    (root / "test_agent.py").write_text(STUB_AGENT)
    return root


def again(body: dict) -> bool:
    """Turn 3 of an odd episode: the user asked again (its turns 1-2 and tool result are journaled)."""
    return body["messages"][-1]["content"].endswith("-again")


@pytest.mark.slow
def test_a_sigkill_mid_episode_against_the_openai_stub_resumes_only_the_turns_not_journaled(tmp_path):
    from http_stub import StubServer

    with StubServer("stub-model") as stub:
        args = openai_args(stub.url)
        clean = stub_project(tmp_path / "clean")
        done = subprocess.run(args, cwd=clean, env=child_env(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert stub.answered == 3 * 2 + 3 * 4  # even episodes: 2 turns, odd ones: 4

        killed = stub_project(tmp_path / "killed")
        stub.answered = 0
        stub.hold_if = again
        child = subprocess.Popen(
            args,
            cwd=killed,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            assert stub.wait_until(lambda s: s.in_flight == 3, timeout=90), "turn 3 never reached the stub"
            os.killpg(child.pid, signal.SIGKILL)  # the child pytest and anything it started
            assert child.wait(timeout=30) == -signal.SIGKILL
        finally:
            reap_group(child)
        # Counted before the held turns are let go: released to a client that is
        # gone, one can still be written as a 200 before the stub sees the closed
        # socket (CI counted 13), and no answer after the kill reaches the child.
        assert stub.answered == 3 * 2 + 3 * 2  # turns 1-2 of every episode; turn 3 never answered
        stub.release()
        assert stub.wait_until(lambda s: s.in_flight == 0, timeout=30)
        assert not (killed / "run" / "agent-transcripts.jsonl").exists()

        stub.answered, first = 0, len(stub.requests)
        done = subprocess.run(
            [*args, "--resume"], cwd=killed, env=child_env(), capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
        asked = [body for _, _, body in stub.requests[first:]]
        assert stub.answered == len(asked) == 3 * 2  # turns 3 and 4 of the odd episodes, nothing else
        firsts = sorted(body["messages"][0]["content"] for body in asked)
        assert firsts == sorted(["word1", "word3", "word5"] * 2)
        assert all(len(body["messages"]) >= 5 for body in asked)  # none of turns 1-2 asked again
        clean_transcripts = (clean / "run" / "agent-transcripts.jsonl").read_bytes()
        assert (killed / "run" / "agent-transcripts.jsonl").read_bytes() == clean_transcripts
        assert clean_transcripts.count(b"\n") == 6
