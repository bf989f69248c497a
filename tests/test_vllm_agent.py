"""A multi-turn chat episode on the real vLLM engine (CPU build, the tiny
random Llama): generated, SIGKILLed mid-episode (the child pytest's whole
process group: vLLM leaves engine processes behind otherwise), resumed
asking the engine only for the turns not journaled, then replayed with vLLM
unimportable and the tool raising if called: the same transcripts, the
same scores.

The random model writes no tool calls, so the tool step is scripted: the
agent itself calls `count` on each turn's text through `llm.tool`, which
journals and replays it like a model's call."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import orjson
import pytest
from subprocess_pytest import PYTEST, child_env, reap_group

pytestmark = pytest.mark.slow

# Logs every batch of turns the engine is asked for (a spy: it forwards to the real call).
CONFTEST = """
from pathlib import Path

from pytest_evalreplay.providers import vllm

_real = vllm.VllmProvider.generate_stream


def _logged(self, requests):
    with open(Path(__file__).parent / "engine.log", "a") as log:
        log.write(" ".join(r.instance_id for r in requests) + "\\n")
    yield from _real(self, requests)


vllm.VllmProvider.generate_stream = _logged
"""

AGENT = r"""
import json
import os
import time
from pathlib import Path

from pytest_evalreplay import EvalTask
from pytest_evalreplay.agent import tool_message


def count(text):
    if os.environ.get("TOOL_GONE"):
        raise RuntimeError("the tool ran")
    with open(Path(__file__).parent / "tool.log", "a") as log:
        log.write("ran\n")
    return len(text)


def solve(instance, llm):
    messages = [{"role": "user", "content": instance["q"]}]
    for number in (1, 2, 3):
        turn = llm.chat(messages)
        messages.append(turn.message)
        if number == 2 and os.environ.get("HANG_AFTER_TURN_2"):
            (Path(__file__).parent / f"at-turn-2-{instance['id']}").touch()
            time.sleep(600)  # until the test kills the process group
        call = {"id": f"c{number}", "type": "function",
                "function": {"name": "count", "arguments": json.dumps({"text": turn.text})}}
        messages.append(tool_message(call, llm.tool(call, count)))
    return turn.text


chat = EvalTask("chat", [{"id": f"q{i}", "q": f"{i}+{i}?"} for i in range(3)], agent=solve,
                scorer=lambda text, inst: float(len(text) % 2), sampling={"temperature": 0, "max_tokens": 4})
"""


def project(root: Path) -> Path:
    (root / "conftest.py").write_text(CONFTEST)
    (root / "test_chat.py").write_text(AGENT)
    return root


def asked(root: Path) -> list[str]:
    log = root / "engine.log"
    turns = log.read_text().split() if log.exists() else []
    log.unlink(missing_ok=True)
    return sorted(turns)


def tool_runs(root: Path) -> int:
    log = root / "tool.log"
    runs = len(log.read_text().split()) if log.exists() else 0
    log.unlink(missing_ok=True)
    return runs


def test_a_vllm_chat_episode_killed_resumed_and_replayed_without_vllm(tmp_path, vllm_options):
    root = project(tmp_path)
    args = [*PYTEST, "-q", "-p", "no:randomly", "--evalreplay-output=run", *vllm_options]
    child = subprocess.Popen(
        args,
        cwd=root,
        env=child_env(HANG_AFTER_TURN_2="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 400
        while len(list(root.glob("at-turn-2-*"))) < 3:
            assert child.poll() is None, child.communicate()[0].decode()[-3000:]
            assert time.monotonic() < deadline, "the episodes never reached turn 2"
            time.sleep(0.2)
        os.killpg(child.pid, signal.SIGKILL)  # pytest, the engine and its workers
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        reap_group(child)
    assert asked(root) == sorted(f"q{i}|r0|t{t}" for i in range(3) for t in (1, 2))
    assert not (root / "run" / "chat-transcripts.jsonl").exists()
    assert tool_runs(root) == 3  # the tool step after turn 1; the one after turn 2 never came

    resumed = subprocess.run(
        [*args, "--resume"],
        cwd=root,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert asked(root) == sorted(f"q{i}|r0|t3" for i in range(3))
    assert tool_runs(root) == 3 * 2  # after turns 2 and 3; the one after turn 1 came from the journal
    rows = [orjson.loads(r) for r in (root / "run" / "chat-transcripts.jsonl").read_bytes().splitlines()]
    assert [len(r["turns"]) for r in rows] == [3, 3, 3] and all(r["answer"] is not None for r in rows)
    assert all(r["turns"][0]["prompt_tokens"] and r["turns"][2]["completion_tokens"] for r in rows)

    # Replay: vLLM unimportable, the tool raising if called.
    (root / "conftest.py").write_text("import sys\nsys.modules['vllm'] = None\n")
    replayed = subprocess.run(
        [*PYTEST, "-q", "-p", "no:randomly", "--evalreplay-predictions=run", "--evalreplay-output=again"],
        cwd=root,
        env=child_env(TOOL_GONE="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert replayed.returncode == 0, replayed.stdout[-3000:] + replayed.stderr[-3000:]
    run, again = root / "run", root / "again"
    assert (again / "chat-transcripts.jsonl").read_bytes() == (run / "chat-transcripts.jsonl").read_bytes()
    scores = [
        [orjson.loads(r)["scores"] for r in (d / "chat-predictions.jsonl").read_bytes().splitlines()]
        for d in (run, again)
    ]
    assert scores[0] == scores[1] and len(scores[0]) == 3
