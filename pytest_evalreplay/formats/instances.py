"""A task's instances: from an iterable of dicts or a JSONL file.

Each instance id becomes part of a pytest node id (`test_evals.py::qa::q7[s1-r0]`)
and of run dir rows, so ids are checked here once: strings (integers are
read as their decimal string), unique, and free of what a node id cannot
hold. A file that holds no instance is an error rather than a task that
silently runs nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pytest_evalreplay.model import EvalReplayError, Instance
from pytest_evalreplay.storage.files import read_bytes
from pytest_evalreplay.storage.lines import jsonl_lines
from pytest_evalreplay.storage.rowfields import show, type_name

# What a pytest node id cannot hold: "::" separates its parts, "[...]" holds
# the parameters, and control characters break terminals and JUnit XML.
_FORBIDDEN = ("::", "[", "]")


def load_instances(
    source: Iterable[Mapping[str, Any]] | str | os.PathLike[str], base: Path
) -> list[Instance]:
    """Instances from an iterable of dicts or a JSONL file (relative to `base`).

    Ids are strings, unique, and safe inside a pytest node id. Every problem
    is an EvalReplayError naming the file and line (or the iterable's index).
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_absolute():
            path = base / path
        if path.is_dir():
            raise EvalReplayError(
                f"{path}: cannot read instances from a directory; "
                "EvalTask(instances=...) must name a .jsonl file"
            )
        data = read_bytes(path)
        rows: list[tuple[str, Any]] = []
        for lineno, line, row in jsonl_lines(path, data):
            where = f"{path}:{lineno}"
            _refuse_duplicate_keys(line, row, where)
            rows.append((where, row))
        if not rows:
            what = "empty" if not data.strip() else "only blank lines"
            raise EvalReplayError(
                f"{path}: no instances (the file is {what}); write one JSON object with an 'id' per line"
            )
    elif isinstance(source, Mapping) or not isinstance(source, Iterable):
        raise EvalReplayError(
            f"instances must be a path to a .jsonl file or an iterable of dicts, got {type(source).__name__}"
        )
    else:
        rows = [(f"instance #{i}", row) for i, row in enumerate(source)]
    instances: list[Instance] = []
    seen: dict[str, str] = {}
    for where, row in rows:
        if not isinstance(row, Mapping):
            raise EvalReplayError(
                f"{where}: an instance must be a JSON object with an 'id', got {type_name(row)}; "
                "fix or delete that line"
            )
        iid = _instance_id(row.get("id"), where)
        if iid in seen:
            raise EvalReplayError(
                f"{where}: duplicate instance id {show(iid)} (first at {seen[iid]}); "
                "give each instance its own id"
            )
        seen[iid] = where
        instances.append({**row, "id": iid})
    return instances


def _refuse_duplicate_keys(line: bytes, row: Any, where: str) -> None:
    """A JSON reader keeps the last of two equal keys in one object, so the
    first value would be dropped without a word: refuse the line, naming the
    key. Every key is followed by a colon, so a line with no more colons than
    the row has keys has no duplicate (the common case, checked without a
    second parse); only a line with colons to spare is parsed again, slowly."""
    if line.count(b":") == _key_count(row):
        return

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                raise EvalReplayError(
                    f"{where}: key {show(key)} appears twice in one object (only the last would be "
                    "read, the first dropped without a word); keep one of them"
                )
            seen.add(key)
        return dict(items)

    try:
        json.loads(line, object_pairs_hook=pairs)
    except RecursionError:  # orjson reads 1024 levels, the json module fewer
        raise EvalReplayError(
            f"{where}: nested too deeply to check for duplicate keys; flatten that line"
        ) from None


def _key_count(value: Any) -> int:
    """The keys of every object in a row (iterative: rows nest up to 1024 levels)."""
    count, todo = 0, [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            count += len(item)
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return count


def _instance_id(iid: Any, where: str) -> str:
    if isinstance(iid, int) and not isinstance(iid, bool):
        return str(iid)
    if not isinstance(iid, str) or not iid.strip():
        shown = "missing" if iid is None else f"{type_name(iid)} {show(iid)}"
        raise EvalReplayError(
            f"{where}: an instance needs a non-empty string 'id' (or an integer one), and this one's is "
            f"{shown}; fix or delete that line"
        )
    controls = sorted({repr(c) for c in iid if ord(c) < 0x20 or ord(c) == 0x7F})
    bad = [repr(s) for s in _FORBIDDEN if s in iid] + controls
    if bad:
        raise EvalReplayError(
            f"{where}: instance id {show(iid)} may not contain {', '.join(bad)} (the id is part of the "
            "pytest node id, which cannot hold '::', '[', ']', newlines or other control characters); "
            "rename the instance, e.g. replace them with '_'"
        )
    try:
        iid.encode("utf-8")
    except UnicodeEncodeError:
        raise EvalReplayError(
            f"{where}: instance id {show(iid)} holds a lone surrogate (not valid Unicode text); rename it"
        ) from None
    return iid
