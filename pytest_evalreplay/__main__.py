"""`python -m pytest_evalreplay compare BASE NEW`: compare two saved run dirs
without pytest (a CI step after the eval job, or a look at two old runs).
`python -m pytest_evalreplay merge OUT SHARD_DIR...`: join the output dirs of
`--evalreplay-shard=K/N` runs into one (see docs/scale.md).
`python -m pytest_evalreplay view RUN_DIR [--compare BASE] -o report.html`:
the run as one self-contained HTML file (see docs/report.md).

Exit status: 0 when the comparison was printed (regressions included, unless
`--fail-on-regression`: then 1 on a significant drop), 2 on a bad argument,
path or file (one line on stderr).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.report.compare import RunComparison, compare_run_dirs
from pytest_evalreplay.report.compare_render import render_markdown, render_text
from pytest_evalreplay.storage.files import atomic_write
from pytest_evalreplay.storage.runschema import is_own_file

if TYPE_CHECKING:
    import pytest

    from pytest_evalreplay.rundir.merge import Merged

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
    compare.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit 1 when a gated metric (--gated; without it, every metric) dropped significantly",
    )
    compare.add_argument(
        "--gated",
        action="append",
        default=[],
        metavar="[TASK:]METRIC",
        help="a metric --fail-on-regression checks (repeatable; TASK: limits it to one task)",
    )
    view = commands.add_parser(
        "view",
        help="write a run dir as one self-contained HTML report",
        description="Write RUN_DIR as one HTML file that opens offline (no network, everything inline): "
        "the overview with intervals, every sample, agent episodes, judging, pass@k curves and, with "
        "--compare, what changed against BASE. Needs jinja2: pip install 'pytest-evalreplay[html]'.",
    )
    view.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run dir to show")
    view.add_argument("--compare", type=Path, metavar="BASE", help="a run dir to compare RUN_DIR with")
    view.add_argument(
        "-o", "--output", type=Path, default=Path("report.html"), metavar="FILE", help="default report.html"
    )
    view.add_argument("--alpha", type=_alpha, default=0.05, metavar="A", help="as compare's (default 0.05)")
    merge = commands.add_parser(
        "merge",
        help="join the output dirs of --evalreplay-shard=K/N runs into one",
        description="Join shard dirs (the --evalreplay-output of each --evalreplay-shard=K/N run) into "
        "OUT: one journal per task holding every shard's results; then run the suite over OUT, here, "
        "with the PYTEST_ARGS after -- (with --evalreplay-no-generate: nothing generated, no provider "
        "needed; and --evalreplay-reuse-scores: the shards' scores kept) to write the run dir a single "
        "process writes, complete an EloEval's stage and judge the gates. Every shard's marker must "
        "record the suite this merge runs (its arguments, the dir it was started in relative to the "
        "rootdir, the configuration file): the merge runs no command from a shard dir. A missing shard "
        "is refused unless --allow-missing. Exit status: that pytest run's (2: a refused merge).",
        epilog="PYTEST_ARGS after -- are the suite's arguments, as the shards were run with them less "
        "their shard, output, resume, xdist, provider, report, baseline and terminal options (e.g. merge "
        "OUT shards/* -- evals/ -k gsm8k --evalreplay-report=report.md); without --, pytest runs with "
        "none (the ini's testpaths and addopts). Run it from the dir the shards were started in.",
    )
    merge.add_argument("out", type=Path, metavar="OUT", help="the merged dir (new, or without journals)")
    merge.add_argument("shards", type=Path, nargs="+", metavar="SHARD_DIR", help="the shards' output dirs")
    merge.add_argument(
        "--rescore",
        action="store_true",
        help="score every rollout again with the current scorers (default: keep the shards' scores)",
    )
    merge.add_argument(
        "--allow-missing",
        action="store_true",
        help="merge without the shards not given: their rollouts stay missing (complete: false)",
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
    if args.command == "merge":
        return merge_main(
            args.out, args.shards, rest or [], rescore=args.rescore, allow_missing=args.allow_missing
        )
    if args.command == "view":
        return view_main(args.run_dir, args.compare, args.output, args.alpha)
    try:
        cmp = compare_run_dirs(args.base, args.new, args.alpha)
        lines = render_text(cmp, top=args.top)
        if args.markdown is not None:
            refuse_own_file(args.markdown, (args.base, args.new))
            atomic_write(args.markdown, render_markdown(cmp).encode())
    except EvalReplayError as exc:
        print(f"{PROG} compare: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    drops = significant_drops(cmp, args.gated) if args.fail_on_regression else []
    lines += [f"regression: {d}" for d in drops]
    try:
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `... | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1 if drops else 0


def significant_drops(cmp: RunComparison, gated: Sequence[str]) -> list[str]:
    """The metrics (those named in `gated`, as METRIC or TASK:METRIC; without
    any, every one) whose paired test says the new run dropped (p < alpha).
    A metric's own name may hold ":" (`pass@4:right`): a prefix is a task
    only where it names one of the compared tasks."""
    names = {t.task for t in cmp.tasks}
    wanted = [(t, m) if t in names else ("", g) for g in gated for t, _, m in [g.partition(":")]]
    out = []
    for task in cmp.tasks:
        for m in task.metrics:
            named = not wanted or any(m.metric == metric and t in ("", task.task) for t, metric in wanted)
            if named and m.paired.significant_drop:
                out.append(f"{task.task} {m.metric}: {m.paired.describe()}")
    return out


def view_main(run_dir: Path, base: Path | None, output: Path, alpha: float) -> int:
    """Write the HTML report of `run_dir` to `output`; 2 with one line on stderr when it cannot be."""
    from pytest_evalreplay.report.html import write_report

    try:
        size = write_report(output, run_dir, base, alpha=alpha, option="-o")
    except EvalReplayError as exc:
        print(f"{PROG} view: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(f"wrote {output} ({size:,} bytes): open it in a browser (it needs no network)")
    return 0


def refuse_own_file(markdown: Path, run_dirs: Sequence[Path]) -> None:
    """compare's report never lands on a compared run dir's own files."""
    for run_dir in run_dirs:
        if is_own_file(markdown, run_dir):
            raise EvalReplayError(
                f"--markdown {markdown} is one of the run dir {run_dir}'s own files: writing it would "
                f"destroy saved results. Write it elsewhere, e.g. --markdown={run_dir.parent / 'compare.md'}"
            )


def merge_main(
    out: Path,
    shards: Sequence[Path],
    pytest_args: Sequence[str] = (),
    rescore: bool = False,
    allow_missing: bool = False,
) -> int:
    """Merge the shards' journals, then write OUT's run dir from them alone
    where no task needs the suite (`rundir/direct.py`), else run the suite
    over OUT, from here, with `pytest_args` and --evalreplay-no-generate: the
    run dir written as every run writes it, nothing generated, the gates
    judged. In the suite's case OUT is written
    only once pytest's configuration is known and every shard's recorded
    suite is the one this run is (`_MergeRun`). Exit status: pytest's (0 for
    the run dir written directly)."""
    from pytest_evalreplay.rundir.direct import needs_suite
    from pytest_evalreplay.rundir.sharddir import check_out, read_and_merge

    try:
        merged = read_and_merge(shards)
        if merged.missing and not allow_missing:
            raise EvalReplayError(
                f"shard{'s' if len(merged.missing) > 1 else ''} "
                f"{', '.join(f'{k}/{merged.of}' for k in merged.missing)} "
                f"{'are' if len(merged.missing) > 1 else 'is'} missing (given: {', '.join(merged.shards)}): "
                "pass every shard's dir, or --allow-missing to merge without them (their rollouts stay "
                f"missing from {out}, complete: false, until `pytest --resume --evalreplay-output={out}` "
                "with the provider generates them)"
            )
        check_out(out)
        why = needs_suite(merged, pytest_args, rescore)
        written = why is None
        if why is None:
            why = _write_directly(out, merged)
            if why is None:
                return 0
    except EvalReplayError as exc:
        return _refused(exc)
    plugin = _MergeRun(out, merged, list(pytest_args), rescore, why, written)
    code = _finish(out.resolve(), list(pytest_args), rescore, plugin)
    return _refused(plugin.refused) if plugin.refused is not None else code


def _merged_lines(out: Path, merged: Merged) -> list[str]:
    lines = [
        *merged.notes,
        f"merged shards {', '.join(merged.shards)} into {out}: {', '.join(merged.tasks)}",
    ]
    for k in merged.missing:
        lines.append(
            f"shard {k}/{merged.of} is missing: its rollouts are missing from {out} (complete: false); "
            f"run it and merge again, or `pytest --resume --evalreplay-output={out}` with the provider "
            "generates them"
        )
    return lines


def _write_directly(out: Path, merged: Merged) -> str | None:
    """The merged journals, then the run dir from them alone (`rundir/direct.py`);
    or why the suite's run must write it after all (the journals are in OUT then)."""
    from pytest_evalreplay.rundir.direct import new_run, outcomes, write_run_dir
    from pytest_evalreplay.rundir.sharddir import write_merged_dir
    from pytest_evalreplay.storage.lines import paused_gc

    write_merged_dir(out, merged)
    run = new_run()
    with paused_gc():
        done, why = outcomes(out, merged, run)
        if why is not None:
            return why
        write_run_dir(out, merged, done, run)
    lines = _merged_lines(out, merged)
    for task, (outcome, _) in done.items():
        lines.append(
            f"{task}: {outcome.num_items:,} items, {outcome.num_failed:,} failed, "
            f"{outcome.num_missing:,} missing"
        )
    lines.append(
        f"wrote the run dir from the merged journals, keeping the shards' scores (no pytest run: no "
        f"task needs the suite's code; --rescore, a gate or a report would run it) into {out}"
    )
    _say(lines)
    return None


def _say(lines: Sequence[str]) -> None:
    """The merge's report on stdout, flushed before anything the suite's run prints."""
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def _refused(exc: EvalReplayError) -> int:
    print(f"{PROG} merge: error: {' '.join(str(exc).split())}", file=sys.stderr)
    return 2


class _MergeRun:
    """A plugin of the merge's own pytest run: once pytest's configuration
    is known (rootdir, ini file) and before anything is collected, check
    that every shard ran the suite this run is, then write OUT; or refuse,
    with nothing written or collected. (Registered after pytest's own
    plugins, it runs before the main loop's pytest_cmdline_main.)"""

    def __init__(
        self, out: Path, merged: Merged, args: list[str], rescore: bool, why: str, written: bool = False
    ) -> None:
        self.out, self.merged, self.args, self.rescore = out, merged, args, rescore
        self.why = why  # why the run dir needs this run (`direct.needs_suite`)
        self.written = written  # the merged journals are in OUT already
        self.refused: EvalReplayError | None = None

    def pytest_cmdline_main(self, config: pytest.Config) -> int | None:
        from pytest_evalreplay.rundir.sharddir import (
            MARKER,
            remove_merged,
            suite_identity,
            suite_refusal,
            write_merged_dir,
        )

        try:
            here = Path(config.invocation_params.dir)
            rootdir = Path(config.rootpath)
            current = suite_identity(self.args, here, rootdir, config.inipath)
            for label, (shard, recorded) in self.merged.suites.items():
                why = suite_refusal(Path(label) / MARKER, shard, recorded, current, rootdir)
                if why is not None:
                    raise EvalReplayError(why)
            if not self.written:
                write_merged_dir(self.out, self.merged)
        except EvalReplayError as exc:
            self.refused = exc
            if self.written:  # OUT is left as it was found: without journals
                remove_merged(self.out, self.merged)
            return 2
        merged, out = self.merged, self.out
        lines = _merged_lines(out, merged)
        scores = "scoring every rollout again" if self.rescore else "keeping the shards' scores"
        shown = shlex.join(["pytest", *self.args])
        lines.append(
            f"writing the run dir: {shown} in {here} (every shard ran this suite) over {out}, "
            f"generating nothing, {scores} (a pytest run, as {self.why})"
        )
        _say(lines)
        return None


def _finish(out: Path, args: list[str], rescore: bool, plugin: _MergeRun) -> int:
    """pytest, in this process and this dir, over the merged dir:
    `--evalreplay-no-generate` writes the run dir from the journals (what
    missing shards left out stays missing) and judges the gates of complete
    tasks. The shards' scores are kept (`--evalreplay-reuse-scores`): they
    are the suite's scorers' own, computed by the shards of one
    configuration, and scoring every rollout again would cost the merge as
    much as the run's whole scoring (with a 20 ms scorer at 100k rollouts,
    2,000 s). `--rescore` scores again (a scorer changed since). The
    shards' `-n` is not asked for (scoring is the shards' work); an ini's
    `addopts = -n ...` still holds."""
    import pytest

    args = [*args, "--evalreplay-no-generate", f"--evalreplay-output={out}"]
    if not rescore:
        args.append("--evalreplay-reuse-scores")
    return int(pytest.main(args, plugins=[plugin]))


if __name__ == "__main__":
    sys.exit(main())
