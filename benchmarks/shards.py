"""Shards on one machine against one process, and the merge's own cost.

1. One eval task of N items whose scorer spends 20 ms of CPU per item (an
   instant provider: scoring is the work), run as one pytest process, then as
   4 shards (`--evalreplay-shard=K/4`, 4 processes at once, each its own output
   dir) followed by the merge, which writes the run dir by running the suite
   over the merged journal (keeping the shards' scores; `merge --rescore`
   would score every item again). Wall times side by side;
   speed-up = one process / (slowest shard + merge).
   On a machine with C free cores the shards' ceiling is min(4, C).
2. The merge's journal step at 100,000 rollouts: 4 synthetic shard dirs of
   25,000 rollouts each (a request, a gen and a score row per rollout), read,
   merged and written (`merge.merge`, `sharddir`), in-process.
3. `--merge-only`: the whole merge at 100,000 rollouts, its finishing run
   included, as a merge job runs it (`python -m pytest_evalreplay merge OUT
   SHARD_DIR... -- ARGS`, from the project dir). The 4
   shards and the single-process run it is compared with are real pytest
   runs of one task of 100,000 items with a free scorer (a 20 ms one would
   take 2,000 s per run); the run the goal speaks of is that single process
   plus its scorer's CPU (100,000 x 20 ms), and the merge's share is also
   shown against the free-scorer run alone (its worst case: a run that
   costs nothing but pytest's and the plugin's own work).

Goal for 2 and 3: the merge under 5% of the run it merges.

    python benchmarks/shards.py                # 400 items; the journal step at 100,000
    python benchmarks/shards.py --quick        # 120 items; the journal step at 20,000
    python benchmarks/shards.py --merge-only   # the whole merge at 100,000 (--rollouts N)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import report
from scale_harness import (
    PYTEST,
    Compared,
    Measure,
    child_env,
    eval_args,
    eval_project,
    expect_in,
    run_child,
    run_pytest,
    verdict,
    warm_up,
)

from pytest_evalreplay.journal import rows as journal
from pytest_evalreplay.model import Generation, digest
from pytest_evalreplay.numbers.planning import TaskPlan
from pytest_evalreplay.rundir.sharddir import claim, merge_into, task_config
from pytest_evalreplay.values.shard import Shard, shard_of

SHARDS = 4
BUSY_MS = 20.0
MERGE_GOAL = 0.05
READ_SHARDS = 3
CPU_GOAL, RSS_GOAL = 5.0, 3.0  # part 4: the merge against a read of its journals
MERGE_SUITE = ["-p", "no:cacheprovider", "-p", "no:randomly"]  # what the synthetic shards ran


def run_shards(project: Path, out: Path) -> float:
    """The 4 shards at once; the wall time until the last is done."""
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [*PYTEST, *eval_args(out / f"shard-{k}"), f"--evalreplay-shard={k}/{SHARDS}"],
            cwd=project,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            env=child_env(),
        )
        for k in range(1, SHARDS + 1)
    ]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a shard exited {codes}")
    return time.perf_counter() - start


def merge(project: Path, out: Path, dirs: list[Path]) -> tuple[float, float]:
    """`python -m pytest_evalreplay merge`, run dir included, from the project
    dir with the shards' suite arguments after -- (it keeps the shards'
    scores). Its wall time and CPU time (user + system)."""
    suite = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    cmd = [sys.executable, "-m", "pytest_evalreplay", "merge", str(out), *map(str, dirs), "--", *suite]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=project, env=child_env(), capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"the merge exited {proc.returncode}: {proc.stdout}{proc.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def merge_journals(out: Path, dirs: list[Path]) -> float:
    """The merge's journal step alone: read, merge, write."""
    start = time.perf_counter()
    merge_into(out, dirs)
    return time.perf_counter() - start


def synthetic_shards(root: Path, rollouts: int, shards: int = SHARDS) -> list[Path]:
    """Shard dirs as `shards` shards of one task of `rollouts` items would
    leave them: journals of the plugin's own rows, markers written by the
    plugin's own `claim` (so the merge writes the run dir from them alone)."""
    provider = {"kind": "instant", "model": "instant-1"}
    pv = digest(provider)
    rows: dict[int, list[dict]] = {k: [journal.provider_row(pv, provider)] for k in range(1, shards + 1)}
    requests = {}
    for i in range(rollouts):
        key = (1, f"q{i}", 0)
        k = shard_of("t", key, shards)
        request = {
            "request_type": "generate",
            "context": f"Question q{i}",
            "system_prompt": None,
            "sampling": {},
        }
        rq = requests[(1, f"q{i}")] = digest(request)
        gen = Generation(text=f"answer q{i}", finish_reason="stop", prompt_tokens=3, completion_tokens=2)
        rows[k].append(journal.request_row(rq, request))
        rows[k].append(journal.gen_row(key, rq, pv, f"run{k}", gen))
        rows[k].append(journal.score_row(key, f"run{k}", f"run{k}", {"score": float(i % 2)}, None))
    plan = TaskPlan("t", tuple((1, f"q{i}", 0) for i in range(rollouts)), requests, pv)
    spec = {"order": [[f"q{i}", requests[(1, f"q{i}")]] for i in range(rollouts)], "num_samples": 1}
    config = task_config(plan, provider, (), {**spec, "strip_reasoning": False, "pass": []})
    suite = {"args": MERGE_SUITE, "start": ".", "config": None}
    dirs = []
    for k, body in rows.items():
        d = root / f"shard-{k}"
        d.mkdir(parents=True)
        (d / "t-journal.jsonl").write_bytes(journal.encode([journal.header_row("t", f"run{k}"), *body]))
        claim(d, Shard(k, shards), {"t": config}, suite, 3)
        dirs.append(d)
    return dirs


READ = """
import sys, orjson
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        for line in f:
            orjson.loads(line)
"""


# The floor: the least a merge that writes this run dir must do, in one process
# (argv: OUT, then each shard dir). Read every shard's marker (the instance order
# and each instance's request; the shards' must agree) and decode every journal
# row once with orjson; copy the rows (less headers) to the merged journal as
# they are read, keeping of each only where it landed; then write the requests
# and predictions rows, in instance order, from those lines read back by position
# (mapped, not read whole),
# and the metrics' mean. No checks, no dedup, no refusals: less than the merge
# owes, never more.
FLOOR = """
import mmap, os, sys, orjson
from pathlib import Path
out, dirs = Path(sys.argv[1]), [Path(d) for d in sys.argv[2:]]
out.mkdir()
config = orjson.loads((dirs[0] / "evalreplay-shard.json").read_bytes())["tasks"]["t"]
for d in dirs[1:]:
    assert orjson.loads((d / "evalreplay-shard.json").read_bytes())["tasks"]["t"] == config
order, n = config["rundir"]["order"], config["rundir"]["num_samples"]
at, where, loads = {"request": {}, "gen": {}, "score": {}}, 0, orjson.loads
with open(out / "t-journal.jsonl", "wb") as merged:
    merged.write(orjson.dumps({"type": "header", "task": "t", "run": "merged"}) + b"\\n")
    for d in dirs:
        for line in open(d / "t-journal.jsonl", "rb"):
            row = loads(line)
            kind = row["type"]
            if kind == "header":
                continue
            where = merged.tell()
            merged.write(line)
            if kind == "request":
                at[kind][row["digest"]] = where
            elif kind in at:
                at[kind][row["instance_id"]] = where
data = mmap.mmap(os.open(out / "t-journal.jsonl", os.O_RDONLY), 0, prot=mmap.PROT_READ)
def row(kind, key):
    start = at[kind][key]
    return loads(data[start : data.find(b"\\n", start)])
total, dumps, nl = 0.0, orjson.dumps, orjson.OPT_APPEND_NEWLINE
with open(out / "t-requests.jsonl", "wb") as requests, open(out / "t-predictions.jsonl", "wb") as predictions:
    for iid, rq in order:
        request = row("request", rq)["request"]
        requests.write(dumps({"instance_id": iid, **request, "num_samples": n}, option=nl))
        scores = row("score", iid)["scores"]
        total += scores["score"]
        gen = row("gen", iid)["generation"]
        predictions.write(dumps({"instance_id": iid, "generations": [gen], "scores": [scores]}, option=nl))
(out / "t-metrics.json").write_bytes(dumps({"metrics": {"score": total / len(order)}}))
"""


def clean_rss(tmp: Path, argv: list[str]) -> Measure:
    """`run_child`, with the child's own peak RSS as GNU time reports it: a
    child forked from this process (which built the shards) starts with this
    process's resident set, and wait4 reports that."""
    if shutil.which("/usr/bin/time") is None:
        raise SystemExit("--merge-vs-read needs GNU time at /usr/bin/time (apt-get install time)")
    measure = run_child(tmp, ["/usr/bin/time", "-f", "evalreplay-maxrss-kib=%M", *argv])
    kib = int(measure.output.rsplit("evalreplay-maxrss-kib=", 1)[1].split()[0])
    return dataclasses.replace(measure, maxrss_mib=kib / 1024)


def merge_vs_read(tmp: Path, rollouts: int, pairs: int) -> None:
    """Part 4: the merge command of 3 shards (a request, a gen and a score row
    per rollout) against a process that only reads their journals with orjson,
    line by line; CPU and peak RSS of each child, interleaved pairs."""
    dirs = synthetic_shards(tmp / "vs", rollouts, READ_SHARDS)
    journals = [str(d / "t-journal.jsonl") for d in dirs]
    rows = sum(len(Path(j).read_bytes().splitlines()) - 1 for j in journals)
    merges, reads, floors = [], [], []
    for n in range(pairs):
        out = tmp / f"vs-merged-{n}"
        cmd = [
            sys.executable,
            "-m",
            "pytest_evalreplay",
            "merge",
            str(out),
            *map(str, dirs),
            "--",
            *MERGE_SUITE,
        ]
        merges.append(clean_rss(tmp, cmd))
        expect_in(merges[-1], "wrote the run dir from the merged journals")
        reads.append(clean_rss(tmp, [sys.executable, "-c", READ, *journals]))
        floors.append(clean_rss(tmp, [sys.executable, "-c", FLOOR, str(tmp / f"floor-{n}"), *map(str, dirs)]))
    both, floor = Compared(merges, reads), Compared(floors, reads)
    print(f"merge of {READ_SHARDS} shards ({rows:,} journal rows) vs reading the journals with orjson")
    print(both.line("cpu", "CPU", "s", "merge", "read"))
    print(both.line("maxrss_mib", "peak RSS", "MiB", "merge", "read"))
    print("  floor: the markers read, each row decoded once and copied, the run dir's rows written")
    print(floor.line("cpu", "CPU", "s", "floor", "read"))
    print(floor.line("maxrss_mib", "peak RSS", "MiB", "floor", "read"))
    cpu, rss = both.ratio("cpu"), both.ratio("maxrss_mib")
    floor_cpu, floor_rss = floor.ratio("cpu"), floor.ratio("maxrss_mib")
    print(f"  goal <= {CPU_GOAL:g}x CPU: {verdict(cpu <= CPU_GOAL)} (the floor: {floor_cpu:.1f}x)")
    print(f"  goal <= {RSS_GOAL:g}x peak RSS: {verdict(rss <= RSS_GOAL)} (the floor: {floor_rss:.1f}x)")
    within = [
        name
        for name, got, goal in (("CPU", floor_cpu, CPU_GOAL), ("RSS", floor_rss, RSS_GOAL))
        if got <= goal
    ]
    report(
        f"merge-{READ_SHARDS}-shards",
        f"{both.median('b', 'cpu'):.2f} s / {both.median('b', 'maxrss_mib'):.1f} MiB",
        f"{both.median('a', 'cpu'):.2f} s / {both.median('a', 'maxrss_mib'):.1f} MiB",
        f"{cpu:.1f}x / {rss:.1f}x",
        f"{CPU_GOAL:g}x / {RSS_GOAL:g}x",
        cpu <= CPU_GOAL and rss <= RSS_GOAL,
        rows=rows,
        floor=(
            f"{floor.median('a', 'cpu'):.2f} s / {floor.median('a', 'maxrss_mib'):.1f} MiB = "
            f"{floor_cpu:.1f}x / {floor_rss:.1f}x (markers read, rows decoded once, run dir rows written; "
            f"within the goal: {', '.join(within) or 'neither'})"
        ),
    )


def merge_only(tmp: Path, rollouts: int) -> None:
    """Part 3: the whole merge at `rollouts` against the single-process run."""
    project = eval_project(tmp / "big-project", rollouts)
    one = run_pytest(project, eval_args(tmp / "big-single"))
    expect_in(one, f"{rollouts:,} generated")
    dirs = [tmp / f"big-shard-{k}" for k in range(1, SHARDS + 1)]
    for k, out in enumerate(dirs, 1):  # one after another: their time is not what is measured here
        run_pytest(project, [*eval_args(out), f"--evalreplay-shard={k}/{SHARDS}"])
    step = merge_journals(tmp / "big-step", dirs)
    merged = tmp / "big-merged"
    whole, whole_cpu = merge(project, merged, dirs)
    metrics = orjson.loads((merged / "task0-metrics.json").read_bytes())
    if metrics["num_items"] != rollouts or not metrics["complete"]:
        raise SystemExit(f"the merged run dir does not hold every item: {metrics}")
    scorer = rollouts * BUSY_MS / 1000
    run, run_cpu = one.wall + scorer, one.cpu + scorer
    print(f"the whole merge at {rollouts:,} rollouts, {SHARDS} shards, as a merge job runs it")
    print(f"  single process, free scorer : {one.wall:7.2f} s wall, {one.cpu:7.2f} s CPU")
    print(
        f"  merge                       : {whole:7.2f} s wall, {whole_cpu:7.2f} s CPU "
        f"(journal step: {step:.2f} s)"
    )
    print(
        f"  share of the free-scorer run: {whole / one.wall:.1%} wall, "
        f"{whole_cpu / one.cpu:.1%} CPU (worst case)"
    )
    print(
        f"  share of the run with a {BUSY_MS:g} ms scorer ({run:,.0f} s): {whole / run:.2%} wall, "
        f"{whole_cpu / run_cpu:.2%} CPU (goal < {MERGE_GOAL:.0%}: {verdict(whole / run < MERGE_GOAL)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--merge-only", action="store_true", help="part 3 alone: the whole merge at scale")
    parser.add_argument("--rollouts", type=int, default=100_000, help="rollouts of --merge-only")
    parser.add_argument(
        "--merge-vs-read", action="store_true", help="part 4 alone: the merge against a read of its journals"
    )
    parser.add_argument("--vs-rollouts", type=int, default=60_000, help="rollouts of --merge-vs-read")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved pairs of --merge-vs-read")
    args = parser.parse_args()
    if args.merge_vs_read:
        with tempfile.TemporaryDirectory() as tmpdir:
            merge_vs_read(Path(tmpdir), args.vs_rollouts, args.pairs)
        return
    if args.merge_only:
        with tempfile.TemporaryDirectory() as tmpdir:
            warm_up(Path(tmpdir))
            merge_only(Path(tmpdir), args.rollouts)
        return
    items = 120 if args.quick else 400
    big = 20_000 if args.quick else 100_000
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        warm_up(tmp)
        project = eval_project(tmp / "project", items, busy_ms=BUSY_MS)
        one = run_pytest(project, eval_args(tmp / "single"))
        expect_in(one, f"{items} passed")
        sharded = run_shards(project, tmp)
        merged = tmp / "merged"
        merge_s, _ = merge(project, merged, [tmp / f"shard-{k}" for k in range(1, SHARDS + 1)])
        if sum(orjson.loads(f.read_bytes())["num_items"] for f in merged.glob("*-metrics.json")) != items:
            raise SystemExit("the merged run dir does not hold every item")
        total = sharded + merge_s
        cores = os.cpu_count()
        print(f"{items} items, a scorer of {BUSY_MS:g} ms CPU each, {cores} cores (shared)")
        print(f"  one process      : {one.wall:7.2f} s wall, {one.cpu:7.2f} s CPU")
        print(f"  {SHARDS} shards at once: {sharded:7.2f} s wall (until the last is done)")
        print(f"  merge            : {merge_s:7.2f} s (journals and run dir, reusing scores)")
        print(
            f"  speed-up         : {one.wall / sharded:.2f}x the shards, {one.wall / total:.2f}x end to end"
        )

        dirs = synthetic_shards(tmp / "big", big)
        size = sum((d / "t-journal.jsonl").stat().st_size for d in dirs)
        big_merge = merge_journals(tmp / "big-merged", dirs)
        run_estimate = big * BUSY_MS / 1000  # its scorer alone, a lower bound of the run
        share = big_merge / run_estimate
        print(f"merge of {big:,} rollouts, {SHARDS} shards ({size / 2**20:.1f} MiB): {big_merge:.2f} s")
        print(
            f"  the run it merges (its scorer's CPU alone, a lower bound): {run_estimate:,.0f} s -> "
            f"{share:.3%} of it (goal < {MERGE_GOAL:.0%}: {verdict(share < MERGE_GOAL)})"
        )


if __name__ == "__main__":
    main()
