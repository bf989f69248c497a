"""The harness's CPU per model turn of an agent task, over the same agent loop
run directly: 1,000 episodes x 10 model turns (a tool call per turn), an
instant provider and an instant tool, each side a child process.

Two agents, each against its own direct loop (both `-p no:evalreplay`, one
parametrized test per episode, so both sides pay pytest's item per episode,
as an agent task keeps one item per episode):

- `llm.chat`: `solve(instance, llm)` calling `llm.chat` / `llm.tool`, as an
  agent task, against the loop calling the provider directly.
- the endpoint: the same loop written with the openai SDK's own client (a
  copy per episode at `llm.base_url`, the tool run inside the agent), as an
  agent task, against the same client code talking HTTP to an instant server
  in a process of its own, unmeasured as a real model's server would be
  (the instant model's replies, built once). The client's own cost (its
  request building, HTTP, reply parsing: about 6 ms a turn here) is on both
  sides; the difference is the endpoint and the harness behind it.

The floor, beside them: the direct loop plus the least a harness that keeps
a crash to the turn in flight must do (each turn's request digested, each
model turn and tool result a journal line, orjson and one write(2), as it
exists), each episode run with and without that work in one process, in
turn first, so the difference is measured under one load.

When inspect_ai is importable, its own agent loop (`use_tools` +
`generate(tool_calls="loop")`) over the same instant model (a `ModelAPI`)
and tool runs side by side: its per-turn harness CPU is the slope between
10 turns and 1 turn an episode (start-up and per-sample costs cancel).

    python benchmarks/agent_overhead.py                # 1,000 episodes x 10 turns = 10k turns, 1 round
    python benchmarks/agent_overhead.py --runs 3       # steadier medians
    python benchmarks/agent_overhead.py --concurrency 1   # one episode at a time (nothing to batch)
    python benchmarks/agent_overhead.py --no-inspect   # skip inspect_ai (its 10k turns take minutes)
    python benchmarks/agent_overhead.py --no-endpoint --no-inspect   # llm.chat alone, quickly

Reported: median CPU time (user + system), wall time and peak RSS of each
side, and the harness CPU per model turn (the agent task's CPU less its
direct loop's, over the turns). Goals: at most 100 us a turn through
`llm.chat`, at most 1 ms a turn through the endpoint. The first round runs
every side at 5 episodes, to warm the bytecode and file caches, and is
dropped.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson
from scale_harness import BARE, Compared, Measure, child_env, expect_in, run_child, run_pytest, verdict

GOAL_CHAT_US = 100.0
GOAL_ENDPOINT_US = 1000.0

LOOP = '''
"""The agents, their tool and an instant provider, shared by every side."""
import os

import orjson
from pytest_evalreplay import Generation, Request
from pytest_evalreplay.agent import Turn, parse_call, tool_message
from pytest_evalreplay.model import digest_finite

TURNS = int(os.environ["BENCH_TURNS"])
EPISODES = int(os.environ["BENCH_EPISODES"])
STEP = {"type": "function", "function": {"name": "step", "parameters": {"type": "object"}}}
MODEL = "instant-chat-v1"


def step(n):
    return n + 1


def reply(done):
    """The instant model's turn after `done` tool results: a step, or the answer."""
    if done + 1 >= TURNS:
        return Generation(f"done after {done} steps", finish_reason="stop", prompt_tokens=1,
                          completion_tokens=1)
    call = {"id": f"c{done}", "type": "function",
            "function": {"name": "step", "arguments": orjson.dumps({"n": done}).decode()}}
    return Generation("", finish_reason="tool_calls", prompt_tokens=1, completion_tokens=1,
                      tool_calls=(call,))


class Instant:
    kind, model, batch_size = "instant-chat", MODEL, None

    def generate(self, requests):
        return [[reply(sum(m["role"] == "tool" for m in r.context))] for r in requests]


def solve(instance, llm):
    messages = [{"role": "user", "content": f"Take the steps for {instance['id']}."}]
    while True:
        turn = llm.chat(messages, tools=[STEP])
        messages.append(turn.message)
        if not turn.tool_calls:
            return turn.text
        for call in turn.tool_calls:
            messages.append(tool_message(call, llm.tool(call, step)))


def solve_sdk(instance, client):
    """The same loop with the openai SDK's client; the tool runs in the agent."""
    messages = [{"role": "user", "content": f"Take the steps for {instance['id']}."}]
    while True:
        message = client.chat.completions.create(model=MODEL, messages=messages, tools=[STEP])
        message = message.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content
        for call in message.tool_calls:
            result = step(**orjson.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})


INSTANCES = [{"id": f"e{i}"} for i in range(EPISODES)]
PROVIDER = Instant()


class DirectLLM:
    """The provider called directly: one request per turn, the tool run as is."""

    def __init__(self, instance_id):
        self.instance_id = instance_id

    def chat(self, messages, tools=None, **sampling):
        request = Request(task="steps", instance_id=self.instance_id, context=list(messages),
                          sampling=sampling, tools=tuple(tools or ()))
        return Turn.of(PROVIDER.generate([request])[0][0])

    def tool(self, call, fn):
        return fn(**parse_call(call)[1])


class FloorLLM(DirectLLM):
    """The direct loop plus the least a harness that keeps a crash to the turn
    in flight must do: each turn's request digested, each model turn and each
    tool result a journal line (orjson, one write(2)) as it exists."""

    journal = None

    def __init__(self, instance_id):
        super().__init__(instance_id)
        self.turns, self.sent, self.after = 0, 0, None
        if FloorLLM.journal is None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
            FloorLLM.journal = os.open("floor-journal.jsonl", flags, 0o644)

    def chat(self, messages, tools=None, **sampling):
        rq = digest_finite({"context": messages, "tools": tools or [], "sampling": sampling})
        turn = super().chat(messages, tools, **sampling)
        self.turns += 1
        row = {"key": f"{self.instance_id}|t{self.turns}", "rq": rq, "after": self.after,
               "added": messages[self.sent :], "reply": turn.message}
        os.write(self.journal, orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
        self.sent, self.after = len(messages), rq
        return turn

    def tool(self, call, fn):
        result = super().tool(call, fn)
        row = {"key": f"{self.instance_id}|{call['id']}", "after": self.after, "result": result}
        os.write(self.journal, orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
        return result
'''

CHAT_SIDE = """
from agent_loop import INSTANCES, TURNS, solve
from pytest_evalreplay import EvalTask

steps = EvalTask("steps", INSTANCES, agent=solve, scorer=lambda text, i: 1.0, max_turns=TURNS)
"""

ENDPOINT_SIDE = """
import openai
from agent_loop import INSTANCES, TURNS, solve_sdk
from pytest_evalreplay import EvalTask


# One client, each episode its copy at the episode's URL (its connection pool shared):
# a client of its own per episode costs about 50 ms of CPU (its TLS context), on both sides.
CLIENT = openai.OpenAI(base_url="http://unused.invalid/v1", api_key="none", max_retries=0)


def solve(instance, llm):
    return solve_sdk(instance, CLIENT.with_options(base_url=llm.base_url, api_key=llm.api_key))


steps = EvalTask("steps", INSTANCES, agent=solve, scorer=lambda text, i: 1.0, max_turns=TURNS)
"""

PLUGIN_CONFTEST = """
from agent_loop import Instant

def pytest_evalreplay_make_provider(config, kind):
    return Instant() if kind == "instant-chat" else None
"""

DIRECT_SIDE = """
import pytest
from agent_loop import INSTANCES, DirectLLM, solve


@pytest.mark.parametrize("instance", INSTANCES, ids=[i["id"] for i in INSTANCES])
def test_episode(instance):
    assert isinstance(solve(instance, DirectLLM(instance["id"])), str)
"""

# Each episode twice, with and without the floor's work (in turn first), the
# CPU of each timed in the one process: their difference under the same load.
FLOOR_SIDE = """
import atexit
import collections
import time

import orjson
import pytest
from agent_loop import INSTANCES, DirectLLM, FloorLLM, solve

SPENT = collections.Counter()
atexit.register(lambda: open("episodes-cpu.json", "wb").write(orjson.dumps(SPENT)))


@pytest.mark.parametrize("instance", INSTANCES, ids=[i["id"] for i in INSTANCES])
def test_episode(instance):
    for llm in (DirectLLM, FloorLLM) if int(instance["id"][1:]) % 2 else (FloorLLM, DirectLLM):
        start = time.thread_time()
        assert isinstance(solve(instance, llm(instance["id"])), str)
        SPENT[llm.__name__] += time.thread_time() - start
"""

DIRECT_SDK_SIDE = """
import os

import openai
import pytest
from agent_loop import INSTANCES, TURNS, solve_sdk

# The client as the endpoint side makes it, against the instant server (another process).
CLIENT = openai.OpenAI(base_url="http://unused.invalid/v1", api_key="none", max_retries=0)
URL = f"{os.environ['BENCH_SERVER']}/t{TURNS}/v1"


@pytest.mark.parametrize("instance", INSTANCES, ids=[i["id"] for i in INSTANCES])
def test_episode(instance):
    assert isinstance(solve_sdk(instance, CLIENT.with_options(base_url=URL, api_key="k")), str)
"""

# The direct SDK loop's model: an HTTP server in a process of its own (so its CPU is
# not the measured side's, as a real model's is not), answering the instant model's
# reply at once from bodies built once per turn count (`/t<TURNS>/v1/...`).
INSTANT_SERVER = """
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson

BODIES = {}


def body(turns, done):
    os.environ["BENCH_TURNS"], os.environ["BENCH_EPISODES"] = str(turns), "0"
    import agent_loop

    agent_loop.TURNS = turns
    gen = agent_loop.reply(done)
    message = {"role": "assistant", "content": gen.text}
    if gen.tool_calls:
        message["tool_calls"] = list(gen.tool_calls)
    return orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 0,
                         "model": agent_loop.MODEL, "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                         "total_tokens": 2}, "choices": [{"index": 0, "message": message,
                         "finish_reason": gen.finish_reason}]})


class Handler(BaseHTTPRequestHandler):
    protocol_version, wbufsize = "HTTP/1.1", 1 << 16

    def log_message(self, *args):
        pass

    def do_POST(self):
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        key = (int(self.path.split("/")[1][1:]), raw.count(b'"tool_call_id"'))
        if key not in BODIES:
            BODIES[key] = body(*key)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODIES[key])))
        self.end_headers()
        self.wfile.write(BODIES[key])


class Server(ThreadingHTTPServer):
    daemon_threads = True


server = Server(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""

INSPECT_SIDE = '''
"""inspect_ai's own agent loop over the same instant model and tool."""
import sys

from agent_loop import EPISODES, TURNS
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelAPI, ModelOutput, modelapi
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import tool


@tool
def step():
    async def execute(n: int) -> int:
        """Take a step.

        Args:
            n: the step's number.
        """
        return n + 1

    return execute


class Instant(ModelAPI):
    async def generate(self, input, tools, tool_choice, config):
        done = sum(m.role == "tool" for m in input)
        if done + 1 >= TURNS:
            return ModelOutput.from_content("instant", f"done after {done} steps")
        return ModelOutput.for_tool_call("instant", "step", {"n": done}, tool_call_id=f"c{done}")


@modelapi(name="instant")
def instant():
    return Instant


task = Task(
    dataset=[Sample(input=f"Take the steps for e{i}.", target="done", id=f"e{i}") for i in range(EPISODES)],
    solver=[use_tools(step()), generate(tool_calls="loop")],
    scorer=includes(),
)
log = eval(task, model="instant/x", log_dir=sys.argv[1], display="none", max_connections=int(sys.argv[2]))[0]
assert log.status == "success", log.status
print(f"inspect: {len(log.samples)} samples, accuracy {log.results.scores[0].metrics['accuracy'].value}")
'''

PROJECTS = {
    "direct": {"test_direct.py": DIRECT_SIDE},
    "floor": {"test_direct.py": FLOOR_SIDE},
    "llm.chat": {"conftest.py": PLUGIN_CONFTEST, "test_agent.py": CHAT_SIDE},
    "direct-sdk": {"test_direct.py": DIRECT_SDK_SIDE},
    "endpoint": {"conftest.py": PLUGIN_CONFTEST, "test_agent.py": ENDPOINT_SIDE},
    "inspect": {"inspect_side.py": INSPECT_SIDE},
    "server": {"instant_server.py": INSTANT_SERVER},
}


def projects(tmp: Path) -> dict[str, Path]:
    roots = {}
    for side, texts in PROJECTS.items():
        root = roots[side] = tmp / side
        root.mkdir(parents=True)
        (root / "agent_loop.py").write_text(LOOP)
        (root / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
        for name, text in texts.items():
            (root / name).write_text(text)
    return roots


def run_side(
    side: str, root: Path, out: Path, episodes: int, turns: int, concurrency: int | None, server: str
) -> Measure:
    env = {"BENCH_EPISODES": str(episodes), "BENCH_TURNS": str(turns), "BENCH_SERVER": server}
    if side == "inspect":
        argv = [sys.executable, "inspect_side.py", str(out), str(concurrency or 32)]
        m = run_child(root, argv, env=env)
        expect_in(m, f"inspect: {episodes} samples, accuracy 1.0")
        return m
    if side in ("direct", "direct-sdk", "floor"):
        m = run_pytest(root, BARE, env=env)
        expect_in(m, f"{episodes} passed")
        return m
    args = ["--evalreplay-provider=instant-chat", f"--evalreplay-output={out}"]
    if concurrency is not None:
        args.append(f"--evalreplay-concurrency={concurrency}")
    m = run_pytest(root, args, env=env)
    expect_in(m, f"steps: {episodes:,} instances, {episodes:,} items, 0 failed")
    return m


def measure(
    tmp: Path, episodes: int, turns: int, runs: int, concurrency: int | None, sides: list[str]
) -> tuple[dict[str, list[Measure]], list[float]]:
    """Each side's runs (`inspect-1`: inspect_ai at one turn an episode), in
    rotating order so that each side takes each place in turn; and the
    floor's own CPU in each round (its episodes with the floor's work less
    the same episodes without it, in one process)."""
    roots = projects(tmp)
    out: dict[str, list[Measure]] = {side: [] for side in sides}
    floors: list[float] = []
    # Reaped only after the last side: its CPU is in no side's RUSAGE_CHILDREN delta.
    server = subprocess.Popen(
        [sys.executable, "instant_server.py"], cwd=roots["server"], stdout=subprocess.PIPE, env=child_env()
    )
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        for n in range(runs + 1):  # round 0 warms the caches at 5 episodes, and is dropped
            for side in sides[n % len(sides) :] + sides[: n % len(sides)]:
                size = (5, min(turns, 2)) if n == 0 else (episodes, 1 if side == "inspect-1" else turns)
                project = side.removesuffix("-1")
                m = run_side(project, roots[project], tmp / f"out-{side}-{n}", *size, concurrency, url)
                if n:
                    out[side].append(m)
                if n and side == "floor":
                    spent = orjson.loads((roots["floor"] / "episodes-cpu.json").read_bytes())
                    floors.append(spent["FloorLLM"] - spent["DirectLLM"])
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()  # left open, its pipe is a ResourceWarning under -W error
    return out, floors


def per_turn_us(c: Compared, turns: int) -> float:
    return (c.median("a", "cpu") - c.median("b", "cpu")) / turns * 1e6


FIELDS = (("cpu", "CPU time", "s"), ("wall", "wall time", "s"), ("maxrss_mib", "peak RSS", "MiB"))
TITLES = {
    "llm.chat": " llm.chat vs the loop calling the provider directly:",
    "endpoint": " the endpoint (openai SDK client) vs the same client against an instant server:",
}


def side_report(
    runs: dict[str, list[Measure]], side: str, base: str, through: str, goal_us: float, total: int
) -> tuple[bool, str]:
    """Print `side` against the loop it replaces and its harness CPU a turn;
    whether that meets `goal_us`, and the goal's line for the end."""
    got = Compared(runs[side], runs[base])
    print(TITLES[side])
    for field, label, unit in FIELDS:
        print(got.line(field, label, unit, side, base))
    us = per_turn_us(got, total)
    print(f"  per turn : harness CPU through {through} {us:.0f} us")
    met = us <= goal_us
    return met, f"  goal     : {side} <= {goal_us:.0f} us a turn -> {verdict(met)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1_000)
    parser.add_argument("--turns", type=int, default=10, help="model turns per episode")
    parser.add_argument("--runs", type=int, default=1, help="rounds (each runs every side once)")
    parser.add_argument("--concurrency", type=int, help="--evalreplay-concurrency (default: the plugin's)")
    parser.add_argument("--no-inspect", action="store_true", help="leave inspect_ai out")
    parser.add_argument("--no-endpoint", action="store_true", help="llm.chat and its direct loop only")
    args = parser.parse_args(argv)
    sides = ["direct", "llm.chat", "floor"] + ([] if args.no_endpoint else ["direct-sdk", "endpoint"])
    with_inspect = not args.no_inspect and importlib.util.find_spec("inspect_ai") is not None
    if with_inspect and args.turns > 1:
        sides += ["inspect", "inspect-1"]
    total = args.episodes * args.turns
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="evalreplay-bench-") as name:
        runs, floors = measure(Path(name), args.episodes, args.turns, args.runs, args.concurrency, sides)
    print(
        f"{args.episodes:,} episodes x {args.turns} turns = {total:,} model turns, median of {args.runs} "
        "round(s): agent tasks vs the same loops run directly"
    )
    ok, goal = side_report(runs, "llm.chat", "direct", "llm.chat", GOAL_CHAT_US, total)
    floor = statistics.median(floors) / total * 1e6
    print(
        f"  floor    : each turn digested, each turn and tool result a journal line as it exists: "
        f"{floor:.1f} us a turn (rounds {min(floors) / total * 1e6:.1f}-{max(floors) / total * 1e6:.1f})"
    )
    goals = [goal]
    if "endpoint" in runs:
        met, goal = side_report(runs, "endpoint", "direct-sdk", "the endpoint", GOAL_ENDPOINT_US, total)
        ok = ok and met
        goals.append(goal)
    if "inspect" in runs:
        slope = Compared(runs["inspect"], runs["inspect-1"])
        inspect_us = per_turn_us(slope, args.episodes * (args.turns - 1))
        print(
            f"  inspect  : inspect_ai's own loop {slope.median('a', 'cpu'):.2f} s CPU at {args.turns} turns, "
            f"{slope.median('b', 'cpu'):.2f} s at 1 turn -> {inspect_us:.0f} us a turn"
        )
    print("\n".join(goals))
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
