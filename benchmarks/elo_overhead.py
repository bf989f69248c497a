"""The cost of an EloEval beyond its judge calls: a multi-stage ELO eval of
1,000 items and 6,000 judgments (an instant candidate, references' answers
saved on disk, a judge function that compares strings) against bare pytest
running 1,000 parametrized tests that make the same 6,000 judge calls on the
same answers (read from the same files at import), side by side, in child
processes.

    python benchmarks/elo_overhead.py            # 1,000 items, 6,000 judgments, 3 pairs
    python benchmarks/elo_overhead.py --quick    # 200 items, 1,200 judgments, 1 pair
    python benchmarks/elo_overhead.py --samples 2   # 500 tasks x 2 rollouts

Goal: the EloEval's CPU within 1.3x of bare pytest's. Reported: median CPU
time (user + system of the pytest process), wall time and peak RSS of each
side, their ratios and the pairs' range.

The floor, a third side in the same rounds: bare pytest making the same calls
plus the least an ELO eval that keeps a crash to the item in flight must do,
as item_overhead.py's floor is for a task: each item's request fingerprinted
(orjson with sorted keys, sha256), its answer and then its judgments a journal
line each (one os.write(2) apiece), and at the session's end the run dir's
requests and predictions rows (one orjson line each) and the fits an EloEval
reports: after each stage the Bradley-Terry fit of the judgments so far with
its Fisher error (what the next stage picks references by and the stage table
shows), and the final fit with its 1,000-resample task bootstrap, all with
numpy and scipy.special (the project's fit, `numbers/elo/fit.py`, imported as
the EloEval imports it). Printed as the RESULT line's `floor` (its CPU over
bare's). Before 2026-12-07 the floor was bare plus the fits alone.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import report
from scale_harness import BARE, CONFTEST, Compared, Measure, expect_in, run_pytest, verdict

GOAL = 1.3
REFERENCES = 6  # each item is judged against every reference: judgments = 6 x items
STAGES = 4

_JUDGE = """
def judge(instance, candidate, reference):
    mine, theirs = candidate == instance["gold"], reference == instance["gold"]
    return 0.5 if mine == theirs else float(mine)
"""

_EVAL = (
    """
from pytest_evalreplay import EloEval, EvalTask, Reference, Stage
"""
    + _JUDGE
    + """
FILES = [f"ref{{r}}-predictions.jsonl" for r in range({refs})]
pool = EvalTask("pool", "pool.jsonl", prompt="Q: {{q}}", num_samples={samples})
elo = EloEval(
    name="elo",
    pool=pool,
    references={{f"ref{{r}}": Reference(800 + 100 * r, path) for r, path in enumerate(FILES)}},
    stages=[Stage(tasks={per_stage}) for _ in range({stages})],
    judge=judge,
    seed=1,
)
"""
)

_BARE = (
    """
import orjson
import pytest
"""
    + _JUDGE
    + """
POOL = [orjson.loads(line) for line in open("pool.jsonl", "rb")]
ROWS = [map(orjson.loads, open(f"ref{{r}}-predictions.jsonl", "rb")) for r in range({refs})]
ANSWERS = [{{row["instance_id"]: row["generations"][0]["text"] for row in rows}} for rows in ROWS]


@pytest.mark.parametrize("n", range({items}))
def test_judged(n):
    instance = POOL[n // {samples}]
    for answers in ANSWERS:
        judge(instance, "ok", answers[instance["id"]])
"""
)


# The floor: the bare test, its request fingerprinted, its answer and its
# judgments a journal line each as they exist, each judgment (task, reference,
# score, stage) kept; the session's end writes the run dir's rows and fits the
# judgments stage by stage as an EloEval does.
_FLOOR_TEST = (
    """
import hashlib
import os

import orjson
import pytest
"""
    + _JUDGE
    + """
POOL = [orjson.loads(line) for line in open("pool.jsonl", "rb")]
ROWS = [map(orjson.loads, open(f"ref{{r}}-predictions.jsonl", "rb")) for r in range({refs})]
ANSWERS = [
    (f"ref{{r}}", {{row["instance_id"]: row["generations"][0]["text"] for row in rows}})
    for r, rows in enumerate(ROWS)
]
JOURNAL = os.open("floor-journal.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
JUDGED = []
DONE = []


@pytest.mark.parametrize("n", range({items}))
def test_judged(n):
    instance = POOL[n // {samples}]
    stage = 1 + n // {per_stage_items}
    request = {{"instance_id": instance["id"], "context": "Q: " + instance["q"], "sampling": {{}}}}
    digest = hashlib.sha256(orjson.dumps(request, option=orjson.OPT_SORT_KEYS)).hexdigest()
    key = [stage, instance["id"], n % {samples}]
    os.write(JOURNAL, orjson.dumps({{"type": "gen", "key": key, "request": digest, "text": "ok"}}) + b"\\n")
    verdicts = {{}}
    for name, answers in ANSWERS:
        verdicts[name] = judge(instance, "ok", answers[instance["id"]])
        JUDGED.append((instance["id"], name, verdicts[name], stage))
    os.write(JOURNAL, orjson.dumps({{"type": "score", "key": key, "judgments": verdicts}}) + b"\\n")
    DONE.append((request, verdicts))


def write_rundir():
    with open("floor-requests.jsonl", "wb") as f:
        f.writelines(orjson.dumps(request, option=orjson.OPT_APPEND_NEWLINE) for request, _ in DONE)
    with open("floor-predictions.jsonl", "wb") as f:
        f.writelines(
            orjson.dumps(
                {{"instance_id": r["instance_id"], "generations": [{{"text": "ok"}}], "scores": v}},
                option=orjson.OPT_APPEND_NEWLINE,
            )
            for r, v in DONE
        )
"""
)

_FLOOR_CONFTEST = """
def pytest_sessionfinish(session):
    from test_bare import JUDGED, write_rundir

    from pytest_evalreplay.numbers.elo.fit import cumulative_fits, fit_elo
    from pytest_evalreplay.numbers.elo.table import tabulate

    references = {{f"ref{{r}}": 800.0 + 100 * r for r in range({refs})}}
    cumulative_fits(JUDGED, references, num_stages={stages}, n_boot=0, seed=1)
    fit_elo(tabulate(JUDGED, references), n_boot=1000, seed=1)
    write_rundir()
"""


def write_data(root: Path, items: int) -> None:
    """The pool (one task per item) and each reference's saved answers."""
    root.mkdir(parents=True, exist_ok=True)
    pool = [{"id": f"t{n:05d}", "q": f"question {n}", "gold": "ok" if n % 3 else "no"} for n in range(items)]
    (root / "pool.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in pool))
    for r in range(REFERENCES):
        rows = (
            {
                "instance_id": row["id"],
                "model": f"ref{r}",
                "generations": [{"text": "ok" if (n + r) % 4 else "no", "finish_reason": "stop"}],
            }
            for n, row in enumerate(pool)
        )
        (root / f"ref{r}-predictions.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
        requests = (
            {
                "instance_id": row["id"],
                "request_type": "generate",
                "context": f"Q: {row['q']}",
                "system_prompt": None,
                "num_samples": 1,
                "sampling": {},
            }
            for row in pool
        )
        (root / f"ref{r}-requests.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in requests))


def projects(tmp: Path, items: int, samples: int = 1) -> tuple[Path, Path, Path]:
    elo, bare, floor = tmp / f"elo-{items}", tmp / f"bare-{items}", tmp / f"floor-{items}"
    for root in (elo, bare, floor):
        write_data(root, items // samples)
    (elo / "conftest.py").write_text(CONFTEST)
    per_stage = items // samples // STAGES
    (elo / "test_elo.py").write_text(
        _EVAL.format(refs=REFERENCES, per_stage=per_stage, stages=STAGES, samples=samples)
    )
    (bare / "test_bare.py").write_text(_BARE.format(refs=REFERENCES, items=items, samples=samples))
    (floor / "test_bare.py").write_text(
        _FLOOR_TEST.format(refs=REFERENCES, items=items, samples=samples, per_stage_items=items // STAGES)
    )
    (floor / "conftest.py").write_text(_FLOOR_CONFTEST.format(refs=REFERENCES, stages=STAGES))
    return elo, bare, floor


def compare(tmp: Path, items: int, runs: int, samples: int) -> tuple[Compared, Compared]:
    """(EloEval vs bare, floor vs bare): the three sides in turn, each round in
    another order, so load drifts hit all alike."""
    elo, bare, floor = projects(tmp, items, samples)
    args = ["--evalreplay-provider=instant"]
    run_pytest(elo, [*args, f"--evalreplay-output={tmp / 'warm'}"])  # warm the caches
    run_pytest(bare, BARE)
    run_pytest(floor, BARE)
    sides: dict[str, list[Measure]] = {"plugin": [], "bare": [], "floor": []}
    orders = [("plugin", "bare", "floor"), ("bare", "floor", "plugin"), ("floor", "plugin", "bare")]
    for n in range(runs):
        for side in orders[n % len(orders)]:
            if side == "plugin":
                m = run_pytest(elo, [*args, f"--evalreplay-output={tmp / f'out-{n}'}"])
            else:
                m = run_pytest(bare if side == "bare" else floor, BARE)
            expect_in(m, f"{items} passed")
            sides[side].append(m)
    return Compared(sides["plugin"], sides["bare"]), Compared(sides["floor"], sides["bare"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--items", type=int, default=None, help="items (a multiple of 4 x --samples; default 1,000)"
    )
    parser.add_argument("--runs", type=int, default=None, help="pairs (default 3, --quick 1)")
    parser.add_argument(
        "--samples", type=int, default=1, help="rollouts per pool task (items = tasks x samples)"
    )
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    items = args.items or (200 if args.quick else 1000)
    runs = args.runs or (1 if args.quick else 3)
    if items % (args.samples * STAGES):
        parser.error(f"--items must be a multiple of {STAGES} x --samples")
    with tempfile.TemporaryDirectory() as tmp:
        result, floor = compare(Path(tmp), items, runs, args.samples)
    print(
        f"EloEval, {items:,} items ({args.samples} per task), {REFERENCES * items:,} judgments, "
        f"vs bare pytest: median of {runs} pairs"
    )
    print(result.line("cpu", "CPU", "s", "elo", "bare"))
    print(result.line("wall", "wall", "s", "elo", "bare"))
    print(result.line("maxrss_mib", "peak RSS", "MiB", "elo", "bare"))
    print(floor.line("cpu", "floor CPU", "s", "floor", "bare"))
    print(
        "  floor    : bare + each item's request digest and two journal lines, the run dir's rows, "
        "each stage's fit and the final bootstrap (numpy, scipy.special); "
        f"EloEval over floor {result.median('a', 'cpu') / floor.median('a', 'cpu'):.3f}x"
    )
    ok = result.ratio("cpu") <= GOAL
    print(f"  goal: CPU <= {GOAL}x -> {verdict(ok)}")
    report(
        "elo",
        f"{result.median('b', 'cpu'):.2f} s",
        f"{result.median('a', 'cpu'):.2f} s",
        f"{result.ratio('cpu'):.2f}x",
        f"{GOAL}x",
        ok,
        items=items,
        judgments=REFERENCES * items,
        floor=(
            f"{floor.ratio('cpu'):.2f}x ({floor.median('a', 'cpu'):.2f} s: bare + a digest and two journal "
            "lines an item, the run dir rows, the fits with numpy and scipy)"
        ),
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
