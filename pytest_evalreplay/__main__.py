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

from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.report.compare import compare_run_dirs
from pytest_evalreplay.report.compare_render import render_markdown, render_text
from pytest_evalreplay.storage.files import atomic_write

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
        "OUT: one journal per task holding every shard's results; then run the suite over OUT as the "
        "shards ran it (with --evalreplay-no-generate: nothing generated, no provider needed; and "
        "--evalreplay-reuse-scores: the shards' scores kept) to write the run dir a single process "
        "writes, complete an EloEval's stage and judge the gates. What a "
        "missing shard left out stays missing (complete: false): `pytest --resume "
        "--evalreplay-output=OUT` generates it. Exit status: that pytest run's (2: a refused merge).",
        epilog="PYTEST_ARGS after -- replace the suite's arguments the shards recorded "
        "(e.g. merge OUT shards/* -- evals/ -k gsm8k); the run starts in the dir the shards started in "
        "when it exists here, else here.",
    )
    merge.add_argument("out", type=Path, metavar="OUT", help="the merged dir (new, or without journals)")
    merge.add_argument("shards", type=Path, nargs="+", metavar="SHARD_DIR", help="the shards' output dirs")
    merge.add_argument(
        "--rescore",
        action="store_true",
        help="score every rollout again with the current scorers (default: keep the shards' scores)",
    )
    merge.add_argument("pytest_args", nargs="*", metavar="-- PYTEST_ARGS", help="(see below)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] | None = None
    if argv[:1] == ["merge"] and "--" in argv:  # merge OUT SHARD_DIR... -- PYTEST_ARGS
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    args.pytest_args = rest
    if args.command == "merge":
        return merge_main(args.out, args.shards, args.pytest_args, rescore=args.rescore)
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


def merge_main(
    out: Path, shards: Sequence[Path], pytest_args: Sequence[str] | None = None, rescore: bool = False
) -> int:
    """Merge the shards' journals into OUT, then run the suite over OUT with
    --evalreplay-no-generate: the run dir written as every run writes it,
    nothing generated, the gates judged. Exit status: pytest's."""
    from pytest_evalreplay.rundir.sharddir import merge_into

    try:
        merged = merge_into(out, shards, suite_given=pytest_args is not None)
    except EvalReplayError as exc:
        print(f"{PROG} merge: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    lines = [*merged.notes, f"merged shards {', '.join(merged.shards)} into {out}: {', '.join(merged.tasks)}"]
    for k in merged.missing:
        lines.append(
            f"shard {k}/{merged.of} is missing: its rollouts are missing from {out} (complete: false); "
            f"run it and merge again, or `pytest --resume --evalreplay-output={out}` with the provider "
            "generates them"
        )
    start = Path.cwd()
    if pytest_args is None:
        assert merged.suite is not None
        pytest_args = [str(a) for a in merged.suite.get("args", [])]
        recorded = Path(str(merged.suite.get("dir", ".")))
        start = recorded if recorded.is_dir() else start
    scores = "scoring every rollout again" if rescore else "keeping the shards' scores"
    lines.append(f"writing the run dir: the suite in {start} over {out}, generating nothing, {scores}")
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()
    return _finish(out.resolve(), list(pytest_args), start, rescore)


def _finish(out: Path, args: list[str], start: Path, rescore: bool) -> int:
    """pytest, in this process, over the merged dir: `--evalreplay-no-generate`
    writes the run dir from the journals (what missing shards left out stays
    missing) and judges the gates of complete tasks. The shards' scores are
    kept (`--evalreplay-reuse-scores`): they are the suite's scorers' own,
    computed by the shards of one configuration, and scoring every rollout
    again would cost the merge as much as the run's whole scoring (with a
    20 ms scorer at 100k rollouts, 2,000 s). `--rescore` scores again (a
    scorer changed since). The shards' `-n` is left out (scoring is the
    shards' work); an ini's `addopts = -n ...` still holds."""
    import pytest

    args = [*args, "--evalreplay-no-generate", f"--evalreplay-output={out}"]
    if not rescore:
        args.append("--evalreplay-reuse-scores")
    here = Path.cwd()
    os.chdir(start)
    try:
        return int(pytest.main(args))
    finally:
        os.chdir(here)


if __name__ == "__main__":
    sys.exit(main())
