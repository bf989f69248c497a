"""docs/agents.md's LangChain recipe, run as written: `ChatOpenAI` at the
episode's `llm.base_url` with one tool bound, against the local HTTP stub
model, then resumed (nothing asked again) and replayed (no model at all).
langchain-openai is not a test extra (it is heavy): this skips without it."""

from __future__ import annotations

import pytest
from endpoint_project import openai_args, transcripts
from http_stub import StubServer

pytest.importorskip("langchain_openai", reason="langchain-openai is not installed (not a test extra)")

LANGCHAIN = r"""
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from pytest_evalreplay import EvalTask


@tool
def echo(text: str) -> str:
    "The text, upper-cased."
    return text.upper()


def solve(instance, llm):
    model = ChatOpenAI(model="any", base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    model = model.bind_tools([echo])
    messages = [HumanMessage(instance["q"])]
    while True:
        reply = model.invoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            return reply.content
        for call in reply.tool_calls:
            messages.append(ToolMessage(echo.invoke(call["args"]), tool_call_id=call["id"]))


agent = EvalTask("agent", [{"id": f"q{n}", "q": f"word{n}"} for n in range(4)], agent=solve,
                 scorer=lambda text, inst: inst["q"].upper() in text, max_turns=4)
"""


def test_the_langchain_recipe_runs_resumes_and_replays_through_the_endpoint(pytester):
    pytester.makepyfile(test_agent=LANGCHAIN)
    with StubServer("stub-model") as stub:
        pytester.runpytest(*openai_args(stub.url, "--evalreplay-output=run")).assert_outcomes(passed=4)
        assert stub.answered == 4 * 2  # a call of the bound tool, then the answer
        first = transcripts(pytester.path / "run")
        assert [r["answer"] for r in first] == [f"WORD{n}|seed=None|i=0" for n in range(4)]
        assert [m["role"] for m in first[0]["messages"]] == ["user", "assistant", "tool", "assistant"]
        assert first[0]["turns"][0]["tools"][0]["function"]["name"] == "echo"

        stub.answered = 0  # a resume answers every turn from the journal
        done = pytester.runpytest(*openai_args(stub.url, "--evalreplay-output=run", "--resume"))
        done.assert_outcomes(passed=4)
        assert stub.answered == 0
        assert transcripts(pytester.path / "run") == first

    # Replay: no model at all (the stub is gone, the openai provider not configured).
    done = pytester.runpytest(
        "-p", "no:randomly", "--evalreplay-predictions=run", "--evalreplay-output=again"
    )
    done.assert_outcomes(passed=4)
    assert transcripts(pytester.path / "again") == first
