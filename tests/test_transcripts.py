"""Transcripts and turn rows grow with the conversation, not with its
square: a turn that sent the first messages of the episode's conversation
says how many (`sent`), and its journal row holds only what it added; a
turn that sent anything else keeps its messages whole. Replay reads both,
and the layout written before (every turn's messages in full)."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from agent_project import AGENT, CONFTEST, INI

from pytest_evalreplay.journal.transcripts import SavedEpisodes, compact_turn, turn_messages
from pytest_evalreplay.model import EvalReplayError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DATA = Path(__file__).resolve().parent / "data"

U1, A1, T1, A2 = (
    {"role": r, "content": c}
    for r, c in (("user", "q"), ("assistant", ""), ("tool", "3"), ("assistant", "3"))
)


def turn(messages: list) -> dict:
    return {"turn": 1, "messages": messages, "tools": [], "reply": A1}


def test_a_turn_that_sent_the_first_messages_counts_them():
    final = [U1, A1, T1, A2]
    compact = compact_turn(turn([U1, A1, T1]), final)
    assert compact == {"turn": 1, "sent": 3, "tools": [], "reply": A1}
    assert turn_messages({"messages": final}, compact) == [U1, A1, T1]


def test_a_turn_that_sent_other_messages_keeps_them():
    rewritten = turn([{"role": "user", "content": "q, shortened"}])
    assert compact_turn(rewritten, [U1, A1, T1, A2]) is rewritten
    assert turn_messages({"messages": [U1]}, rewritten) == rewritten["messages"]


def _row(turns: list) -> dict:
    return {
        "instance_id": "e",
        "stage": 1,
        "rollout": 0,
        "turns": turns,
        "tool_results": [],
        "messages": [U1, A1],
    }


@pytest.mark.parametrize("sent", [3, -1, "2", None, 1.0])
def test_a_turn_counting_messages_the_row_lacks_is_refused_naming_the_line(tmp_path, sent):
    path = tmp_path / "t-transcripts.jsonl"
    path.write_bytes(
        orjson.dumps(_row([{"turn": 1, "sent": 1}])) + b"\n" + orjson.dumps(_row([{"turn": 1, "sent": sent}]))
    )
    with pytest.raises(
        EvalReplayError, match=r"t-transcripts.jsonl:2: turn 1 'sent' must count the row's first 'messages'"
    ):
        SavedEpisodes.read(path, "t")


def test_a_turn_that_is_not_an_object_is_refused(tmp_path):
    path = tmp_path / "t-transcripts.jsonl"
    path.write_bytes(orjson.dumps(_row(["turn one"])))
    with pytest.raises(EvalReplayError, match=r"t-transcripts.jsonl:1: turn 1 is not an object"):
        SavedEpisodes.read(path, "t")


def _journal_turns(run: Path) -> list[dict]:
    rows = [orjson.loads(line) for line in (run / "sums-turns-journal.jsonl").read_bytes().splitlines()]
    return [
        r["request"]
        for r in rows
        if r["type"] == "request" and r["request"].get("request_type") == "generate"
    ]


def test_a_turn_row_holds_what_the_turn_added(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makeini(INI)
    pytester.makepyfile(test_sums=AGENT)
    pytester.runpytest("--evalreplay-output=run").assert_outcomes(passed=6)
    turns = _journal_turns(pytester.path / "run")
    firsts = [t for t in turns if "context" in t]
    seconds = [t for t in turns if "added" in t]
    assert len(firsts) == len(seconds) == 6
    assert all(len(t["context"]) == 1 for t in firsts)
    assert all([m["role"] for m in t["added"]] == ["assistant", "tool"] for t in seconds)
    rows = [
        orjson.loads(x) for x in (pytester.path / "run" / "sums-transcripts.jsonl").read_bytes().splitlines()
    ]
    assert [t["sent"] for t in rows[0]["turns"]] == [1, 3] and len(rows[0]["messages"]) == 4


def test_an_agent_that_rewrites_its_history_keeps_each_turn_whole_and_replays(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makeini(INI)
    # The second turn sends the question restated with the tool's result: not the first turn's messages.
    pytester.makepyfile(
        test_sums=AGENT.replace(
            "            messages.append(tool_message(call, llm.tool(call, add)))",
            "            result = tool_message(call, llm.tool(call, add))\n"
            "            messages = [{'role': 'user', 'content': 'Say it.'}, result]",
        )
    )
    pytester.runpytest("--evalreplay-output=run").assert_outcomes(passed=6)
    rows = [
        orjson.loads(x) for x in (pytester.path / "run" / "sums-transcripts.jsonl").read_bytes().splitlines()
    ]
    assert "messages" in rows[0]["turns"][0] and rows[0]["turns"][1]["sent"] == 2
    assert all("context" in t for t in _journal_turns(pytester.path / "run"))
    result = pytester.runpytest("--evalreplay-predictions=run", "--evalreplay-output=again")
    result.assert_outcomes(passed=6)
    assert (pytester.path / "again" / "sums-transcripts.jsonl").read_bytes() == (
        pytester.path / "run" / "sums-transcripts.jsonl"
    ).read_bytes()


def test_transcripts_written_with_every_turns_messages_in_full_still_replay(pytester):
    shutil.copytree(EXAMPLES, pytester.path, dirs_exist_ok=True)
    shutil.copy(DATA / "agent_v1" / "calculator-transcripts.jsonl", pytester.path / "saved_run")
    result = pytester.runpytest(
        "--evalreplay-predictions=saved_run", "--evalreplay-output=replayed", "-k", "calculator"
    )
    result.assert_outcomes(passed=6, deselected=79)
    replayed = (pytester.path / "replayed" / "calculator-transcripts.jsonl").read_bytes()
    assert replayed == (EXAMPLES / "saved_run" / "calculator-transcripts.jsonl").read_bytes()
