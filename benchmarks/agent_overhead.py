"""The harness's cost per model turn of an agent task: the same agent loop
(`solve(instance, llm)`, a tool call per turn, an instant provider and an
instant tool) run as an agent task by the plugin, against the same loop
calling the provider directly, side by side, each in a child pytest process.
The direct loop runs two ways (both `-p no:evalreplay`): one parametrized
test per episode, so both sides pay pytest's item per episode (an agent
task keeps one item per episode), and all episodes in one plain test. A
fourth side, the floor, is the per-episode loop plus the least any harness
must do to keep the promise that a crash costs only the turn in flight:
each turn's request digested (what resume compares), each model turn and
each tool result appended as it exists (one write(2) each, to a file kept
open), each episode's answer a line; no lock, index, retry or run dir. Its
ratio to the per-episode loop is how much of the goal that work alone takes.

    python benchmarks/agent_overhead.py                # 1,000 episodes x 10 turns = 10k turns, 1 round
    python benchmarks/agent_overhead.py --runs 3       # steadier medians
    python benchmarks/agent_overhead.py --concurrency 1   # one episode at a time (nothing to batch)
    python benchmarks/agent_overhead.py --episodes 100 --turns 100   # long episodes

Reported: median CPU time (user + system), wall time and peak RSS of each
side, the plugin's ratios to both direct loops, and its marginal CPU per
model turn over the per-episode loop. Goal: at most 1.1x the direct loop's
CPU at 10k turns, checked against the per-episode loop (the same pytest
items on both sides). The plugin's side also pays the turn journal (each
turn's request digested and written as it arrives), the batching of
concurrent episodes' turns (threads), and the run dir with its transcripts.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson
from scale_harness import BARE, Compared, Measure, expect_in, run_pytest, verdict

GOAL = 1.1

LOOP = '''
"""The agent, its tool and an instant provider, shared by both sides."""
import orjson
from pytest_evalreplay import Generation
from pytest_evalreplay.agent import tool_message

TURNS = {turns}
EPISODES = {episodes}
STEP = {{"type": "function", "function": {{"name": "step", "parameters": {{"type": "object"}}}}}}


def step(n):
    return n + 1


class Instant:
    kind, model, batch_size = "instant-chat", "instant-chat-v1", None

    def generate(self, requests):
        return [[self.turn(r.context)] for r in requests]

    @staticmethod
    def turn(messages):
        done = sum(m["role"] == "tool" for m in messages)
        if done + 1 >= TURNS:
            return Generation(f"done after {{done}} steps", finish_reason="stop",
                              prompt_tokens=1, completion_tokens=1)
        call = {{"id": f"c{{done}}", "type": "function",
                "function": {{"name": "step", "arguments": orjson.dumps({{"n": done}}).decode()}}}}
        return Generation("", finish_reason="tool_calls", prompt_tokens=1, completion_tokens=1,
                          tool_calls=(call,))


def solve(instance, llm):
    messages = [{{"role": "user", "content": f"Take the steps for {{instance['id']}}."}}]
    while True:
        turn = llm.chat(messages, tools=[STEP])
        messages.append(turn.message)
        if not turn.tool_calls:
            return turn.text
        for call in turn.tool_calls:
            messages.append(tool_message(call, llm.tool(call, step)))


INSTANCES = [{{"id": f"e{{i}}"}} for i in range(EPISODES)]
'''

PLUGIN_SIDE = """
from agent_loop import INSTANCES, TURNS, solve
from pytest_evalreplay import EvalTask

steps = EvalTask("steps", INSTANCES, agent=solve, scorer=lambda text, i: 1.0, max_turns=TURNS)
"""

PLUGIN_CONFTEST = """
from agent_loop import Instant

def pytest_evalreplay_make_provider(config, kind):
    return Instant() if kind == "instant-chat" else None
"""

DIRECT_LOOP = '''
"""The direct sides' episodes: the provider called directly, and the floor."""
import atexit
import collections
import os
import time

import orjson
from agent_loop import Instant, solve
from pytest_evalreplay import Request
from pytest_evalreplay.agent import Turn, parse_call
from pytest_evalreplay.model import digest

PROVIDER = Instant()
SPENT = collections.Counter()  # CPU inside the episodes, by LLM class, for the benchmark to read
atexit.register(lambda: open("episodes-cpu.json", "wb").write(orjson.dumps(SPENT)))


class DirectLLM:
    """The provider called directly: one request per turn, the tool run as is."""

    def __init__(self, provider, instance_id):
        self.provider, self.instance_id = provider, instance_id

    def chat(self, messages, tools=None, **sampling):
        request = Request(task="steps", instance_id=self.instance_id, context=list(messages),
                          sampling=sampling, tools=tuple(tools or ()))
        return Turn.of(self.provider.generate([request])[0][0])

    def tool(self, call, fn):
        return fn(**parse_call(call)[1])


class FloorLLM(DirectLLM):
    """The direct loop, each model turn and tool result a line as it exists."""

    journal = None

    def __init__(self, provider, instance_id):
        super().__init__(provider, instance_id)
        self.turns, self.sent, self.after = 0, 0, None
        if FloorLLM.journal is None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
            FloorLLM.journal = os.open("floor-journal.jsonl", flags, 0o644)

    def chat(self, messages, tools=None, **sampling):
        rq = digest({"context": messages, "tools": tools or [], "sampling": sampling})
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

    def end(self, answer):
        row = {"instance_id": self.instance_id, "answer": answer, "turns": self.turns}
        os.write(self.journal, orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))


def episode(instance, llm_class=DirectLLM):
    start = time.thread_time()
    llm = llm_class(PROVIDER, instance["id"])
    answer = solve(instance, llm)
    if isinstance(llm, FloorLLM):
        llm.end(answer)
    SPENT[llm_class.__name__] += time.thread_time() - start
    return answer
'''

ONE_TEST_SIDE = """
from agent_loop import INSTANCES
from direct_loop import episode


def test_direct():
    assert len([episode(instance) for instance in INSTANCES]) == len(INSTANCES)
"""

PER_EPISODE_SIDE = """
import pytest
from agent_loop import INSTANCES
from direct_loop import DirectLLM, FloorLLM, episode


@pytest.mark.parametrize("instance", INSTANCES, ids=[i["id"] for i in INSTANCES])
def test_episode(instance):
    assert isinstance(episode(instance, DirectLLM), str)
"""

# Each episode twice, with and without the floor's work, in turn first: the
# difference is measured in one process, under the same load.
FLOOR_SIDE = PER_EPISODE_SIDE.replace(
    "    assert isinstance(episode(instance, DirectLLM), str)",
    "    both = (DirectLLM, FloorLLM) if int(instance['id'][1:]) % 2 else (FloorLLM, DirectLLM)\n"
    "    assert all(isinstance(episode(instance, llm), str) for llm in both)",
)

SIDES = ("plugin", "per-episode", "one-test", "floor")  # the floor side runs each episode twice


def projects(tmp: Path, episodes: int, turns: int) -> dict[str, Path]:
    loop = LOOP.format(turns=turns, episodes=episodes)
    files = {
        "plugin": {"conftest.py": PLUGIN_CONFTEST, "test_agent.py": PLUGIN_SIDE},
        "per-episode": {"test_direct.py": PER_EPISODE_SIDE},
        "one-test": {"test_direct.py": ONE_TEST_SIDE},
        "floor": {"test_direct.py": FLOOR_SIDE},
    }
    roots = {}
    for side, texts in files.items():
        root = roots[side] = tmp / side
        root.mkdir(parents=True)
        (root / "agent_loop.py").write_text(loop)
        (root / "direct_loop.py").write_text(DIRECT_LOOP)
        (root / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
        for name, text in texts.items():
            (root / name).write_text(text)
    return roots


def measure(
    tmp: Path, episodes: int, turns: int, runs: int, concurrency: int | None
) -> tuple[dict[str, list[Measure]], list[float]]:
    """Each side's runs, and the floor's own CPU (the floor side's episodes
    with the floor's work, less the same episodes without it) in each round."""
    roots = projects(tmp, episodes, turns)
    plugin_args = ["--evalreplay-provider=instant-chat"]
    if concurrency is not None:
        plugin_args.append(f"--evalreplay-concurrency={concurrency}")
    out: dict[str, list[Measure]] = {side: [] for side in SIDES}
    floors: list[float] = []
    for n in range(runs + 1):  # the first round warms the bytecode and file caches, and is dropped
        for side in SIDES[n % len(SIDES) :] + SIDES[: n % len(SIDES)]:  # each side takes each place in turn
            if side == "plugin":
                m = run_pytest(roots[side], [*plugin_args, f"--evalreplay-output={tmp}/out{n}"])
                expect_in(m, f"steps: {episodes:,} instances, {episodes:,} items, 0 failed")
            else:
                m = run_pytest(roots[side], BARE)
                if n and side == "floor":
                    spent = orjson.loads((roots[side] / "episodes-cpu.json").read_bytes())
                    floors.append(spent["FloorLLM"] - spent["DirectLLM"])
            if n:
                out[side].append(m)
    return out, floors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1_000)
    parser.add_argument("--turns", type=int, default=10, help="model turns per episode")
    parser.add_argument("--runs", type=int, default=1, help="rounds (each runs every side once)")
    parser.add_argument("--concurrency", type=int, help="--evalreplay-concurrency (default: the plugin's)")
    args = parser.parse_args(argv)
    total = args.episodes * args.turns
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="evalreplay-bench-") as name:
        sides, floors = measure(Path(name), args.episodes, args.turns, args.runs, args.concurrency)
    print(
        f"{args.episodes:,} episodes x {args.turns} turns = {total:,} model turns, median of {args.runs} "
        "round(s): agent task vs the same loop calling the provider directly"
    )
    for baseline in ("per-episode", "one-test"):
        c = Compared(sides["plugin"], sides[baseline])
        print(f" vs the direct loop, {baseline}:")
        print(c.line("cpu", "CPU time", "s", "plugin", baseline))
        print(c.line("wall", "wall time", "s", "plugin", baseline))
        print(c.line("maxrss_mib", "peak RSS", "MiB", "plugin", baseline))
    per_episode = Compared(sides["plugin"], sides["per-episode"])
    per_turn = (per_episode.median("a", "cpu") - per_episode.median("b", "cpu")) / total * 1000
    print(f"  per turn : the plugin's marginal CPU over the per-episode loop {per_turn:.3f} ms")
    floor, budget = statistics.median(floors), (GOAL - 1) * per_episode.median("b", "cpu")
    print(
        f"  floor    : each turn digested and written as it exists costs the loop {floor:.3f} s of CPU "
        f"({floor / total * 1e6:.1f} us a turn; rounds {min(floors):.3f}-{max(floors):.3f} s), "
        f"{floor / budget:.0%} of the {budget:.2f} s the goal allows over the per-episode loop"
    )
    ok = per_episode.ratio("cpu") <= GOAL
    print(f"  goal     : CPU <= {GOAL}x the per-episode direct loop -> {verdict(ok)}")
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
