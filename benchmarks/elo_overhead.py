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


def projects(tmp: Path, items: int, samples: int = 1) -> tuple[Path, Path]:
    elo, bare = tmp / f"elo-{items}", tmp / f"bare-{items}"
    for root in (elo, bare):
        write_data(root, items // samples)
    (elo / "conftest.py").write_text(CONFTEST)
    per_stage = items // samples // STAGES
    (elo / "test_elo.py").write_text(
        _EVAL.format(refs=REFERENCES, per_stage=per_stage, stages=STAGES, samples=samples)
    )
    (bare / "test_bare.py").write_text(_BARE.format(refs=REFERENCES, items=items, samples=samples))
    return elo, bare


def compare(tmp: Path, items: int, runs: int, samples: int) -> Compared:
    elo, bare = projects(tmp, items, samples)
    args = ["--evalreplay-provider=instant"]
    run_pytest(elo, [*args, f"--evalreplay-output={tmp / 'warm'}"])  # warm the caches
    run_pytest(bare, BARE)
    plugin: list[Measure] = []
    baseline: list[Measure] = []
    for n in range(runs):  # alternate which goes first, so load drifts hit both alike
        for side in ("plugin", "bare") if n % 2 == 0 else ("bare", "plugin"):
            if side == "plugin":
                m = run_pytest(elo, [*args, f"--evalreplay-output={tmp / f'out-{n}'}"])
                expect_in(m, f"{items} passed")
                plugin.append(m)
            else:
                m = run_pytest(bare, BARE)
                expect_in(m, f"{items} passed")
                baseline.append(m)
    return Compared(plugin, baseline)


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
        result = compare(Path(tmp), items, runs, args.samples)
    print(
        f"EloEval, {items:,} items ({args.samples} per task), {REFERENCES * items:,} judgments, "
        f"vs bare pytest: median of {runs} pairs"
    )
    print(result.line("cpu", "CPU", "s", "elo", "bare"))
    print(result.line("wall", "wall", "s", "elo", "bare"))
    print(result.line("maxrss_mib", "peak RSS", "MiB", "elo", "bare"))
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
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
