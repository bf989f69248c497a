"""The run dir writer: manifest, requests, predictions and metrics per task.

Rows are appended as batches finish (a crash loses nothing already
generated); when a task's run ends, its files are rewritten from the journal
in canonical order (instance order, then stage), atomically, so a resumed run
leaves the same files as an uninterrupted one. The layout is the contract's;
`formats.native` reads it back.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from filelock import FileLock

from pytest_evalreplay.journal import JournalState
from pytest_evalreplay.model import EvalReplayError, RolloutResult, aggregate

FORMAT = "evalreplay/1"


def task_files(directory: Path, task: str) -> dict[str, Path]:
    return {
        "requests": directory / f"{task}-requests.jsonl",
        "predictions": directory / f"{task}-predictions.jsonl",
        "metrics": directory / f"{task}-metrics.json",
    }


def _lock(directory: Path) -> FileLock:
    return FileLock(str(directory / ".rundir.lock"))


def _jsonl(rows: Iterable[Mapping[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def prediction_row(
    instance_id: str,
    stage: int,
    results: Sequence[RolloutResult],
    num_samples: int,
    model: str | None,
) -> dict[str, Any]:
    """One instance's row: its successful rollouts' generations in rollout
    order, and its scores (the mean over rollouts, plus each sample's own)."""
    ordered = sorted((r for r in results if r.ok and r.generation is not None), key=lambda r: r.rollout)
    _, scores = aggregate(ordered)
    row: dict[str, Any] = {
        "instance_id": instance_id,
        "model": model,
        "generations": [r.generation.to_row() for r in ordered if r.generation is not None],
        "scores": scores.get(instance_id, {}),
        "sample_scores": [dict(r.scores) for r in ordered],
    }
    if stage != 1:
        row["stage"] = stage
    rollouts = [r.rollout for r in ordered]
    if rollouts != list(range(num_samples)):
        row["rollouts"] = rollouts
    return row


def append(
    directory: Path,
    task: str,
    requests: Sequence[Mapping[str, Any]],
    predictions: Sequence[Mapping[str, Any]],
) -> None:
    """Append a finished batch's rows (the crash-safe log; `finalize` tidies)."""
    files = task_files(directory, task)
    with _lock(directory):
        for kind, rows in (("requests", requests), ("predictions", predictions)):
            blob = _jsonl(rows)
            if blob:
                with files[kind].open("ab") as fh:
                    fh.write(blob)


def clear_task(directory: Path, task: str) -> None:
    """Drop a task's files when its journal starts fresh, so rows appended by
    an earlier run never mix with this run's."""
    with _lock(directory):
        for path in task_files(directory, task).values():
            path.unlink(missing_ok=True)


def metrics_doc(task: str, state: JournalState) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """A task's `<task>-metrics.json` document from its journal, and each
    instance's scores: what the run dir records and what gates judge."""
    failed = state.final_failures()
    metrics, scores = aggregate(list(state.done.values()))
    doc: dict[str, Any] = {
        "task": task,
        "model": next((m for m in state.models.values() if m), None),
        "metrics": metrics,
        "num_instances": len({k[1] for k in state.done} | {k[1] for k in failed}),
        "num_items": len(state.done) + len(failed),
        "num_failed": len(failed),
        "failed": sorted(f"{iid}[s{s}-r{r}]" for (s, iid, r) in failed),
    }
    return doc, scores


def finalize(
    directory: Path,
    task: str,
    state: JournalState,
    instance_order: Sequence[str],
    num_samples: int,
) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """Rewrite a task's files from its journal in canonical order; return the
    metrics doc and each instance's scores (see `metrics_doc`)."""
    order = {iid: i for i, iid in enumerate(instance_order)}
    grouped: dict[tuple[int, str], list[RolloutResult]] = {}
    for result in state.done.values():
        grouped.setdefault((result.stage, result.instance_id), []).append(result)
    keys = sorted(grouped, key=lambda k: (order.get(k[1], len(order)), k[1], k[0]))
    doc, scores = metrics_doc(task, state)
    requests = [state.requests[k] for k in keys if k in state.requests]
    predictions = [prediction_row(k[1], k[0], grouped[k], num_samples, doc["model"]) for k in keys]
    files = task_files(directory, task)
    directory.mkdir(parents=True, exist_ok=True)
    with _lock(directory):
        _atomic_write(files["requests"], _jsonl(requests))
        _atomic_write(files["predictions"], _jsonl(predictions))
        _atomic_write(files["metrics"], orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return doc, scores


def write_manifest(
    directory: Path, model: str | None, provider: Mapping[str, Any], tasks: Iterable[str]
) -> None:
    """Merge this run's tasks into manifest.json (xdist workers each add theirs)."""
    path = directory / "manifest.json"
    directory.mkdir(parents=True, exist_ok=True)
    with _lock(directory):
        try:
            doc = orjson.loads(path.read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            doc = {}
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            doc = {}
        known = doc.get("tasks") if isinstance(doc.get("tasks"), list) else []
        merged = sorted(set(known) | set(tasks))
        doc.update({"format": FORMAT, "model": model, "provider": dict(provider), "tasks": merged})
        _atomic_write(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2))


def check_output_dir(directory: Path) -> None:
    """An output dir must be a directory we can write, or not exist yet."""
    if directory.exists() and not directory.is_dir():
        raise EvalReplayError(f"--evalreplay-output {directory} exists and is not a directory")
