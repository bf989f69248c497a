"""The plugin's cost per item and its peak memory: an eval task of N items
(instant provider, a scorer that returns 0 or 1) against bare pytest running N
parametrized no-op tests (`-p no:evalreplay`), side by side, in child processes.

    python benchmarks/item_overhead.py            # 20,000 and 100,000 items, 1 pair each
    python benchmarks/item_overhead.py --quick    # 2,000 and 10,000 items, 1 pair each
    python benchmarks/item_overhead.py --items 20000 --runs 3   # steadier medians
    python benchmarks/item_overhead.py --slope 10000,40000,70000  # is the cost per item flat?
    python benchmarks/item_overhead.py --choices 4 --items 10000  # multiple choice

Reported per size: the median CPU time (user + system of the pytest process),
wall time and peak RSS (ru_maxrss) of each side and their ratios, and the
plugin's marginal CPU per item. Goals (issues #22, #34): peak RSS within 1.25x
of bare pytest's and CPU within 1.10x, at every size.

--slope A,B,C also measures those sizes and compares the plugin's CPU per item
over bare pytest's from A to B with that from B to C (goal: flat, the second
within 1.2x of the first, or within 10 us of it, below what one pair resolves).
--choices K makes the task multiple choice (K choices per question, scored by
an instant log-likelihood provider, acc and acc_norm) against the same N
no-op tests. Each row also prints a RESULT line (benchmarks/results.py).

The floor, beside them in each pair: the same N bare tests plus the least a
harness that keeps a crash to the item in flight must do per item: its
request (prompt, and for multiple choice its K continuations) fingerprinted
(orjson with sorted keys, sha256), its answer a journal line written with one
os.write(2), and at the session's end the run dir's rows (requests and
predictions, one orjson line each). Printed as each row's `floor` (its
ratios to bare): where the floor is under the goal, the floor is not what
misses it.
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
    CONFTEST,
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
SLOPE_GOAL = 1.2  # the later slope over the earlier one
SLOPE_NOISE_US = 10.0  # a difference of slopes one pair per size does not resolve

_LOGLIKELIHOOD = """

class Choices(Instant):
    \"\"\"Scores every continuation at once: the shorter, the likelier.\"\"\"

    def loglikelihood(self, requests):
        return [[(-float(len(c)), i == 0) for i, c in enumerate(r.continuations)] for r in requests]


def pytest_evalreplay_make_provider(config, kind):
    return Choices() if kind == "instant" else None
"""

_MC = """
from pytest_evalreplay import EvalTask, scorers

CHOICES = [f"answer {{c}}" for c in range({choices})]
mc = EvalTask(
    "mc",
    [{{"id": f"q{{i}}", "q": f"Question {{i}}?", "gold": i % {choices}}} for i in range({items})],
    prompt="{{q}}",
    choices=lambda instance: CHOICES,
    target="gold",
    scorer=scorers.multiple_choice(),
)
"""


_FLOOR = """
import hashlib
import os

import orjson
import pytest

CHOICES = [f"answer {{c}}" for c in range({choices})]
JOURNAL = os.open(os.environ["BENCH_FLOOR_JOURNAL"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
DONE = []
ANSWER = [{{"text": "ok", "finish_reason": "stop"}}]


@pytest.mark.parametrize("i", range({n}))
def test_floor(i):
    request = {{"task": "task0", "instance_id": f"q{{i}}", "prompt": f"Question q{{i}}", "max_tokens": 256}}
    if CHOICES:
        request["continuations"] = CHOICES
    digest = hashlib.sha256(orjson.dumps(request, option=orjson.OPT_SORT_KEYS)).hexdigest()
    score = float(i % 2)
    row = {{"t": "gen", "key": ["task0", f"q{{i}}", 0], "rq": digest, "text": "ok"}}
    os.write(JOURNAL, orjson.dumps(row) + b"\\n")
    DONE.append((request, digest, score))


def write_rundir():
    out = os.environ["BENCH_FLOOR_JOURNAL"] + ".rundir"
    with open(out + "-requests.jsonl", "wb") as f:
        f.writelines(orjson.dumps({{"digest": d, **r}}) + b"\\n" for r, d, _ in DONE)
    with open(out + "-predictions.jsonl", "wb") as f:
        f.writelines(
            orjson.dumps({{"instance_id": r["instance_id"], "generations": ANSWER, "scores": {{"score": s}}}})
            + b"\\n"
            for r, _, s in DONE
        )
"""


def floor_project(root: Path, items: int, choices: int) -> Path:
    """The bare tests plus the floor's work per item (see the module's docstring)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "conftest.py").write_text(
        "import sys\n\n\ndef pytest_sessionfinish(session):\n    sys.modules['test_floor'].write_rundir()\n"
    )
    (root / "test_floor.py").write_text(_FLOOR.format(n=items, choices=choices))
    return root


def mc_project(root: Path, items: int, choices: int) -> Path:
    """One multiple-choice task of `items` questions, `choices` choices each."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "conftest.py").write_text(CONFTEST + _LOGLIKELIHOOD)
    (root / "test_evals.py").write_text(_MC.format(items=items, choices=choices))
    return root


def compare(tmp: Path, items: int, runs: int, choices: int = 0) -> tuple[Compared, Compared]:
    """The plugin against bare pytest, and the floor against the same bare
    runs, in pairs whose order rotates so that load drifts hit every side alike."""
    if choices:
        project = mc_project(tmp / f"mc-{items}", items, choices)
    else:
        project = eval_project(tmp / f"eval-{items}", items)
    bare = bare_project(tmp / f"bare-{items}", items)
    least = floor_project(tmp / f"floor-{items}", items, choices)
    out = tmp / f"out-{items}"
    sides: dict[str, list[Measure]] = {"plugin": [], "bare": [], "floor": []}
    order = list(sides)
    for n in range(runs):
        for side in order[n % len(order) :] + order[: n % len(order)]:
            if side == "plugin":
                m = run_pytest(project, eval_args(out))
                expect_in(m, f"{items:,} generated, 0 reused")
            elif side == "bare":
                m = run_pytest(bare, BARE)
            else:
                m = run_pytest(
                    least, BARE, env={"BENCH_FLOOR_JOURNAL": str(tmp / f"floor-{items}-{n}.jsonl")}
                )
                expect_in(m, f"{items} passed")
            sides[side].append(m)
    return Compared(sides["plugin"], sides["bare"]), Compared(sides["floor"], sides["bare"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 and 10,000 items")
    parser.add_argument("--items", type=lambda s: [int(x) for x in s.split(",")], default=None)
    parser.add_argument("--runs", type=int, default=1, help="pairs per size")
    parser.add_argument(
        "--slope",
        type=lambda s: [int(x) for x in s.split(",")],
        default=None,
        help="A,B,C: compare the CPU per item over bare from A to B with B to C",
    )
    parser.add_argument("--choices", type=int, default=0, help="multiple choice, K choices per question")
    args = parser.parse_args(argv)
    if args.slope is not None and (len(args.slope) != 3 or not args.slope[0] < args.slope[1] < args.slope[2]):
        parser.error("--slope takes three increasing sizes, e.g. 10000,40000,70000")
    sizes = args.items or ([2_000, 10_000] if args.quick else [20_000, 100_000])
    sizes = sorted({*sizes, *(args.slope or [])})
    kind = f"multiple choice ({args.choices} choices)" if args.choices else "eval"
    prefix = "mc" if args.choices else "items"
    started = time.perf_counter()
    missed = False
    over: dict[int, float] = {}  # the plugin's CPU over bare's, by size
    with tempfile.TemporaryDirectory(prefix="evalreplay-bench-") as name:
        tmp = Path(name)
        warm_up(tmp)
        for items in sizes:
            c, fl = compare(tmp, items, args.runs, args.choices)
            over[items] = c.median("a", "cpu") - c.median("b", "cpu")
            print(
                f"{items:,} {kind} items, median of {args.runs} run(s) each: "
                "plugin vs bare pytest -p no:evalreplay"
            )
            print(c.line("cpu", "CPU time", "s", "plugin", "bare"))
            print(c.line("wall", "wall time", "s", "plugin", "bare"))
            print(c.line("maxrss_mib", "peak RSS", "MiB", "plugin", "bare"))
            per_item = (c.median("a", "cpu") - c.median("b", "cpu")) / items * 1000
            extra = (c.median("a", "maxrss_mib") - c.median("b", "maxrss_mib")) * 1024 / items
            print(fl.line("cpu", "floor CPU", "s", "floor ", "bare"))
            print(fl.line("maxrss_mib", "floor RSS", "MiB", "floor ", "bare"))
            print(f"  per item : plugin's marginal CPU {per_item:.3f} ms, peak RSS {extra:.2f} KiB over bare")
            ok = c.ratio("maxrss_mib") <= RSS_GOAL
            fast = c.ratio("cpu") <= CPU_GOAL
            missed |= not (ok and fast)
            print(f"  goal     : peak RSS <= {RSS_GOAL}x bare -> {verdict(ok)}")
            print(f"  goal     : CPU <= {CPU_GOAL}x bare -> {verdict(fast)}")
            under = fl.ratio("cpu") <= CPU_GOAL and fl.ratio("maxrss_mib") <= RSS_GOAL
            print(
                f"  floor    : {fl.ratio('cpu'):.2f}x / {fl.ratio('maxrss_mib'):.2f}x bare: "
                + ("under the goal, so not what misses it" if under else "above a goal: the work's own cost")
            )
            report(
                f"{prefix}-{label(items)}",
                f"{c.median('b', 'cpu'):.2f} s / {c.median('b', 'maxrss_mib'):.0f} MiB",
                f"{c.median('a', 'cpu'):.2f} s / {c.median('a', 'maxrss_mib'):.0f} MiB",
                f"{c.ratio('cpu'):.2f}x / {c.ratio('maxrss_mib'):.2f}x",
                f"{CPU_GOAL}x / {RSS_GOAL}x",
                ok and fast,
                floor=f"{fl.ratio('cpu'):.2f}x / {fl.ratio('maxrss_mib'):.2f}x of bare",
            )
    if args.slope:
        missed |= not slope_row(prefix, args.slope, over)
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    return 1 if missed else 0


def slope_row(prefix: str, sizes: list[int], over: dict[int, float]) -> bool:
    """Print the plugin's CPU per item over bare pytest's from A to B and from
    B to C, and its RESULT line; whether it is flat."""
    a, b, c = sizes
    first = (over[b] - over[a]) / (b - a) * 1e6
    second = (over[c] - over[b]) / (c - b) * 1e6
    flat = second <= SLOPE_GOAL * first or second - first <= SLOPE_NOISE_US
    ratio = f"{second / first:.2f}x" if first > 0 else "n/a"
    span = f"{label(a)}->{label(b)} vs {label(b)}->{label(c)}"
    print(f"CPU per item over bare, {span}: {first:.0f} us vs {second:.0f} us ({ratio})")
    print(
        f"  goal     : flat (within {SLOPE_GOAL}x or {SLOPE_NOISE_US:g} us of each other) -> {verdict(flat)}"
    )
    report(
        f"{prefix}-slope",
        f"{first:.0f} us ({label(a)}->{label(b)})",
        f"{second:.0f} us ({label(b)}->{label(c)})",
        ratio,
        f"flat: <= {SLOPE_GOAL}x or +{SLOPE_NOISE_US:g} us",
        flat,
    )
    return flat


if __name__ == "__main__":
    sys.exit(main())
