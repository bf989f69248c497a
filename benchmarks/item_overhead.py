"""The plugin's cost per item and its peak memory: an eval task of N items
(instant provider, a scorer that returns 0 or 1) against bare pytest running N
parametrized no-op tests (`-p no:evalreplay`), side by side, in child processes.

    python benchmarks/item_overhead.py            # 20,000 and 100,000 items, 1 pair each
    python benchmarks/item_overhead.py --quick    # 2,000 and 10,000 items, 1 pair each
    python benchmarks/item_overhead.py --items 20000 --runs 3   # steadier medians

Reported per size: the median CPU time (user + system of the pytest process),
wall time and peak RSS (ru_maxrss) of each side and their ratios, and the
plugin's marginal CPU per item. Goals (issue #22): peak RSS within 1.25x of
bare pytest's and CPU within 1.10x, at 20,000 and 100,000 items.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

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

RSS_GOAL = 1.25
CPU_GOAL = 1.10


def compare(tmp: Path, items: int, runs: int) -> Compared:
    project = eval_project(tmp / f"eval-{items}", items)
    bare = bare_project(tmp / f"bare-{items}", items)
    out = tmp / f"out-{items}"
    plugin: list[Measure] = []
    baseline: list[Measure] = []
    for n in range(runs):  # alternate which goes first, so load drifts hit both alike
        for side in ("plugin", "bare") if n % 2 == 0 else ("bare", "plugin"):
            if side == "plugin":
                m = run_pytest(project, eval_args(out))
                expect_in(m, f"{items:,} generated, 0 reused")
                plugin.append(m)
            else:
                baseline.append(run_pytest(bare, BARE))
    return Compared(plugin, baseline)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 and 10,000 items")
    parser.add_argument("--items", type=lambda s: [int(x) for x in s.split(",")], default=None)
    parser.add_argument("--runs", type=int, default=1, help="pairs per size")
    args = parser.parse_args(argv)
    sizes = args.items or ([2_000, 10_000] if args.quick else [20_000, 100_000])
    started = time.perf_counter()
    missed = False
    with tempfile.TemporaryDirectory(prefix="evalreplay-bench-") as name:
        tmp = Path(name)
        warm_up(tmp)
        for items in sizes:
            c = compare(tmp, items, args.runs)
            print(
                f"{items:,} items, median of {args.runs} run(s) each: plugin vs bare pytest -p no:evalreplay"
            )
            print(c.line("cpu", "CPU time", "s", "plugin", "bare"))
            print(c.line("wall", "wall time", "s", "plugin", "bare"))
            print(c.line("maxrss_mib", "peak RSS", "MiB", "plugin", "bare"))
            per_item = (c.median("a", "cpu") - c.median("b", "cpu")) / items * 1000
            extra = (c.median("a", "maxrss_mib") - c.median("b", "maxrss_mib")) * 1024 / items
            print(f"  per item : plugin's marginal CPU {per_item:.3f} ms, peak RSS {extra:.2f} KiB over bare")
            ok = c.ratio("maxrss_mib") <= RSS_GOAL
            fast = c.ratio("cpu") <= CPU_GOAL
            missed |= not (ok and fast)
            print(f"  goal     : peak RSS <= {RSS_GOAL}x bare -> {verdict(ok)}")
            print(f"  goal     : CPU <= {CPU_GOAL}x bare -> {verdict(fast)}")
            sys.stdout.flush()
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
