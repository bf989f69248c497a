"""A small agent suite for pytester tests: a rule-based chat model that calls
an `add` tool, and an agent loop over it. The model logs every turn it is
asked for (`calls.log`), so a test can tell which turns went to the model."""

from __future__ import annotations

CONFTEST = r"""
import re
from pathlib import Path

import orjson

from pytest_evalreplay import Generation


class ChatModel:
    kind = "chatrules"
    model = "chatrules-v1"
    batch_size = None

    def generate(self, requests):
        with open(Path(__file__).parent / "calls.log", "a") as log:
            log.write(" ".join(r.instance_id for r in requests) + "\n")
        out = []
        for r in requests:
            last = r.context[-1]
            if last["role"] == "user":
                a, b = map(int, re.findall(r"-?\d+", last["content"])[:2])
                call = {
                    "id": f"call{len(r.context)}",
                    "type": "function",
                    "function": {"name": "add", "arguments": orjson.dumps({"a": a, "b": b}).decode()},
                }
                out.append([Generation("", finish_reason="tool_calls", prompt_tokens=3, completion_tokens=2,
                                       tool_calls=(call,))])
            else:
                out.append([Generation(f"The answer is {last['content']}", finish_reason="stop",
                                       prompt_tokens=5, completion_tokens=4)])
        return out


def pytest_evalreplay_make_provider(config, kind):
    return ChatModel() if kind == "chatrules" else None
"""

AGENT = r"""
from pytest_evalreplay import EvalTask
from pytest_evalreplay.agent import tool_message

ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


def add(a, b):
    return a + b


def solve(instance, llm):
    messages = [{"role": "user", "content": f"What is {instance['a']} + {instance['b']}?"}]
    while True:
        turn = llm.chat(messages, tools=[ADD])
        messages.append(turn.message)
        if not turn.tool_calls:
            return turn.text
        for call in turn.tool_calls:
            messages.append(tool_message(call, llm.tool(call, add)))


def score(text, instance):
    return text.endswith(str(instance["a"] + instance["b"]))


sums = EvalTask(
    "sums", [{"id": f"q{i}", "a": i, "b": 2 * i} for i in range(6)], agent=solve, scorer=score, max_turns=4
)
"""

INI = "[pytest]\nevalreplay_provider = chatrules\n"
