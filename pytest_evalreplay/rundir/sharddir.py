"""A shard's output dir as the merge meets it: `evalreplay-shard.json`, the
marker a sharded session writes before its first journal row, saying which
shard wrote the dir and the configuration of each task it ran (its requests
as rendered, its provider, its stages' fingerprints). The merge compares
these to refuse shards of different configurations, and refuses a dir that
another shard (or a second run of the same shard) wrote.

A merged dir gets a marker too (`merged`: the shards it holds), so a copy of
it can seed the shards of the next ELO stage."""

from __future__ import annotations

import gc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.model import EvalReplayError, digest
from pytest_evalreplay.numbers.planning import TaskPlan
from pytest_evalreplay.rundir.merge import Merged, ShardDir, merge
from pytest_evalreplay.shard import Shard
from pytest_evalreplay.storage.files import atomic_write, os_error, read_bytes
from pytest_evalreplay.storage.runschema import SHARD_MARKER

MARKER = SHARD_MARKER
FORMAT = "evalreplay-shard/1"


def task_config(
    plan: TaskPlan, provider: Mapping[str, Any], fingerprints: list[str] | tuple[str, ...] = ()
) -> dict[str, Any]:
    """What must be equal for two shards of a task to be merged."""
    return {
        "requests": digest(sorted([s, iid, rq] for (s, iid), rq in plan.requests.items())),
        "items": len(plan.keys),
        "provider": plan.provider,
        "kind": provider.get("kind"),
        "model": provider.get("model"),
        "stages": list(fingerprints),
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
) -> None:
    """Mark the dir as shard `shard`'s, before anything is written to its
    journals; refuse one another shard wrote (a merged dir's copy is fine:
    it seeds the next ELO stage). `suite` is how the shard was run (its
    `suite_args` and the dir it was started in): the merge runs it so."""
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
    atomic_write(directory / MARKER, orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))


# What the merge's own run sets (or must not inherit from a shard's command line):
# the flags, and the options followed by a value when not written `--opt=value`.
_OWN_FLAGS = {"--resume", "--evalreplay-reset", "--evalreplay-no-generate"}
_OWN_VALUED = {
    "--evalreplay-shard",
    "--evalreplay-output",
    "-n",
    "--numprocesses",
    "--dist",
    "--maxprocesses",
}


def suite_args(args: Sequence[str]) -> list[str]:
    """A shard's command-line arguments less what makes it that shard's run
    (its shard, output dir, resume or reset) and its xdist workers: what the
    merge passes pytest to run the same suite over the merged dir."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.partition("=")[0]
        if name in _OWN_FLAGS:
            continue
        if name == "--resume-stage" or name in _OWN_VALUED:
            skip = name in _OWN_VALUED and "=" not in arg
            continue
        if arg.startswith("-n") and not arg.startswith("--"):  # -n4, -nauto
            continue
        out.append(arg)
    return out


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
    journals = {p.name: read_bytes(p) for p in sorted(directory.glob("*-journal.jsonl")) if p.is_file()}
    return ShardDir(str(directory), marker, journals)


def write_merged_dir(out: Path, merged: Merged) -> None:
    """The merged journals and marker in OUT (a new or journal-free dir)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_error(out, exc, "create") from None
    held = sorted(p.name for p in out.glob("*-journal.jsonl"))
    if held:
        raise EvalReplayError(
            f"{out} already holds journals ({held[0]}...): merge into a new dir (or delete that one first)"
        )
    for name, data in merged.journals.items():
        atomic_write(out / name, data)
    write_merged(out, merged.shards, merged.of, merged.tasks)


def merge_into(out: Path, shards: Sequence[Path], suite_given: bool) -> Merged:
    """The merge command's journal step: read the shard dirs, merge, write OUT.

    The cyclic garbage collector is paused meanwhile: every row is a plain,
    acyclic dict, hundreds of thousands of them alive at once, and each full
    collection walks them all (at 100k rollouts that was half the step)."""
    seen: dict[Path, Path] = {}
    for path in shards:
        first = seen.setdefault(path.resolve(), path)
        if first is not path:
            raise EvalReplayError(f"{path} is given twice ({first} and {path}); pass each shard dir once")
    enabled = gc.isenabled()
    gc.disable()
    try:
        merged = merge([read_shard_dir(path) for path in shards])
        if not suite_given and merged.suite is None:
            raise EvalReplayError(
                "the shard dirs do not say how their suite was run (written by an older version): "
                "give the suite's pytest arguments after --, e.g. python -m pytest_evalreplay merge OUT "
                "SHARD_DIR... -- evals/"
            )
        write_merged_dir(out, merged)
    finally:
        if enabled:
            gc.enable()
    return merged
