"""The baseline file that gates compare against (`--evalreplay-baseline`).

`{"format": "evalreplay-baseline/1", "tasks": {task: {"metrics": {name: value},
"metric": name, "scores": {instance_id: score}}}}`: per task its metrics and,
for one metric (the gated one), each instance's score, so a later run can be
compared instance by instance. Written with `--evalreplay-update-baseline`,
merged under a file lock so xdist workers each add their tasks.

Reading checks every field whatever the gates ask for, so a hand-edited or
truncated baseline is one message naming the file and the field (e.g.
`tasks.qa.metrics.exact_match`), never a traceback in the middle of a gate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from filelock import FileLock

from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.numbers.gates import BaselineTask
from pytest_evalreplay.storage.files import atomic_write, os_error
from pytest_evalreplay.storage.rowfields import type_name

FORMAT = "evalreplay-baseline/1"
REWRITE = "fix it, or write it again with --evalreplay-update-baseline"


def _bad(path: Path, field: str, expected: str, value: Any) -> EvalReplayError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    got = "null" if value is None else f"{type_name(value)} ({shown})"
    return EvalReplayError(f"{path}: {field}: expected {expected}, got {got}; {REWRITE}")


def _number(value: Any, path: Path, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(path, field, "a number", value)
    return float(value)


def _object(value: Any, path: Path, field: str, expected: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(path, field, expected, value)
    return value


def parse(doc: Any, path: Path) -> dict[str, BaselineTask]:
    """A baseline document's tasks; `path` names it in errors."""
    if not isinstance(doc, dict):
        raise EvalReplayError(
            f'{path}: not an {FORMAT} baseline (a JSON object with "format": "{FORMAT}" and '
            f'"tasks"), got {type_name(doc)}; write one with --evalreplay-update-baseline'
        )
    fmt = doc.get("format")
    if fmt != FORMAT:
        if isinstance(fmt, str) and fmt.startswith("evalreplay-baseline/"):
            raise EvalReplayError(
                f"{path}: baseline format {fmt!r}, and this version of pytest-evalreplay reads {FORMAT!r}; "
                "write it again with --evalreplay-update-baseline, or use the version that wrote it"
            )
        raise EvalReplayError(
            f'{path}: not an {FORMAT} baseline ("format" is {type_name(fmt)} {fmt!r:.40}, '
            f'expected "{FORMAT}"); write one with --evalreplay-update-baseline'
        )
    tasks_doc = _object(doc.get("tasks"), path, "tasks", "an object of task name -> entry")
    tasks: dict[str, BaselineTask] = {}
    for name, entry in tasks_doc.items():
        field = f"tasks.{name}"
        entry = _object(entry, path, field, 'an object with "metrics"')
        metrics = entry.get("metrics")
        if not isinstance(metrics, dict):
            raise EvalReplayError(
                f'{path}: {field}.metrics: a task entry needs a "metrics" object (metric name -> number), '
                f"got {type_name(metrics)}; {REWRITE}"
            )
        scores = entry.get("scores")
        scores = {} if scores is None else scores
        scores = _object(scores, path, f"{field}.scores", "an object of instance id -> score")
        metric = entry.get("metric")
        if metric is not None and not isinstance(metric, str):
            raise _bad(path, f"{field}.metric", "a metric name or null", metric)
        elo = entry.get("elo")
        if elo is not None and not isinstance(elo, dict):
            raise _bad(path, f"{field}.elo", "the elo block of an EloEval (an object)", elo)
        source = entry.get("source")
        if source is not None and not isinstance(source, dict):
            raise _bad(path, f"{field}.source", "an object (model, run, date, commit)", source)
        tasks[name] = BaselineTask(
            metrics={k: _number(v, path, f"{field}.metrics.{k}") for k, v in metrics.items()},
            scores={k: _number(v, path, f"{field}.scores.{k}") for k, v in scores.items()},
            metric=metric,
            elo=elo,
            source=source,
        )
    return tasks


def read(path: Path) -> dict[str, BaselineTask]:
    """The baseline's tasks; a missing file is an empty baseline."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise os_error(path, exc, "read the baseline") from None
    try:
        doc = orjson.loads(data.removeprefix(b"\xef\xbb\xbf"))
    except orjson.JSONDecodeError as exc:
        raise EvalReplayError(f"{path}: malformed JSON ({exc}); {REWRITE}") from None
    return parse(doc, path)


def update(path: Path, entries: Mapping[str, BaselineTask]) -> None:
    """Merge `entries` into the baseline file (atomically, under a lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.with_name(f".{path.name}.lock"))):
        tasks = read(path)
        tasks.update(entries)
        for name, task in entries.items():
            for key, value in (*task.metrics.items(), *task.scores.items()):
                if not math.isfinite(value):
                    raise EvalReplayError(
                        f"{path}: cannot write task {name!r} to the baseline: {key!r} is {value!r}, "
                        "and a baseline holds finite numbers only"
                    )
        doc = {
            "format": FORMAT,
            "tasks": {
                name: {"metrics": dict(t.metrics), "metric": t.metric, "scores": dict(t.scores)}
                | ({"elo": dict(t.elo)} if t.elo else {})
                | ({"source": dict(t.source)} if t.source else {})
                for name, t in sorted(tasks.items())
            },
        }
        atomic_write(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
