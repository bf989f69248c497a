"""The OpenAI-compatible endpoint per episode: agents written with the real
openai SDK, journaled turn by turn, resumed and replayed without a model."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from endpoint_project import ASYNC, COMMAND, PROGRAM, SYNC
from http_stub import StubServer

pytest.importorskip("openai", reason="the endpoint tests use the real openai SDK (a test extra)")


def openai_args(url: str, *more: str) -> list[str]:
    return [
        "-p",
        "no:randomly",
        "--evalreplay-provider=openai",
        "--evalreplay-model=stub-model",
        f"--evalreplay-base-url={url}",
        *more,
    ]


@pytest.fixture
def stub():
    with StubServer("stub-model") as server:
        yield server


def rows(run: Path) -> list[dict]:
    return [orjson.loads(line) for line in (run / "agent-transcripts.jsonl").read_bytes().splitlines()]


@pytest.mark.parametrize("source", [SYNC, ASYNC], ids=["sync", "async-streaming"])
def test_an_openai_sdk_agent_runs_resumes_and_replays_through_the_endpoint(pytester, stub, source):
    pytester.makepyfile(test_agent=source)
    pytester.runpytest(*openai_args(stub.url, "--evalreplay-output=run")).assert_outcomes(passed=6)
    assert stub.answered == 3 * 2 + 3 * 4  # even episodes: 2 turns, odd ones: 4
    first = rows(pytester.path / "run")
    assert first[1]["answer"] == "WORD1-AGAIN|seed=None|i=0"
    assert [t["finish_reason"] for t in first[1]["turns"]] == ["tool_calls", "stop"] * 2

    stub.answered = 0  # a resume answers every turn from the journal
    done = pytester.runpytest(*openai_args(stub.url, "--evalreplay-output=run", "--resume"))
    done.assert_outcomes(passed=6)
    assert stub.answered == 0
    assert rows(pytester.path / "run") == first

    # Replay: no model at all (the openai provider is not even configured).
    done = pytester.runpytest(
        "-p", "no:randomly", "--evalreplay-predictions=run", "--evalreplay-output=again"
    )
    done.assert_outcomes(passed=6)
    assert stub.answered == 0
    assert [r["answer"] for r in rows(pytester.path / "again")] == [r["answer"] for r in first]


def test_a_command_agent_runs_the_program_per_episode_and_replays(pytester, stub):
    pytester.makepyfile(test_agent=COMMAND)
    (pytester.path / "my_agent.py").write_text(PROGRAM)
    pytester.runpytest(*openai_args(stub.url, "--evalreplay-output=run")).assert_outcomes(passed=6)
    assert stub.answered == 3 * 2 + 3 * 4
    assert rows(pytester.path / "run")[3]["answer"] == "WORD3-AGAIN|seed=None|i=0"
    stub.answered = 0
    done = pytester.runpytest(
        "-p", "no:randomly", "--evalreplay-predictions=run", "--evalreplay-output=again"
    )
    done.assert_outcomes(passed=6)
    assert stub.answered == 0


def test_a_failing_program_fails_its_item_with_its_last_stderr_lines(pytester, stub):
    pytester.makepyfile(test_agent=COMMAND)
    (pytester.path / "my_agent.py").write_text(
        "import json, sys\nn = json.load(sys.stdin)['n']\nif n == 2:\n"
        "    print('it broke here', file=sys.stderr)\n    sys.exit(3)\nprint('WORD%d' % n)\n"
    )
    result = pytester.runpytest(*openai_args(stub.url, "--evalreplay-output=run"))
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(["*exited with status 3; its last stderr lines:*", "*it broke here*"])
