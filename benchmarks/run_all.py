"""Every row of issue #34's table, each side by side with its baseline, in one
run of under 10 minutes, and one table of met / missed at the end.

    python benchmarks/run_all.py                 # the rows' sizes (reduced where said below)
    python benchmarks/run_all.py --quick         # small sizes: checks that every script runs
    python benchmarks/run_all.py --only startup.py,elo_overhead.py

Each script prints, besides its own report, one `RESULT {json}` line per row
it measures (the convention is in benchmarks/results.py); this script runs
them one after the other, echoes their output, and gathers those lines. A
script that is missing, or lacks the option a row needs, gives "not measured
(script lacks X)" for its rows; a script that prints no RESULT line for a row
gives "not measured" with the verdict lines it did print; a script that
passes its time share is stopped (SIGINT, so it cleans up) and keeps the rows
it printed before.

Sizes, to fit 10 minutes on a 2-core shared machine (one pair or round per
row unless said; run a script alone with more --runs for steadier medians):

- items 2k / 20k / 100k: as the rows, one pair each.
- CPU per item flat: the issue's 10k->40k vs 40k->70k is measured as
  2k->20k vs 20k->100k, from the three rows' own pairs (no more pairs:
  three more sizes would double the script's time). The slope is the extra
  CPU per item over bare between two sizes, so the fixed costs cancel and
  the spans need not be equal.
- startup: 9 runs each (its noise is larger than its 5% goal).
- replay load: 1M rows as the row, 1 repeat (the script's default is 5;
  writing the 358 MB run dir and the memory runs are most of its time).
- elo: 1,000 items / 6,000 judgments, 3 pairs (each pair costs seconds).
- loss bound: loss_bound.py --quick --no-throughput (1 kill at 200 of 400 on
  each side, no throughput pairs: they are not a row of the issue; the
  script's default, 3 kills at 1,000 of 2,000, takes minutes).
- merge, replay, multiple choice over a server: as their scripts' options
  run them (the helpers that add those sides choose their sizes).

The rows' keys by script: resume_speed.py (its replay side): replay-20k;
shards.py --merge-vs-read: merge-3-shards; mc_server_prompts.py:
mc-openai-prompts; loss_bound.py --quick --no-throughput: kill-reasked (its 1
kill at 200 of 400; the issue's 1,000 of 2,000, median of 3 kills, is the
script's default and takes minutes more).

Time shares: each script is guaranteed its budget_s seconds (less the
grace a stopped one has to clean up); time one leaves unused goes to those
after it. Not run here (they measure other things and
run alone): collection.py, xdist_speedup.py, agent_overhead.py, elo_fit.py,
lm_eval_overhead.py, repeated_runs.py, html_report.py, vllm_overhead.py.
Exits 0 when every row is measured and met and the whole run took under 10 minutes.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from results import parse  # noqa: E402

GOAL_S = 600.0
GRACE_S = 15.0  # after SIGINT, before SIGKILL


@dataclass(frozen=True)
class Row:
    """One row of the issue's table: its RESULT key, its name, its goal."""

    key: str
    what: str
    goal: str


@dataclass(frozen=True)
class Step:
    """One script run: the rows it measures, with the options they need."""

    script: str
    args: tuple[str, ...]
    quick_args: tuple[str, ...]
    rows: tuple[Row, ...]
    budget_s: float  # the share of the 10 minutes this script is sure of
    needs: tuple[str, ...] = ()  # options it must offer (another helper's side)
    quick_rows: tuple[Row, ...] | None = None  # where --quick measures other sizes


def _items(*sizes: str) -> tuple[Row, ...]:
    return tuple(Row(f"items-{s}", f"{s} items CPU / peak RSS vs bare pytest", "1.1x / 1.25x") for s in sizes)


def _slope(span: str) -> Row:
    return Row("items-slope", f"CPU per item over bare, {span}", "flat (1.2x)")


_MC = "multiple choice, {} x 4 choices, CPU / peak RSS vs bare"

STEPS: tuple[Step, ...] = (
    Step(
        "startup.py",
        ("--runs", "9"),
        ("--runs", "3"),
        (Row("startup", "startup, one-test project vs -p no:evalreplay", "1.05x"),),
        budget_s=45,
    ),
    Step(
        "item_overhead.py",
        ("--choices", "4", "--items", "10000"),
        ("--choices", "4", "--items", "1000"),
        (Row("mc-10k", _MC.format("10k"), "1.1x / 1.25x"),),
        budget_s=60,
        needs=("--choices",),
        quick_rows=(Row("mc-1k", _MC.format("1k"), "1.1x / 1.25x"),),
    ),
    Step(
        "elo_overhead.py",
        ("--runs", "3"),
        ("--quick",),
        (Row("elo", "EloEval 1k items / 6k judgments vs bare pytest", "1.3x"),),
        budget_s=30,
    ),
    Step(
        "replay_load.py",
        ("--repeats", "1"),
        ("--rows", "100000", "--repeats", "1"),
        (Row("replay-load", "replay load, 1M rows, vs orjson parse", ">= 0.9x"),),
        budget_s=90,
    ),
    Step(
        "resume_speed.py",
        ("--runs", "1"),
        ("--quick",),
        (Row("replay-20k", "--evalreplay-predictions replay of a 20k run vs the fresh run", "0.5x"),),
        budget_s=60,
        quick_rows=(Row("replay-5k", "replay of a 5k run vs the fresh run", "0.5x"),),
    ),
    Step(
        "shards.py",
        ("--merge-vs-read",),
        ("--merge-vs-read", "--quick"),
        (Row("merge-3-shards", "merge of 3 shards vs reading the journals with orjson", "5x / 3x"),),
        budget_s=60,
        needs=("--merge-vs-read",),
    ),
    Step(
        "mc_server_prompts.py",
        (),
        ("--quick",),
        (Row("mc-openai-prompts", "MC via openai: prompts the server processes, 500 x 4", "<= lm-eval's"),),
        budget_s=30,
    ),
    Step(
        "loss_bound.py",
        ("--quick", "--no-throughput"),
        ("--quick", "--no-throughput"),
        (
            Row(
                "kill-reasked",
                "re-asked after a SIGKILL at 200 of 400 (issue: 1,000 of 2,000), concurrency 8",
                "<= lm-eval's",
            ),
        ),
        budget_s=45,
    ),
    Step(
        "item_overhead.py",
        ("--items", "2000,20000,100000", "--slope", "2000,20000,100000"),
        ("--items", "1000,2000", "--slope", "1000,2000,3000"),
        (*_items("2k", "20k", "100k"), _slope("2k->20k vs 20k->100k")),
        budget_s=165,
        quick_rows=(*_items("1k", "2k", "3k"), _slope("1k->2k vs 2k->3k")),
    ),
)


def lacks(step: Step, here: Path = HERE) -> str | None:
    """Why the script of `step` cannot measure its rows (it is missing, or
    lacks an option another helper adds), or None."""
    path = here / step.script
    if not path.is_file():
        return f"no benchmarks/{step.script}"
    source = path.read_text()
    missing = [option for option in step.needs if f'"{option}"' not in source]
    return f"{step.script} lacks {', '.join(missing)}" if missing else None


def time_share(left_s: float, later: Sequence[Step]) -> float:
    """The seconds a script may run: what is left, less the shares the later
    ones are sure of and the grace a stopped script has to clean up."""
    return left_s - sum(step.budget_s for step in later) - GRACE_S


@dataclass(frozen=True)
class Ran:
    """What one script run left: its output, exit status, time, and whether it was stopped."""

    lines: tuple[str, ...]
    returncode: int | None
    seconds: float
    stopped: bool


def run_script(cmd: Sequence[str], timeout_s: float) -> Ran:
    """Run `cmd` in its own process group, echoing its output as it comes;
    past `timeout_s`, SIGINT the group (the script's cleanup runs), then SIGKILL."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            print(f"  | {line}", end="", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    stopped = False
    try:
        proc.wait(timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired:
        stopped = True
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=5)
    assert proc.stdout is not None
    proc.stdout.close()
    return Ran(tuple(lines), proc.returncode, time.perf_counter() - started, stopped)


def verdict_lines(lines: Sequence[str]) -> list[str]:
    """The script's own goal lines, for a script that printed no RESULT line."""
    return [
        line.strip()
        for line in lines
        if "goal" in line and ("met" in line or "MISSED" in line) and not line.startswith("RESULT ")
    ]


def outcome(step: Step, row: Row, ran: Ran | None, why_not: str | None) -> dict[str, Any]:
    """One line of the summary: the row's RESULT, or why it was not measured."""
    if why_not is not None:
        return {"row": row, "note": f"not measured ({why_not})"}
    assert ran is not None
    found = parse(ran.lines).get(row.key)
    if found is not None:
        return {**found, "row": row}
    if ran.stopped:
        reason = f"stopped after {ran.seconds:.0f} s, its time share"
    elif ran.returncode not in (0, 1):
        reason = f"{step.script} exited {ran.returncode}"
    else:
        reason = f"{step.script} printed no RESULT line for it"
    said = [] if parse(ran.lines) else verdict_lines(ran.lines)  # others of its rows were measured
    if not said and ran.returncode != 0:
        said = [line.strip() for line in ran.lines if line.strip()][-1:]  # why it stopped
    told = f"; it said: {' | '.join(said)}" if said else ""
    return {"row": row, "note": f"not measured ({reason}){told}"}


def table(outcomes: Sequence[dict[str, Any]]) -> list[str]:
    """The summary: row, baseline, ours, ratio, goal, met / missed."""
    out = ["| row | baseline | ours | ratio | goal | |", "|---|---|---|---|---|---|"]
    notes: list[str] = []
    for o in outcomes:
        row: Row = o["row"]
        if "note" in o:
            out.append(f"| {row.what} | | | | {row.goal} | {o['note']} |")
            continue
        out.append(
            f"| {row.what} | {o['baseline']} | {o['ours']} | {o['ratio']} | {o['goal']} | "
            f"{'met' if o['met'] else 'MISSED'} |"
        )
        extra = {k: v for k, v in o.items() if k not in {"row", "baseline", "ours", "ratio", "goal", "met"}}
        if extra:
            notes.append(f"  {row.key}: " + ", ".join(f"{k} {v}" for k, v in extra.items()))
    return out + notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: every script runs, fast")
    parser.add_argument("--only", default=None, help="comma-separated scripts to run (the rest are skipped)")
    args = parser.parse_args(argv)
    steps = [s for s in STEPS if args.only is None or s.script in args.only.split(",")]
    started = time.perf_counter()
    outcomes: list[dict[str, Any]] = []
    took: list[tuple[str, float]] = []
    for n, step in enumerate(steps):
        rows = step.quick_rows if args.quick and step.quick_rows is not None else step.rows
        why_not = lacks(step)
        ran = None
        if why_not is None:
            cmd = [sys.executable, str(HERE / step.script), *(step.quick_args if args.quick else step.args)]
            share = time_share(GOAL_S - (time.perf_counter() - started), steps[n + 1 :])
            print(f"== {' '.join(cmd[1:])}  (time share {share:.0f} s)", flush=True)
            ran = run_script(cmd, share)
            took.append((" ".join([step.script, *cmd[2:]]), ran.seconds))
        else:
            print(f"== {step.script}: not run ({why_not})", flush=True)
        outcomes.extend(outcome(step, row, ran, why_not) for row in rows)
    total = time.perf_counter() - started
    print("== times")
    for what, seconds in took:
        print(f"  {seconds:6.0f} s  {what}")
    in_time = total <= GOAL_S
    goal = f"goal under {GOAL_S / 60:.0f} minutes"
    print(f"  {total:6.0f} s  all together: {goal} -> {'met' if in_time else 'MISSED'}")
    load = os.getloadavg()
    print(f"== rows (load average at the end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f})")
    print("\n".join(table(outcomes)))
    all_met = all(o.get("met") is True for o in outcomes)
    return 0 if in_time and all_met else 1


if __name__ == "__main__":
    sys.exit(main())
