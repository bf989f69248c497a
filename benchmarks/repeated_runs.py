"""Repeated plain runs on one output dir (issue #30, case 13): the Nth run
without `--resume` must cost what the first does, and leave the journals
the size the first left. Two suites, each in child pytest processes: the
agent overhead suite (benchmarks/agent_overhead.py's agent task: episodes of
model turns and tool calls, so a task journal and a turns journal) and a
plain task of N items (the instant provider of scale_harness.py).

    python benchmarks/repeated_runs.py            # 1,000 episodes x 10 turns; 20,000 items; 10 runs each
    python benchmarks/repeated_runs.py --quick    # 100 episodes x 10 turns; 2,000 items
    python benchmarks/repeated_runs.py --runs 5   # the fifth over the first

Each suite runs `--runs` times on one output dir. The last `--pairs` (3) of
them are each paired with a first run (a fresh output dir) just before or
after it, in turn, so load drifts hit both alike. Reported per suite: the
first's and the last's CPU time, peak RSS and journal bytes (every
`*journal.jsonl` of the output dir), and the ratios last / first: CPU and
RSS as the median over the pairs of each repeated run against the first run
paired with it, the journals as the last run's bytes over the first's.
Goal: each ratio at most 1.1x.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_overhead import projects
from scale_harness import Measure, eval_args, eval_project, expect_in, run_pytest, verdict, warm_up

GOAL = 1.1


def journal_bytes(output: Path) -> int:
    return sum(p.stat().st_size for p in output.glob("*journal.jsonl"))


@dataclass(frozen=True)
class Repeated:
    """One suite's runs on one output dir: the first, the last, the journals
    each left, and the later runs each paired with a first run (repeat, fresh)."""

    first: Measure
    last: Measure
    first_bytes: int
    last_bytes: int
    pairs: list[tuple[Measure, Measure]]


def repeated(
    project: Path,
    args_for: Callable[[Path], list[str]],
    expect: str,
    tmp: Path,
    runs: int,
    pairs: int,
    env: dict[str, str] | None = None,
) -> Repeated:
    """`runs` plain runs of `project` on one output dir; the last `pairs` of
    them each beside a first run (a fresh output dir), in turn first."""
    out = tmp / f"{project.name}-repeated"

    def run(output: Path) -> Measure:
        m = run_pytest(project, args_for(output), env=env)
        expect_in(m, expect)
        return m

    first = last = run(out)
    first_bytes = journal_bytes(out)
    paired: list[tuple[Measure, Measure]] = []
    for n in range(2, runs + 1):
        if n <= runs - pairs:
            last = run(out)
        elif n % 2:
            last = run(out)
            paired.append((last, run(tmp / f"{project.name}-fresh-{n}")))
        else:
            fresh = run(tmp / f"{project.name}-fresh-{n}")
            last = run(out)
            paired.append((last, fresh))
    return Repeated(first, last, first_bytes, journal_bytes(out), paired)


def report(name: str, runs: int, got: Repeated) -> bool:
    ratios = {
        field: [getattr(a, field) / getattr(b, field) for a, b in got.pairs]
        for field in ("cpu", "maxrss_mib")
    }
    cpu, rss = (statistics.median(ratios[f]) for f in ("cpu", "maxrss_mib"))
    size = got.last_bytes / max(1, got.first_bytes)
    spread = f"{min(ratios['cpu']):.2f}-{max(ratios['cpu']):.2f}"
    print(f"{name}: {runs} plain runs on one output dir, run {runs} vs the first")
    print(
        f"  CPU time : first {got.first.cpu:7.2f} s, run {runs} {got.last.cpu:7.2f} s -> {cpu:.3f}x "
        f"(median of the last {len(got.pairs)} runs, each over a first run beside it: {spread})"
    )
    print(
        f"  peak RSS : first {got.first.maxrss_mib:7.1f} MiB, run {runs} {got.last.maxrss_mib:7.1f} MiB "
        f"-> {rss:.3f}x"
    )
    print(
        f"  journals : first {got.first_bytes / 2**20:7.2f} MiB, "
        f"run {runs} {got.last_bytes / 2**20:7.2f} MiB -> {size:.3f}x"
    )
    ok = max(cpu, rss, size) <= GOAL
    print(f"  goal     : each <= {GOAL}x -> {verdict(ok)}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 episodes, 2,000 items")
    parser.add_argument("--runs", type=int, default=10, help="plain runs on one output dir (at least 2)")
    parser.add_argument("--pairs", type=int, default=3, help="last runs each paired with a first run")
    parser.add_argument("--episodes", type=int, default=None)
    parser.add_argument("--items", type=int, default=None)
    args = parser.parse_args(argv)
    runs = max(2, args.runs)
    pairs = min(max(1, args.pairs), runs - 1)
    episodes = args.episodes or (100 if args.quick else 1_000)
    items = args.items or (2_000 if args.quick else 20_000)
    started = time.perf_counter()
    ok = True
    with tempfile.TemporaryDirectory(prefix="evalreplay-bench-") as name:
        tmp = Path(name)
        warm_up(tmp)
        agent = projects(tmp / "agent")["llm.chat"]
        got = repeated(
            agent,
            lambda out: ["--evalreplay-provider=instant-chat", f"--evalreplay-output={out}"],
            f"steps: {episodes:,} instances, {episodes:,} items, 0 failed | {episodes:,} generated",
            tmp,
            runs,
            pairs,
            env={"BENCH_EPISODES": str(episodes), "BENCH_TURNS": "10"},
        )
        ok &= report(f"agent task, {episodes:,} episodes x 10 turns", runs, got)
        task = eval_project(tmp / "task", items)
        got = repeated(task, eval_args, f"{items:,} generated, 0 reused", tmp, runs, pairs)
        ok &= report(f"plain task, {items:,} items", runs, got)
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
