"""The harness's cost per model turn of an agent task: the same agent loop
(`solve(instance, llm)`, a tool call per turn, an instant provider and an
instant tool) run as an agent task by the plugin, against the same loop
calling the provider directly, side by side, each in a child pytest process.
The direct loop runs two ways (both `-p no:evalreplay`): one parametrized
test per episode, so both sides pay pytest's item per episode (an agent
task keeps one item per episode), and all episodes in one plain test.

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
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

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

DIRECT_LLM = """
from agent_loop import INSTANCES, Instant, solve
from pytest_evalreplay import Request
from pytest_evalreplay.agent import Turn, parse_call


class DirectLLM:
    '''The provider called directly: one request per turn, the tool run as is.'''

    def __init__(self, provider, instance_id):
        self.provider, self.instance_id = provider, instance_id

    def chat(self, messages, tools=None, **sampling):
        request = Request(task="steps", instance_id=self.instance_id, context=list(messages),
                          sampling=sampling, tools=tuple(tools or ()))
        return Turn.of(self.provider.generate([request])[0][0])

    def tool(self, call, fn):
        return fn(**parse_call(call)[1])
"""

ONE_TEST_SIDE = (
    DIRECT_LLM
    + """

def test_direct():
    provider = Instant()
    answers = [solve(instance, DirectLLM(provider, instance["id"])) for instance in INSTANCES]
    assert len(answers) == len(INSTANCES)
"""
)

PER_EPISODE_SIDE = (
    "import pytest\n"
    + DIRECT_LLM
    + """
PROVIDER = Instant()


@pytest.mark.parametrize("instance", INSTANCES, ids=[i["id"] for i in INSTANCES])
def test_episode(instance):
    assert isinstance(solve(instance, DirectLLM(PROVIDER, instance["id"])), str)
"""
)

SIDES = ("plugin", "per-episode", "one-test")


def projects(tmp: Path, episodes: int, turns: int) -> dict[str, Path]:
    loop = LOOP.format(turns=turns, episodes=episodes)
    files = {
        "plugin": {"conftest.py": PLUGIN_CONFTEST, "test_agent.py": PLUGIN_SIDE},
        "per-episode": {"test_direct.py": PER_EPISODE_SIDE},
        "one-test": {"test_direct.py": ONE_TEST_SIDE},
    }
    roots = {}
    for side, texts in files.items():
        root = roots[side] = tmp / side
        root.mkdir(parents=True)
        (root / "agent_loop.py").write_text(loop)
        (root / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
        for name, text in texts.items():
            (root / name).write_text(text)
    return roots


def measure(
    tmp: Path, episodes: int, turns: int, runs: int, concurrency: int | None
) -> dict[str, list[Measure]]:
    roots = projects(tmp, episodes, turns)
    plugin_args = ["--evalreplay-provider=instant-chat"]
    if concurrency is not None:
        plugin_args.append(f"--evalreplay-concurrency={concurrency}")
    out: dict[str, list[Measure]] = {side: [] for side in SIDES}
    for n in range(runs + 1):  # the first round warms the bytecode and file caches, and is dropped
        for side in SIDES[n % 3 :] + SIDES[: n % 3]:  # each side takes each place in turn
            if side == "plugin":
                m = run_pytest(roots[side], [*plugin_args, f"--evalreplay-output={tmp}/out{n}"])
                expect_in(m, f"steps: {episodes:,} instances, {episodes:,} items, 0 failed")
            else:
                m = run_pytest(roots[side], BARE)
            if n:
                out[side].append(m)
    return out


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
        sides = measure(Path(name), args.episodes, args.turns, args.runs, args.concurrency)
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
    ok = per_episode.ratio("cpu") <= GOAL
    print(f"  goal     : CPU <= {GOAL}x the per-episode direct loop -> {verdict(ok)}")
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
