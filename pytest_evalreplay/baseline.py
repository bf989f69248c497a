"""The baseline file that gates compare against (`--evalreplay-baseline`).

`{"format": "evalreplay-baseline/1", "tasks": {task: {"metrics": {name: value},
"metric": name, "scores": {instance_id: score}}}}`: per task its metrics and,
for one metric (the gated one), each instance's score, so a later run can be
compared instance by instance. Written with `--evalreplay-update-baseline`,
merged under a file lock so xdist workers each add their tasks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from filelock import FileLock

from pytest_evalreplay.gates import BaselineTask
from pytest_evalreplay.model import EvalReplayError

FORMAT = "evalreplay-baseline/1"


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EvalReplayError(f"{where}: expected a number, got {value!r}")
    return float(value)


def _parse(doc: Any, path: Path) -> dict[str, BaselineTask]:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("tasks"), dict):
        raise EvalReplayError(
            f'{path}: not an {FORMAT} baseline (a JSON object with "format": "{FORMAT}" and '
            '"tasks"); write one with --evalreplay-update-baseline'
        )
    tasks: dict[str, BaselineTask] = {}
    for name, entry in doc["tasks"].items():
        where = f"{path}: tasks.{name}"
        if not isinstance(entry, dict) or not isinstance(entry.get("metrics"), dict):
            raise EvalReplayError(f'{where}: needs a "metrics" object')
        scores = entry.get("scores") or {}
        if not isinstance(scores, dict):
            raise EvalReplayError(f"{where}.scores: expected an object of instance id -> score")
        metric = entry.get("metric")
        if metric is not None and not isinstance(metric, str):
            raise EvalReplayError(f"{where}.metric: expected a metric name")
        elo = entry.get("elo")
        if elo is not None and not isinstance(elo, dict):
            raise EvalReplayError(f"{where}.elo: expected the elo block of an EloEval (an object)")
        tasks[name] = BaselineTask(
            metrics={k: _number(v, f"{where}.metrics.{k}") for k, v in entry["metrics"].items()},
            scores={str(k): _number(v, f"{where}.scores.{k}") for k, v in scores.items()},
            metric=metric,
            elo=elo,
        )
    return tasks


def read(path: Path) -> dict[str, BaselineTask]:
    """The baseline's tasks; a missing file is an empty baseline."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise EvalReplayError(f"{path}: malformed JSON ({exc}); fix it or write it again") from None
    return _parse(doc, path)


def update(path: Path, entries: Mapping[str, BaselineTask]) -> None:
    """Merge `entries` into the baseline file (atomically, under a lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.with_name(f".{path.name}.lock"))):
        tasks = read(path)
        tasks.update(entries)
        doc = {
            "format": FORMAT,
            "tasks": {
                name: {"metrics": dict(t.metrics), "metric": t.metric, "scores": dict(t.scores)}
                | ({"elo": dict(t.elo)} if t.elo else {})
                for name, t in sorted(tasks.items())
            },
        }
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        os.replace(tmp, path)
