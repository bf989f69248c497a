"""A fully resumed run, and a replay of saved generations, against the fresh
run they start from: an eval task of N items (instant provider, a scorer that
returns 0 or 1) run fresh, then again with `--resume` over the same output dir,
where every item is reused from the journal (deselected, rescored, the run dir
rewritten), then replayed with `--evalreplay-predictions=` that run dir into a
new output dir (every item answered by the saved run at collection, then
handled as a resumed one), side by side.

    python benchmarks/resume_speed.py            # 20,000 items, 2 rounds
    python benchmarks/resume_speed.py --quick    # 5,000 items, 1 round

Each round is a fresh run (which starts the journal afresh), its resumed run
and its replay. Goals: the resumed run, and the replay, each in at most 0.5x
the time of the fresh run (CPU time, which the load of a shared machine
disturbs less; wall time shown too); the replay beside the resumed run, for
what the saved run's load and the journal it writes cost on top. With --bare,
bare pytest on N parametrized no-op tests runs alongside for scale.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import label, report
from scale_harness import (
    BARE,
    Compared,
    Measure,
    bare_project,
    eval_args,
    eval_project,
    expect_in,
    run_pytest,
    verdict,
    warm_up,
)

GOAL = 0.5


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5,000 items, 1 pair")
    parser.add_argument("--items", type=int, default=None)
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--bare", action="store_true", help="run bare pytest alongside, for scale")
    args = parser.parse_args(argv)
    items = args.items or (5_000 if args.quick else 20_000)
    runs = args.runs or (1 if args.quick else 2)
    started = time.perf_counter()
    fresh: list[Measure] = []
    resumed: list[Measure] = []
    replayed: list[Measure] = []
    bare: list[Measure] = []
    with tempfile.TemporaryDirectory(prefix="evalreplay-bench-") as name:
        tmp = Path(name)
        warm_up(tmp)
        project = eval_project(tmp / "eval", items)
        bare_dir = bare_project(tmp / "bare", items)
        out = tmp / "out"
        for n in range(runs):
            if args.bare and n % 2 == 1:
                bare.append(run_pytest(bare_dir, BARE))
            m = run_pytest(project, eval_args(out))
            expect_in(m, f"{items:,} generated, 0 reused")
            fresh.append(m)
            m = run_pytest(project, [*eval_args(out), "--resume"])
            expect_in(m, f"0 generated, {items:,} reused")
            expect_in(m, f"{items} deselected")
            resumed.append(m)
            m = run_pytest(project, ["--evalreplay-predictions", str(out), f"--evalreplay-output={out}-{n}"])
            expect_in(m, f"{items:,} replayed, 0 reused")
            expect_in(m, f"{items} deselected")
            replayed.append(m)
            if args.bare and n % 2 == 0:
                bare.append(run_pytest(bare_dir, BARE))
    c = Compared(resumed, fresh)
    print(f"{items:,} items, median of {runs} pair(s): --resume with every item reused vs the fresh run")
    print(c.line("cpu", "CPU time", "s", "resumed", "fresh"))
    print(c.line("wall", "wall time", "s", "resumed", "fresh"))
    print(c.line("maxrss_mib", "peak RSS", "MiB", "resumed", "fresh"))
    if bare:
        b = Compared(resumed[: len(bare)], bare)
        print(
            f"  for scale: bare pytest, {items:,} no-op tests: CPU {b.median('b', 'cpu'):.2f} s, "
            f"wall {b.median('b', 'wall'):.2f} s (resumed run {b.ratio('cpu'):.2f}x of it in CPU; "
            f"fresh run {c.median('b', 'cpu') / b.median('b', 'cpu'):.2f}x)"
        )
    ok = c.ratio("cpu") <= GOAL
    print(
        f"  goal     : resumed <= {GOAL}x the fresh run (CPU) -> {verdict(ok)}; wall {c.ratio('wall'):.3f}x"
    )
    r = Compared(replayed, fresh)
    print(f"{items:,} items, median of {runs} pair(s): --evalreplay-predictions of that run vs the fresh run")
    print(r.line("cpu", "CPU time", "s", "replayed", "fresh"))
    print(r.line("wall", "wall time", "s", "replayed", "fresh"))
    print(r.line("maxrss_mib", "peak RSS", "MiB", "replayed", "fresh"))
    vs = Compared(replayed, resumed)
    print(vs.line("cpu", "CPU time", "s", "replayed", "resumed"))
    replay_ok = r.ratio("cpu") <= GOAL
    print(
        f"  goal     : replayed <= {GOAL}x the fresh run (CPU) -> {verdict(replay_ok)}; "
        f"wall {r.ratio('wall'):.3f}x"
    )
    ok = ok and replay_ok
    report(
        f"replay-{label(items)}",
        f"{r.median('b', 'cpu'):.2f} s",
        f"{r.median('a', 'cpu'):.2f} s",
        f"{r.ratio('cpu'):.3f}x",
        f"{GOAL}x",
        replay_ok,
    )
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
