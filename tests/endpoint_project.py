"""Agents written with the real openai SDK (and the Agents SDK) against
`llm.base_url`, for the endpoint tests. The model is the local HTTP stub
(tests/http_stub.py) behind `--evalreplay-provider=openai`: it answers a
request whose last message is not a tool result with a call of the first
tool, `{"text": <that message>}`, and a tool result R with `R|seed=...|i=0`."""

from __future__ import annotations

from pathlib import Path

import orjson

SYNC = r"""
import json

import openai

from pytest_evalreplay import EvalTask

ECHO = {"type": "function", "function": {"name": "echo", "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}}}}}


def solve(instance, llm):
    # Even instances: one tool round (2 turns); odd ones ask again (4 turns).
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    messages = [{"role": "user", "content": instance["q"]}]
    rounds = 1 + instance["n"] % 2
    with client:
        while True:
            reply = client.chat.completions.create(
                model="any", messages=messages, tools=[ECHO], temperature=0)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if message.tool_calls:
                for call in message.tool_calls:
                    text = json.loads(call.function.arguments)["text"]
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": text.upper()})
                continue
            rounds -= 1
            if not rounds:
                return message.content
            messages.append({"role": "user", "content": instance["q"] + "-again"})


agent = EvalTask("agent", [{"id": f"q{n}", "n": n, "q": f"word{n}"} for n in range(6)], agent=solve,
                 scorer=lambda text, inst: inst["q"].upper() in text, max_turns=6)
"""

# The same agent, async, streaming every turn.
ASYNC = r"""
import json

import openai

from pytest_evalreplay import EvalTask

ECHO = {"type": "function", "function": {"name": "echo", "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}}}}}


async def turn(client, messages):
    text, calls = "", {}
    stream = await client.chat.completions.create(
        model="any", messages=messages, tools=[ECHO], temperature=0, stream=True,
        stream_options={"include_usage": True})
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                slot = calls.setdefault(call.index, {"id": call.id, "type": "function",
                                                     "function": {"name": "", "arguments": ""}})
                slot["function"]["name"] += call.function.name or ""
                slot["function"]["arguments"] += call.function.arguments or ""
    message = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


async def solve(instance, llm):
    client = openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    messages = [{"role": "user", "content": instance["q"]}]
    rounds = 1 + instance["n"] % 2
    async with client:
        while True:
            message = await turn(client, messages)
            messages.append(message)
            if message.get("tool_calls"):
                for call in message["tool_calls"]:
                    text = json.loads(call["function"]["arguments"])["text"]
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": text.upper()})
                continue
            rounds -= 1
            if not rounds:
                return message["content"]
            messages.append({"role": "user", "content": instance["q"] + "-again"})


agent = EvalTask("agent", [{"id": f"q{n}", "n": n, "q": f"word{n}"} for n in range(6)], agent=solve,
                 scorer=lambda text, inst: inst["q"].upper() in text, max_turns=6)
"""

# A program: the sync agent's loop as a script, one episode per process.
PROGRAM = r"""
import json
import sys

import openai

ECHO = {"type": "function", "function": {"name": "echo", "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}}}}}

instance = json.load(sys.stdin)
client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY: the episode's
messages = [{"role": "user", "content": instance["q"]}]
rounds = 1 + instance["n"] % 2
while True:
    message = client.chat.completions.create(model="any", messages=messages, tools=[ECHO]).choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    if message.tool_calls:
        for call in message.tool_calls:
            text = json.loads(call.function.arguments)["text"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": text.upper()})
        continue
    rounds -= 1
    if not rounds:
        print(message.content)
        break
    messages.append({"role": "user", "content": instance["q"] + "-again"})
"""

COMMAND = r"""
import sys

from pytest_evalreplay import EvalTask
from pytest_evalreplay.agent import command

agent = EvalTask("agent", [{"id": f"q{n}", "n": n, "q": f"word{n}"} for n in range(6)],
                 agent=command([sys.executable, "my_agent.py"], timeout=60),
                 scorer=lambda text, inst: inst["q"].upper() in text, max_turns=6)
"""

# The OpenAI Agents SDK: an Agent with one function tool, run by its Runner,
# through chat completions and through the Responses API, streamed and not.
AGENTS_SDK = r"""
from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool
from agents import set_tracing_disabled
from openai import AsyncOpenAI

from pytest_evalreplay import EvalTask

set_tracing_disabled(True)  # else it sends traces to OpenAI


@function_tool
def echo(text: str) -> str:
    '''Echo the text in upper case.'''
    return text.upper()


async def solve(instance, llm):
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    model = {"chat": OpenAIChatCompletionsModel, "responses": OpenAIResponsesModel}[instance["api"]]
    agent = Agent(name="echoer", instructions="Use the echo tool.", tools=[echo],
                  model=model(model="stub-model", openai_client=client))
    if instance["stream"]:
        result = Runner.run_streamed(agent, instance["q"])
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(agent, instance["q"])
    await client.close()
    return result.final_output


INSTANCES = [{"id": f"q{n}-{api}{'-stream' if s else ''}", "api": api, "stream": s, "q": f"word{n}"}
             for n in range(2) for api in ("chat", "responses") for s in (False, True)]
agent = EvalTask("agent", INSTANCES, agent=solve, scorer=lambda text, inst: inst["q"].upper() in text,
                 max_turns=6)
"""

# One episode making concurrent calls: two different requests at once, then
# two equal ones at once, then a last one over their answers. The provider
# (a conftest's) answers `echo:<last message>` and logs what it was asked.
CONCURRENT_CONFTEST = r"""
from pathlib import Path

from pytest_evalreplay import Generation


class Echo:
    kind, model, batch_size = "echo", "echo-1", None

    def generate(self, requests):
        with open(Path(__file__).parent / "calls.log", "a") as log:
            for r in requests:
                log.write(r.context[-1]["content"] + "\n")
        return [[Generation("echo:" + r.context[-1]["content"], finish_reason="stop")] for r in requests]


def pytest_evalreplay_make_provider(config, kind):
    return Echo() if kind == "echo" else None
"""

CONCURRENT = r"""
import threading
from concurrent.futures import ThreadPoolExecutor

import openai

from pytest_evalreplay import EvalTask


def solve(instance, llm):
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    both = threading.Barrier(2)

    def ask(text):
        both.wait(timeout=30)  # both calls are in flight at once
        messages = [{"role": "user", "content": text}]
        return client.chat.completions.create(model="m", messages=messages).choices[0].message.content

    q = instance["id"]
    with client, ThreadPoolExecutor(2) as pool:
        a, b = pool.map(ask, [q + "-a", q + "-b"])
        c, d = pool.map(ask, [q + "-same", q + "-same"])
        both = threading.Barrier(1)
        return ask(" ".join([a, b, c, d]))


agent = EvalTask("agent", [{"id": f"q{n}"} for n in range(3)], agent=solve,
                 scorer=lambda text, inst: text.count("echo:") == 5)
"""


def openai_args(url: str, *more: str) -> list[str]:
    """A pytester run of a project's agents against the openai provider at
    `url` (the local HTTP stub); subprocess_pytest's `openai_args` is the same
    for a child process."""
    return [
        "-p",
        "no:randomly",
        "--evalreplay-provider=openai",
        "--evalreplay-model=stub-model",
        f"--evalreplay-base-url={url}",
        *more,
    ]


def transcripts(run: Path) -> list[dict]:
    """The rows of the run dir's agent-transcripts.jsonl."""
    return [orjson.loads(line) for line in (run / "agent-transcripts.jsonl").read_bytes().splitlines()]
