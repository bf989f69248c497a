"""What pytest-xdist buys an eval suite whose scoring costs CPU: `-n 2`
against a serial run of the same suite, side by side, with a scorer that
busy-waits 2 ms of CPU per item (an instant provider: scoring is the work).
Two shapes: one task of N items, and four tasks of N/4. For context, bare
pytest's own `-n 2` speed-up on N parametrized tests that each busy-wait
2 ms, on the same machine in the same rounds.

    python benchmarks/xdist_speedup.py            # 4,000 items, 1 round
    python benchmarks/xdist_speedup.py --quick    # 1,000 items, 1 round

Speed-up = serial wall time / `-n 2` wall time (medians). Goal: at least
1.6x for both shapes. Also shown: the CPU time of all processes, and the
ceiling it implies on two cores (serial CPU / half the `-n 2` CPU: the
speed-up with both cores busy all the time and nothing else running). xdist's
own per-item work (reports shipped to and logged by the controller) is part
of the `-n 2` CPU, so bare pytest's figures say what any plugin can reach here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_harness import (
    BARE,
    Measure,
    bare_project,
    eval_args,
    eval_project,
    expect_in,
    run_pytest,
    verdict,
    warm_up,
)

GOAL = 1.6
BUSY_MS = 2.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 items, 1 round")
    parser.add_argument("--items", type=int, default=None)
    parser.add_argument("--runs", type=int, default=1, help="rounds (each runs every shape serial and -n 2)")
    args = parser.parse_args(argv)
    items = args.items or (1_000 if args.quick else 4_000)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="evalreplay-bench-") as name:
        tmp = Path(name)
        warm_up(tmp, xdist=True)
        shapes = {
            "one task": eval_project(tmp / "one", items, tasks=1, busy_ms=BUSY_MS),
            "four tasks": eval_project(tmp / "four", items, tasks=4, busy_ms=BUSY_MS),
            "bare pytest": bare_project(tmp / "bare", items, busy_ms=BUSY_MS),
        }
        results: dict[tuple[str, str], list[Measure]] = {}
        for n in range(args.runs):
            modes = ("serial", "-n 2") if n % 2 == 0 else ("-n 2", "serial")
            for shape, project in shapes.items():
                for mode in modes:
                    more = ["-n", "2"] if mode == "-n 2" else []
                    if shape == "bare pytest":
                        m = run_pytest(project, [*BARE, *more])
                    else:
                        m = run_pytest(project, [*eval_args(tmp / f"out-{n}-{mode[-1]}-{shape[0]}"), *more])
                        expect_in(m, f"{items // (4 if shape == 'four tasks' else 1):,} generated, 0 reused")
                    results.setdefault((shape, mode), []).append(m)
    print(
        f"{items:,} items, scorer (or test) busy {BUSY_MS:g} ms of CPU each, median of {args.runs} round(s)"
    )
    ok_all = True
    speedups: dict[str, float] = {}
    for shape in shapes:
        serial, parallel = results[(shape, "serial")], results[(shape, "-n 2")]
        s_wall = statistics.median(m.wall for m in serial)
        p_wall = statistics.median(m.wall for m in parallel)
        s_cpu = statistics.median(m.cpu for m in serial)
        p_cpu = statistics.median(m.cpu for m in parallel)
        speedups[shape] = speedup = s_wall / p_wall
        print(
            f"  {shape:<11}: wall serial {s_wall:6.2f} s, -n 2 {p_wall:6.2f} s -> speed-up {speedup:.2f}x; "
            f"CPU serial {s_cpu:6.2f} s, -n 2 {p_cpu:6.2f} s -> 2-core ceiling {2 * s_cpu / p_cpu:.2f}x"
        )
    bare = speedups.pop("bare pytest")
    for shape, speedup in speedups.items():
        ok = speedup >= GOAL
        ok_all &= ok
        print(
            f"  goal     : {shape} -n 2 >= {GOAL}x serial -> {verdict(ok)} ({speedup:.2f}x; "
            f"bare pytest's own -n 2 speed-up here {bare:.2f}x)"
        )
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
