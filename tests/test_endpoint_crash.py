"""A real SIGKILL mid-episode of agents written with the real clients against
`llm.base_url` (the openai SDK sync and async streaming, the Agents SDK
through chat completions and through the Responses API, a `command([...])`
program), then `--resume`: the model is asked only for the turns not
journaled, and the transcripts are byte-identical to an uninterrupted run's.
A replay of the run dir with the openai provider unimportable gives the
same scores.

The model is the local HTTP stub behind `--evalreplay-provider=openai`. At
concurrency 1 the episodes run one after another, so the turn the stub holds
(a middle turn of episode q1) is the only one in flight when the child
pytest's process group is killed. Each run is a real `python -m pytest`."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
from endpoint_project import AGENTS_SDK, ASYNC, COMMAND, PROGRAM, SYNC
from subprocess_pytest import PYTEST, child_env, openai_args, reap_group

pytest.importorskip("openai", reason="the endpoint tests use the real openai SDK (a test extra)")

# Replay must not touch the model: the provider module cannot even be imported.
NO_PROVIDER = "import sys\nsys.modules['pytest_evalreplay.providers.openai'] = None\n"
ONE_API = 'for api in ("chat", "responses")'


def agents_sdk(api: str) -> str:
    assert ONE_API in AGENTS_SDK
    return AGENTS_SDK.replace(ONE_API, f"for api in ({api!r},)")


# Each client: its test file, its program (command agents), its items, and the
# content of the last message of the turn the stub holds (q1's middle turn).
CLIENTS: dict[str, tuple[str, str | None, int, str]] = {
    "openai-sync": (SYNC, None, 6, "word1-again"),
    "async-streaming": (ASYNC, None, 6, "word1-again"),
    "agents-sdk-chat": (agents_sdk("chat"), None, 4, "WORD1"),
    "agents-sdk-responses": (agents_sdk("responses"), None, 4, "WORD1"),
    "command": (COMMAND, PROGRAM, 6, "word1-again"),
}


def project(root: Path, client: str) -> Path:
    source, program, _, _ = CLIENTS[client]
    root.mkdir()
    (root / "test_agent.py").write_text(source)
    if program is not None:
        (root / "my_agent.py").write_text(program)
    return root


def run(args: list[str], root: Path) -> None:
    done = subprocess.run(args, cwd=root, env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def answered_since(stub: Any, start: int) -> list[bytes]:
    """What the stub answered since its `start`-th answer, each as canonical JSON."""
    return sorted(orjson.dumps(p, option=orjson.OPT_SORT_KEYS) for p in stub.prompts()[start:])


def predictions(root: Path, run_dir: str = "run") -> list[tuple[str, Any]]:
    rows = (root / run_dir / "agent-predictions.jsonl").read_bytes().splitlines()
    return sorted((row["instance_id"], row["scores"]) for row in map(orjson.loads, rows))


@pytest.mark.slow
@pytest.mark.parametrize("client", list(CLIENTS))
def test_a_sigkill_mid_episode_resumes_only_the_turns_not_journaled(tmp_path, client):
    if client.startswith("agents-sdk"):
        pytest.importorskip("agents", reason="the OpenAI Agents SDK (openai-agents, a test extra)")
    from http_stub import StubServer

    held = CLIENTS[client][3]
    with StubServer("stub-model") as stub:
        args = openai_args(stub.url, "--evalreplay-concurrency=1")
        clean = project(tmp_path / "clean", client)
        run(args, clean)
        every_turn = answered_since(stub, 0)

        killed = project(tmp_path / "killed", client)
        start = len(stub.prompts())
        stub.hold_if = lambda body: body["messages"][-1].get("content") == held
        child = subprocess.Popen(
            args,
            cwd=killed,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            assert stub.wait_until(lambda s: s.in_flight == 1, timeout=180), "the held turn never came"
            os.killpg(child.pid, signal.SIGKILL)  # the child pytest and anything in its group
            assert child.wait(timeout=30) == -signal.SIGKILL
        finally:
            reap_group(child)
        before_kill = answered_since(stub, start)  # counted before the held turn is let go
        stub.release()
        assert stub.wait_until(lambda s: s.in_flight == 0, timeout=30)
        assert before_kill and len(before_kill) < len(every_turn)
        assert not (killed / "run" / "agent-transcripts.jsonl").exists()

        start = len(stub.prompts())
        run([*args, "--resume"], killed)
        # The model is asked for exactly the turns it had not answered before the kill.
        asked = answered_since(stub, start)
        missing = list(every_turn)
        for body in before_kill:
            missing.remove(body)
        assert asked == missing
        assert any(held.encode() in body for body in asked)  # the turn in flight is asked again
        clean_transcripts = (clean / "run" / "agent-transcripts.jsonl").read_bytes()
        assert (killed / "run" / "agent-transcripts.jsonl").read_bytes() == clean_transcripts
        assert clean_transcripts.count(b"\n") == CLIENTS[client][2]

        # Replay: no model, the provider unimportable; the same scores.
        (killed / "conftest.py").write_text(NO_PROVIDER)
        start = len(stub.prompts())
        run(
            [*PYTEST, "-q", "-p", "no:randomly", "--evalreplay-predictions=run", "--evalreplay-output=again"],
            killed,
        )
        assert len(stub.prompts()) == start
        assert predictions(killed, "again") == predictions(clean) == predictions(killed)
        assert all(scores == {"score": 1.0} for _, scores in predictions(clean))
