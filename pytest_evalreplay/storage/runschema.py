"""The run dir's schema: its format tag, its file names, the builders of its
requests and predictions rows, and the checks that read them back.

One module, so the plugin that writes a run dir (`rundir`), replay that
serves it (`formats.native`) and compare that reads its scores (`snapshot`)
cannot drift apart: a row is built here, and every reader checks it here,
each malformed field an `EvalReplayError` naming file:line, the field, what it
must be and what it holds. The layout itself is described in docs/rundir.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.model import TASK_NAME, EvalReplayError, Request, request_content
from pytest_evalreplay.storage.files import os_error, read_bytes
from pytest_evalreplay.storage.rowfields import bad_field, not_an_object, optional_string, show

FORMAT = "evalreplay/1"
MANIFEST = "manifest.json"
REQUESTS_SUFFIX = "-requests.jsonl"
PREDICTIONS_SUFFIX = "-predictions.jsonl"
METRICS_SUFFIX = "-metrics.json"
# An EloEval's LLM judge's verdicts, beside the candidate's predictions: its
# journal and run dir files are those of a task named `<name>-judge`.
TRANSCRIPTS_SUFFIX = "-transcripts.jsonl"

# The plugin's own files and folders in an output dir.
SESSION_LOCK = ".evalreplay-session.lock"
SESSION_HOLDER = ".evalreplay-session.json"
SESSION_WORKERS = ".evalreplay-session-workers.lock"  # xdist workers' shared claim (flock LOCK_SH)
WORKERS_GONE_WAIT = 5.0  # seconds a new session waits for a dead controller's workers to stop
MANIFEST_LOCK = ".manifest.lock"
LOCKS_DIR = ".evalreplay-locks"  # the chunk locks
PROGRESS_DIR = ".evalreplay-progress"  # xdist workers' progress files
# The plugin's own folders in an output dir: a link planted at one, or at any lock
# file's name (`.*.lock`: the session's, the manifest's, each task's), is refused
# before anything is locked, written or removed there.
OWN_DIRS = (LOCKS_DIR, PROGRESS_DIR)
TURNS_SUFFIX = "-turns"  # an agent task's journal of model turns and tool results: <task>-turns-journal.jsonl
JUDGE_SUFFIX = "-judge"
JUDGE_PREDICTIONS_SUFFIX = JUDGE_SUFFIX + PREDICTIONS_SUFFIX
# A requests row's keys, in the order `request_row` writes them (replay's
# fast way reads a plain text row by exactly these).
REQUEST_FIELDS = ("instance_id", "request_type", "context", "system_prompt", "num_samples", "sampling")
# The key of a replayed `Generation`'s metadata that holds the sampling its saved
# request was made with, where it differs from the sampling asked now: the run
# dir writes it into that instance's requests row (and drops it from the
# predictions row), so a requests row says what its generations were made with.
SAVED_SAMPLING = "saved_sampling"


JOURNAL_SUFFIX = "-journal.jsonl"
SHARD_MARKER = "evalreplay-shard.json"
# Every name in an output dir that the plugin writes or reads as its own.
_OWN_NAMES = frozenset({MANIFEST, SHARD_MARKER, "CACHEDIR.TAG", ".gitignore"})
_OWN_SUFFIXES = (JOURNAL_SUFFIX, REQUESTS_SUFFIX, PREDICTIONS_SUFFIX, METRICS_SUFFIX, TRANSCRIPTS_SUFFIX)


def is_own_name(name: str) -> bool:
    """Whether a file of this name in an output dir is one of the run dir's
    own (saved results, locks, markers): a user's file written there under
    such a name would destroy or be taken for saved results."""
    return (
        name in _OWN_NAMES
        or name.endswith(_OWN_SUFFIXES)
        or name.startswith(".evalreplay")
        or (name.startswith(".") and name.endswith(".lock"))
    )


def is_own_file(path: Path, directory: Path) -> bool:
    """Whether writing `path` would land on one of output dir `directory`'s
    own files or folders: the one test every writer of a user-named file
    (report, baseline, compare's Markdown) takes, so none can destroy saved
    results. Links are followed, as the write would follow them."""
    try:
        out, target = directory.resolve(), path.resolve()
    except OSError:
        return False
    if any(out / d == target or out / d in target.parents for d in OWN_DIRS):
        return True
    return target.parent == out and is_own_name(target.name)


def task_files(directory: Path, task: str) -> dict[str, Path]:
    """A task's three files in a run dir."""
    return {
        "requests": directory / f"{task}{REQUESTS_SUFFIX}",
        "predictions": directory / f"{task}{PREDICTIONS_SUFFIX}",
        "metrics": directory / f"{task}{METRICS_SUFFIX}",
    }


# -- writing ------------------------------------------------------------------


def remove_task_files(directory: Path, task: str) -> None:
    """A task's saved results were discarded: its run dir files go too."""
    for path in (*task_files(directory, task).values(), directory / f"{task}{TRANSCRIPTS_SUFFIX}"):
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise os_error(path, exc, "remove") from None


def request_row(instance_id: str, stage: int, content: Mapping[str, Any], num_samples: int) -> dict[str, Any]:
    """A requests row, from a request's content (`model.request_content`, as
    the journal keeps it): `images`, `tools` and a loglikelihood request's
    `continuations` only when there are some, `stage` only when not 1."""
    row: dict[str, Any] = {
        "instance_id": instance_id,
        "request_type": content.get("request_type", "generate"),
        "context": content.get("context"),
        "system_prompt": content.get("system_prompt"),
        "num_samples": num_samples,
        "sampling": content.get("sampling", {}),
    }
    for extra in ("images", "tools", "continuations"):
        if content.get(extra):
            row[extra] = content[extra]
    if stage != 1:
        row["stage"] = stage
    return row


def request_row_of(request: Request) -> dict[str, Any]:
    """The requests row of a `Request` (one that asks for all its rollouts)."""
    return request_row(request.instance_id, request.stage, request_content(request), request.num_samples)


# The key orders of `Generation.to_row` for a generation without tool calls,
# loglikelihoods or a rolling answer: original_text and metadata only when set.
_PLAIN_ROW_KEYS = frozenset(
    ("text", *original, "finish_reason", "prompt_tokens", "completion_tokens", *metadata)
    for original in ((), ("original_text",))
    for metadata in ((), ("metadata",))
)


def is_plain_generation(row: Any) -> bool:
    """Whether a saved generation row is one `Generation.to_row` writes, keys
    in its order, of a generation with no tool calls, loglikelihoods or
    rolling answer: then `Generation.from_row(row).to_row() == row`, and a
    predictions row may hold it as it is instead of a Generation built and
    encoded again (most of what writing a run dir from a journal cost)."""
    if type(row) is not dict or tuple(row) not in _PLAIN_ROW_KEYS:
        return False
    p, c = row["prompt_tokens"], row["completion_tokens"]
    return (
        type(row["text"]) is str
        and type(row.get("original_text", "")) is str
        and (p is None or (type(p) is int and p >= 0))
        and (c is None or (type(c) is int and c >= 0))
        and ("metadata" not in row or (type(row["metadata"]) is dict and bool(row["metadata"])))
    )


def prediction_row(
    instance_id: str,
    stage: int,
    model: str | None,
    generations: Sequence[Mapping[str, Any] | orjson.Fragment],
    sample_scores: Sequence[Mapping[str, float] | None],
    rollouts: Sequence[int],
    num_samples: int,
    over_samples: Mapping[str, float] | None = None,
    doc: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One instance's predictions row: its saved generations (`Generation.to_row`,
    or that row's JSON as a fragment) in rollout order, each sample's scores
    (None where its scorer failed: the generation is still saved, so a later
    run can score it), and the mean of each metric over the samples that have
    it, plus `over_samples`: values computed over all the samples (pass@k,
    maj@k). `rollouts` is written only
    when the row holds other samples than 0..num_samples-1; `doc` (an lm-eval
    task's document, so the row says what was asked) only when given, last."""
    sums: dict[str, list[float]] = {}
    for scores in sample_scores:
        for name, value in (scores or {}).items():
            sums.setdefault(name, []).append(value)
    row: dict[str, Any] = {
        "instance_id": instance_id,
        "model": model,
        "generations": list(generations),
        "scores": {n: sum(v) / len(v) for n, v in sums.items()} | dict(over_samples or {}),
        "sample_scores": [None if s is None else dict(s) for s in sample_scores],
    }
    if stage != 1:
        row["stage"] = stage
    if list(rollouts) != list(range(num_samples)):
        row["rollouts"] = list(rollouts)
    if doc is not None:
        row["doc"] = doc
    return row


# -- reading ------------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    """manifest.json, checked: the model's name, and the tasks whose files the
    run dir holds (None where the manifest does not list them)."""

    path: Path
    model: str | None
    tasks: tuple[str, ...] | None


def read_manifest(path: Path) -> Manifest | None:
    """A run dir's manifest.json, or None where there is none. One that is
    there must be JSON, ours, and of this format."""
    if not path.exists():
        return None
    try:
        doc = orjson.loads(read_bytes(path).removeprefix(b"\xef\xbb\xbf"))  # a UTF-8 byte order mark
    except orjson.JSONDecodeError as exc:
        raise EvalReplayError(
            f"{path}: not valid JSON ({exc}); fix or delete it (a run that ends writes it again)"
        ) from None
    if type(doc) is not dict:
        raise not_an_object(str(path), "a run dir manifest", doc)
    fmt = doc.get("format")
    if fmt != FORMAT:
        raise EvalReplayError(
            f"{path}: run dir format {show(fmt)}, and this version of pytest-evalreplay reads "
            f"{FORMAT!r}: read it with the version that wrote it, or upgrade"
        )
    model = optional_string(doc, "model", str(path))
    tasks = doc.get("tasks")
    if tasks is not None and (
        type(tasks) is not list or not all(type(t) is str and TASK_NAME.fullmatch(t) for t in tasks)
    ):
        raise bad_field(str(path), "tasks", "a list of task names ([A-Za-z0-9_.-]+)", tasks)
    return Manifest(path=path, model=model, tasks=None if tasks is None else tuple(tasks))


def stage_of(row: Mapping[str, Any], where: str) -> int:
    """A row's stage: 1 where it says none."""
    stage = row.get("stage", 1)
    if type(stage) is not int or stage < 1:
        raise bad_field(where, "stage", "a positive integer", stage)
    return stage


@dataclass(frozen=True, slots=True)
class RequestFields:
    """A requests row's fields, checked. `extras`: the row has images or tools;
    `continuations`: a loglikelihood row's (delimiter + choice, in order)."""

    instance_id: str
    stage: int
    request_type: str
    context: str | list[Any]
    system_prompt: str | None
    extras: bool
    continuations: tuple[str, ...] = ()


def request_fields(row: Any, where: str) -> RequestFields:
    """A requests row, every field `request_row` writes checked (`where`: file:line)."""
    if type(row) is not dict:
        raise not_an_object(where, "a requests row", row)
    for name in ("instance_id", "context", "request_type"):
        if name not in row:
            raise EvalReplayError(f"{where}: a requests row needs its {name!r}")
    iid = row["instance_id"]
    if type(iid) is not str:
        raise bad_field(where, "instance_id", "a string", iid)
    stage = stage_of(row, where)
    kind = row["request_type"]
    if type(kind) is not str:
        raise bad_field(where, "request_type", "'generate', 'loglikelihood' or 'loglikelihood_rolling'", kind)
    context = row["context"]
    if type(context) is not str and type(context) is not list:
        raise bad_field(where, "context", "a string or a list of chat messages", context)
    system = optional_string(row, "system_prompt", where)
    extras = False
    for name in ("images", "tools"):
        value = row.get(name)
        if value is not None and type(value) is not list:
            raise bad_field(where, name, "a list or null", value)
        extras = extras or bool(value)
    continuations = row.get("continuations")
    if kind == "loglikelihood" and (
        type(continuations) is not list or not continuations or not all(type(c) is str for c in continuations)
    ):
        raise bad_field(
            where, "continuations", "a non-empty list of strings (a loglikelihood request's)", continuations
        )
    return RequestFields(iid, stage, kind, context, system, extras, tuple(continuations or ()))


@dataclass(frozen=True, slots=True)
class PredictionFields:
    """A predictions row's fields that say what it answers, checked; its
    generations are checked one by one where they are read (replay decodes a
    row only when a request asks for it)."""

    instance_id: str
    stage: int
    model: str | None
    generations: list[Any]


def prediction_fields(row: Any, where: str) -> PredictionFields:
    """A predictions row's instance, stage, model and generations list (`where`: file:line)."""
    if type(row) is not dict:
        raise not_an_object(where, "a predictions row", row)
    if "instance_id" not in row or "generations" not in row:
        raise EvalReplayError(
            f"{where}: a predictions row needs a string 'instance_id' and a list 'generations'; "
            "fix or delete that line (was the file written by hand?)"
        )
    iid = row["instance_id"]
    if type(iid) is not str:
        raise bad_field(where, "instance_id", "a string", iid)
    generations = row["generations"]
    if type(generations) is not list:
        raise bad_field(where, "generations", "a list", generations)
    model = optional_string(row, "model", where)
    return PredictionFields(iid, stage_of(row, where), model, generations)


def doc_of(row: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    """A predictions row's `doc` (an lm-eval task's document): an object, or
    None where the row has none (rows of other tasks, and older run dirs)."""
    doc = row.get("doc")
    if doc is None or type(doc) is dict:
        return doc
    raise bad_field(where, "doc", "an object (the lm-eval document) or null", doc)


def rollouts_of(value: Any, count: int, where: str) -> tuple[int, ...]:
    """A predictions row's `rollouts`: the sample index of each of its `count`
    generations (0..count-1 where the row says none)."""
    if value is None:
        return tuple(range(count))
    if (
        type(value) is not list
        or len(value) != count
        or not all(type(r) is int and r >= 0 for r in value)
        or len(set(value)) != count
    ):
        raise EvalReplayError(
            f"{where}: 'rollouts' must list one distinct sample index per generation "
            f"({count} generations, rollouts {show(value)}); fix or delete that line"
        )
    return tuple(value)


def scores_of(value: Any, where: str, name: str) -> dict[str, float]:
    """A {metric: number} object of a predictions row (`scores`, an entry of
    `sample_scores`) or of metrics.json (`metrics`)."""
    if type(value) is not dict:
        raise EvalReplayError(f"{where}: {name!r} must be an object of metric -> number")
    for v in value.values():
        if type(v) is not float:
            break
    else:
        return value  # the common case: what the plugin writes, all floats
    out: dict[str, float] = {}
    for metric, score in value.items():
        if type(score) is not int and type(score) is not float:
            raise EvalReplayError(f"{where}: {name!r}: {metric!r} must be a number, got {show(score)}")
        out[metric] = float(score)
    return out


def sample_scores_of(value: Any, count: int, where: str) -> list[dict[str, float] | None]:
    """A predictions row's `sample_scores`: one object per generation, or null
    for a sample whose scorer failed (it has no scores, never a 0)."""
    if type(value) is not list or len(value) != count:
        raise EvalReplayError(f"{where}: 'sample_scores' must hold one object (or null) per generation")
    return [None if s is None else scores_of(s, where, "sample_scores") for s in value]
