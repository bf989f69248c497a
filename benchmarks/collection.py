"""Collecting a large eval suite: `pytest --collect-only -q` of an eval task
of N items (instant provider) against bare pytest's `--collect-only -q` of N
parametrized no-op tests (`-p no:evalreplay`), side by side, in child processes.

    python benchmarks/collection.py            # 100,000 items, 2 pairs
    python benchmarks/collection.py --quick    # 20,000 items, 1 pair

Goal: the plugin's collection within 1.25x of bare pytest's (CPU time of the
pytest process, which the load of a shared machine disturbs less; wall time
and peak RSS shown too).
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

GOAL = 1.25


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 items, 1 pair")
    parser.add_argument("--items", type=int, default=None)
    parser.add_argument("--runs", type=int, default=None)
    args = parser.parse_args(argv)
    items = args.items or (20_000 if args.quick else 100_000)
    runs = args.runs or (1 if args.quick else 2)
    started = time.perf_counter()
    plugin: list[Measure] = []
    bare: list[Measure] = []
    with tempfile.TemporaryDirectory(prefix="evalreplay-bench-") as name:
        tmp = Path(name)
        warm_up(tmp)
        project = eval_project(tmp / "eval", items)
        bare_dir = bare_project(tmp / "bare", items)
        for n in range(runs):
            for side in ("plugin", "bare") if n % 2 == 0 else ("bare", "plugin"):
                if side == "plugin":
                    m = run_pytest(project, [*eval_args(tmp / "out"), "--collect-only"])
                    expect_in(m, f"{items} tests collected")
                    plugin.append(m)
                else:
                    m = run_pytest(bare_dir, [*BARE, "--collect-only"])
                    expect_in(m, f"{items} tests collected")
                    bare.append(m)
    c = Compared(plugin, bare)
    print(f"{items:,} items, --collect-only -q, median of {runs} run(s) each: plugin vs bare pytest")
    print(c.line("cpu", "CPU time", "s", "plugin", "bare"))
    print(c.line("wall", "wall time", "s", "plugin", "bare"))
    print(c.line("maxrss_mib", "peak RSS", "MiB", "plugin", "bare"))
    ok = c.ratio("cpu") <= GOAL
    print(f"  goal     : plugin <= {GOAL}x bare (CPU) -> {verdict(ok)}; wall {c.ratio('wall'):.3f}x")
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
