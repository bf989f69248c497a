"""A shard's output dir as the merge meets it: `evalreplay-shard.json`, the
marker a sharded session writes before its first journal row, saying which
shard wrote the dir and the configuration of each task it ran (its requests
as rendered, its provider, its stages' fingerprints). The merge compares
these to refuse shards of different configurations, and refuses a dir that
another shard (or a second run of the same shard) wrote.

A merged dir gets a marker too (`merged`: the shards it holds), so a copy of
it can seed the shards of the next ELO stage."""

from __future__ import annotations

import hashlib
import os
import shlex
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.model import EvalReplayError, digest
from pytest_evalreplay.numbers.planning import TaskPlan
from pytest_evalreplay.rundir.merge import Merged, ShardDir, merge
from pytest_evalreplay.storage.files import atomic_write, os_error, read_bytes
from pytest_evalreplay.storage.lines import paused_gc
from pytest_evalreplay.storage.runschema import SHARD_MARKER
from pytest_evalreplay.values.shard import Shard

MARKER = SHARD_MARKER
FORMAT = "evalreplay-shard/1"


def task_config(
    plan: TaskPlan,
    provider: Mapping[str, Any],
    fingerprints: list[str] | tuple[str, ...] = (),
    rundir: Mapping[str, Any] | str = "not recorded",
) -> dict[str, Any]:
    """What must be equal for two shards of a task to be merged. `rundir`:
    what writing its run dir from the merged journal takes (the instance
    order, each instance's request, the reasoning strip, pass@k), or why the
    merge must run the suite for it (`rundir/direct.py`)."""
    return {
        "requests": digest(sorted([s, iid, rq] for (s, iid), rq in plan.requests.items())),
        "items": len(plan.keys),
        "provider": plan.provider,
        "kind": provider.get("kind"),
        "model": provider.get("model"),
        "stages": list(fingerprints),
        "rundir": rundir if isinstance(rundir, str) else dict(rundir),
    }


def read_marker(directory: Path) -> dict[str, Any] | None:
    """The dir's marker (None when it has none); an error naming a broken one."""
    path = directory / MARKER
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise os_error(path, exc, "read") from None
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        doc = exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("tasks"), dict):
        raise EvalReplayError(
            f"{path}: not a shard marker ({FORMAT}); it was not written by --evalreplay-shard "
            "(or was edited): run that shard again into a fresh --evalreplay-output"
        )
    return doc


def claim(
    directory: Path,
    shard: Shard,
    tasks: Mapping[str, Mapping[str, Any]],
    suite: Mapping[str, Any] | None = None,
    max_attempts: int | None = None,
    finish: Sequence[str] = (),
) -> None:
    """Mark the dir as shard `shard`'s, before anything is written to its
    journals; refuse one another shard wrote (a merged dir's copy is fine:
    it seeds the next ELO stage). `suite` is the suite's identity
    (`suite_identity`): the merge refuses to run a suite that differs;
    `max_attempts` and `finish` (the options whose files the session writes
    at its end) are for a run dir the merge writes itself (`direct.py`)."""
    known = read_marker(directory)
    if known is not None and "shard" in known and known["shard"] != str(shard):
        raise EvalReplayError(
            f"the output dir {directory} holds shard {known['shard']}'s results ({directory / MARKER}): "
            f"pass another --evalreplay-output for shard {shard} (each shard writes its own dir)"
        )
    before = known.get("tasks", {}) if known is not None and "shard" in known else {}
    doc: dict[str, Any] = {"format": FORMAT, "shard": str(shard), "tasks": {**before, **tasks}}
    if suite is not None:
        doc["suite"] = dict(suite)
    if max_attempts is not None:  # what a retryable failure's standing was judged by
        doc["max_attempts"] = max_attempts
        doc["finish"] = list(finish)
    atomic_write(directory / MARKER, orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))


# What identifies the suite a shard ran is its pytest arguments less those
# that do not choose or configure the suite: what the merge's own run sets,
# xdist's workers, the provider's (the merge generates nothing; the shards'
# providers are compared by their task configurations), the merge's own
# outputs and gates, and the terminal's. Flags, then options followed by a
# value when not written `--opt=value` (or, for -n and -r, `-n4`, `-rs`).
_OWN_FLAGS = {
    "--resume",
    "--evalreplay-reset",
    "--evalreplay-no-generate",
    "--evalreplay-reuse-scores",
    "--evalreplay-report-reused",
    "--evalreplay-update-baseline",
    "--quiet",
    "--verbose",
}
_OWN_VALUED = {
    "--evalreplay-shard",
    "--evalreplay-output",
    "-n",
    "--numprocesses",
    "--dist",
    "--maxprocesses",
    "--evalreplay-provider",
    "--evalreplay-model",
    "--evalreplay-base-url",
    "--evalreplay-engine-arg",
    "--evalreplay-concurrency",
    "--evalreplay-timeout",
    "--evalreplay-batch-size",
    "--evalreplay-max-attempts",
    "--evalreplay-report",
    "--evalreplay-html",
    "--evalreplay-compare",
    "--evalreplay-baseline",
    "--evalreplay-failure-budget",
    "--evalreplay-progress-interval",
    "--basetemp",
    "--tb",
    "--color",
    "-r",
}
_ATTACHED = ("-n", "-r")  # short options whose value may follow without a space


def suite_args(args: Sequence[str]) -> list[str]:
    """A run's command-line arguments as they identify its suite: less what
    makes it that shard's run (its shard, output dir, resume or reset), its
    xdist workers, its provider, outputs and terminal options. A shard
    records them; the merge refuses to run a suite whose arguments differ."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.partition("=")[0]
        if name in _OWN_FLAGS or (len(arg) > 1 and arg[0] == "-" and set(arg[1:]) <= {"q", "v"}):
            continue
        if name == "--resume-stage" or name in _OWN_VALUED:
            skip = name in _OWN_VALUED and "=" not in arg
            continue
        if arg.startswith(_ATTACHED) and not arg.startswith("--"):  # -n4, -nauto, -rfE
            continue
        out.append(arg)
    return out


def suite_identity(args: Sequence[str], start: Path, rootdir: Path, inipath: Path | None) -> dict[str, Any]:
    """What a shard records of the suite it ran, and the merge compares with
    its own: the arguments that choose it, the dir it was started in
    relative to pytest's rootdir (the same on every checkout), and the
    configuration file, by its rootdir-relative name and a digest of its bytes."""
    config = None
    if inipath is not None:
        try:
            data = Path(inipath).read_bytes()
        except OSError as exc:
            raise os_error(Path(inipath), exc, "read") from None
        config = {
            "file": Path(os.path.relpath(inipath, rootdir)).as_posix(),
            "digest": hashlib.blake2b(data, digest_size=16).hexdigest(),
        }
    return {
        "args": suite_args([str(a) for a in args]),
        "start": Path(os.path.relpath(start, rootdir)).as_posix(),
        "config": config,
    }


def _shown_args(args: Sequence[str]) -> str:
    return repr(shlex.join(args)) if args else "none"


def _shown_config(config: Mapping[str, Any] | None) -> str:
    return f"the configuration file {config['file']}" if config else "no configuration file"


def suite_refusal(
    marker: Path, shard: str, recorded: Any, current: Mapping[str, Any], rootdir: Path
) -> str | None:
    """Why the merge must not run its suite over shard `shard`'s results
    (None: the shard ran this suite): its marker's recorded identity is
    missing, edited, or differs from the merge's own."""
    who = f"{marker}: shard {shard}"
    config = recorded.get("config") if isinstance(recorded, dict) else None
    if (
        not isinstance(recorded, dict)
        or not isinstance(recorded.get("args"), list)
        or not all(isinstance(a, str) for a in recorded["args"])
        or not isinstance(recorded.get("start"), str)
        or "config" not in recorded
        or not (config is None or (isinstance(config, dict) and set(config) == {"file", "digest"}))
    ):
        return (
            f"{who}'s marker does not record the suite it ran (written by an older version, or "
            "edited): run that shard again with this version into a fresh --evalreplay-output"
        )
    args = recorded["args"]
    odd = [a for a in args if a not in suite_args(args)] if suite_args(args) != args else []
    odd += [f"{key}={recorded[key]!r}" for key in sorted(set(recorded) - {"args", "start", "config"})]
    if odd:
        return (
            f"{who}'s marker records {', '.join(map(repr, odd))}, which no shard records (a shard's "
            "provider, output, report and terminal options are left out, and so is where it ran): the "
            "marker was edited, and the merge runs no command from a marker: run that shard again into "
            "a fresh --evalreplay-output"
        )
    if args != current["args"]:
        return (
            f"{who} ran the suite with the arguments {_shown_args(args)}, and this merge runs it with "
            f"{_shown_args(current['args'])}: give the arguments the shards' suite was run with after -- "
            "(python -m pytest_evalreplay merge OUT SHARD_DIR... -- ARGS; provider, output, report and "
            "terminal options may differ), or merge only shards of one suite"
        )
    if recorded["start"] != current["start"]:
        return (
            f"{who} was started in {recorded['start']!r} of its rootdir, and this merge in "
            f"{current['start']!r} of its rootdir {rootdir}: run the merge from the dir the shards were "
            "started in"
        )
    if config != current["config"]:
        same = config is not None and current["config"] is not None
        mine = (
            f"{current['config']['file']}, whose content differs"
            if same
            else _shown_config(current["config"])
        )
        return (
            f"{who} ran with {_shown_config(config)}, and this merge with {mine} (rootdir {rootdir}): "
            "merge from a checkout of the shards' configuration"
        )
    return None


def write_merged(directory: Path, shards: list[str], of: int, tasks: Mapping[str, Any]) -> None:
    doc = {"format": FORMAT, "merged": shards, "of": of, "tasks": dict(tasks)}
    atomic_write(directory / MARKER, orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))


def read_shard_dir(directory: Path) -> ShardDir:
    """A shard dir as the merge takes it: its marker and its journals."""
    if not directory.is_dir():
        raise EvalReplayError(f"{directory}: not a directory (pass the shards' --evalreplay-output dirs)")
    marker = read_marker(directory)
    if marker is None:
        raise EvalReplayError(
            f"{directory} is not a shard dir (no {MARKER}): pass the --evalreplay-output dirs of runs "
            "made with --evalreplay-shard=K/N"
        )
    journals = JournalFiles({p.name: p for p in sorted(directory.glob("*-journal.jsonl")) if p.is_file()})
    return ShardDir(str(directory), marker, journals)


class JournalFiles(Mapping[str, bytes]):
    """A shard dir's journals, each file read when taken: the merge holds one
    shard's journal at a time, not every shard's."""

    def __init__(self, paths: Mapping[str, Path]) -> None:
        self._paths = dict(paths)

    def __getitem__(self, name: str) -> bytes:
        return read_bytes(self._paths[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)


def check_out(out: Path) -> None:
    """Refuse an OUT that already holds journals (before anything is written)."""
    held = sorted(p.name for p in out.glob("*-journal.jsonl")) if out.is_dir() else []
    if held:
        raise EvalReplayError(
            f"{out} already holds journals ({held[0]}...): merge into a new dir (or delete that one first)"
        )


def write_merged_dir(out: Path, merged: Merged) -> None:
    """The merged journals and marker in OUT (a new or journal-free dir)."""
    check_out(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_error(out, exc, "create") from None
    for name, journal in merged.journals.of.items():
        atomic_write(out / name, journal.chunks())  # a shard's journal at a time, never all rows
    write_merged(out, merged.shards, merged.of, merged.tasks)


def remove_merged(out: Path, merged: Merged) -> None:
    """Undo `write_merged_dir` (a refused merge leaves OUT without journals)."""
    for name in [*merged.journals, MARKER]:
        try:
            (out / name).unlink(missing_ok=True)
        except OSError as exc:
            raise os_error(out / name, exc, "remove") from None


def read_and_merge(shards: Sequence[Path]) -> Merged:
    """The merge command's journal step: read the shard dirs and merge them
    (nothing written; each merged journal is its shards' kept byte ranges,
    read again when written: `merge.MergedJournal`).

    The cyclic garbage collector is paused meanwhile (`storage.lines.paused_gc`)."""
    seen: dict[Path, Path] = {}
    for path in shards:
        first = seen.setdefault(path.resolve(), path)
        if first is not path:
            raise EvalReplayError(f"{path} is given twice ({first} and {path}); pass each shard dir once")
    with paused_gc():
        dirs: list[ShardDir] = []
        for path in shards:
            dirs.append(read_shard_dir(path))
            _share_configs(dirs)
        return merge(dirs)


def _share_configs(dirs: Sequence[ShardDir]) -> None:
    """The last dir's task configurations equal to an earlier dir's become that
    one object: every shard's marker records each instance's request (60k
    instances: 18 MiB decoded), and the merge holds one copy, not one a shard."""
    last = dirs[-1].marker["tasks"]
    for d in dirs[:-1]:
        for task, config in d.marker["tasks"].items():
            if last.get(task) is not config and last.get(task) == config:
                last[task] = config


def merge_into(out: Path, shards: Sequence[Path]) -> Merged:
    """Read, merge and write OUT: the journal step without the suite's run."""
    merged = read_and_merge(shards)
    write_merged_dir(out, merged)
    return merged
