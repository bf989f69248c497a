"""`python -m pytest_evalreplay compare BASE NEW`: compare two saved run dirs
without pytest (a CI step after the eval job, or a look at two old runs).
`python -m pytest_evalreplay merge OUT SHARD_DIR...`: join the output dirs of
`--evalreplay-shard=K/N` runs into one (see docs/scale.md).

Exit status: 0 when the comparison was printed (regressions included: gating
is the gate item's job), 2 on a bad argument, path or file (one line on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_evalreplay.compare import compare_run_dirs
from pytest_evalreplay.compare_render import render_markdown, render_text
from pytest_evalreplay.files import atomic_write
from pytest_evalreplay.model import EvalReplayError

PROG = "python -m pytest_evalreplay"


def _count(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def _alpha(value: str) -> float:
    try:
        alpha = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not 0 < alpha < 0.5:
        raise argparse.ArgumentTypeError(f"must be between 0 and 0.5 (a one-sided level), got {value}")
    return alpha


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="pytest-evalreplay tools that need no pytest run."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    compare = commands.add_parser(
        "compare",
        help="compare two saved run dirs",
        description="Compare two run dirs written by pytest-evalreplay: each metric's difference "
        "(NEW - BASE) with the paired t-test a gate decides with (one-sided p for a drop, and the "
        "interval at 1 - 2 * alpha) over the instances both scored, and the instances whose score "
        "flipped (for an EloEval: the rating's paired bootstrap and the tasks whose verdicts flipped).",
    )
    compare.add_argument("base", type=Path, metavar="BASE", help="the run dir to compare against")
    compare.add_argument("new", type=Path, metavar="NEW", help="the run dir to compare")
    compare.add_argument(
        "--markdown", type=Path, metavar="FILE", help="also write the full report (every flip) here"
    )
    compare.add_argument(
        "--top", type=_count, default=20, metavar="N", help="flips listed per task (default 20)"
    )
    compare.add_argument(
        "--alpha",
        type=_alpha,
        default=0.05,
        metavar="A",
        help="the paired test's one-sided level, as the gate's alpha (default 0.05: a 90%% interval)",
    )
    merge = commands.add_parser(
        "merge",
        help="join the output dirs of --evalreplay-shard=K/N runs into one",
        description="Join shard dirs (the --evalreplay-output of each --evalreplay-shard=K/N run) into "
        "OUT: one journal per task holding every shard's results. Then `pytest --resume "
        "--evalreplay-output=OUT` writes the run dir from it (generating only what missing shards "
        "left out), judges the gates and completes an EloEval's stage.",
    )
    merge.add_argument("out", type=Path, metavar="OUT", help="the merged dir (new, or without journals)")
    merge.add_argument("shards", type=Path, nargs="+", metavar="SHARD_DIR", help="the shards' output dirs")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "merge":
        return merge_main(args.out, args.shards)
    try:
        cmp = compare_run_dirs(args.base, args.new, args.alpha)
        lines = render_text(cmp, top=args.top)
        if args.markdown is not None:
            atomic_write(args.markdown, render_markdown(cmp).encode())
    except EvalReplayError as exc:
        print(f"{PROG} compare: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    try:
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `... | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())


def merge_main(out: Path, shards: Sequence[Path]) -> int:
    from pytest_evalreplay.merge import merge
    from pytest_evalreplay.sharddir import read_shard_dir, write_merged_dir

    try:
        seen: dict[Path, Path] = {}
        for path in shards:
            first = seen.setdefault(path.resolve(), path)
            if first is not path:
                raise EvalReplayError(f"{path} is given twice ({first} and {path}); pass each shard dir once")
        merged = merge([read_shard_dir(path) for path in shards])
        write_merged_dir(out, merged)
    except EvalReplayError as exc:
        print(f"{PROG} merge: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    lines = [*merged.notes, f"merged shards {', '.join(merged.shards)} into {out}: {', '.join(merged.tasks)}"]
    for k in merged.missing:
        lines.append(
            f"shard {k}/{merged.of} is missing: its rollouts are missing from {out} (run it and merge "
            "again, or `pytest --resume` below generates them)"
        )
    lines.append(
        f"next: pytest --resume --evalreplay-output={out} (with the suite) writes the run dir, "
        "judges the gates and completes an EloEval's stage; --evalreplay-predictions replays it after"
    )
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
