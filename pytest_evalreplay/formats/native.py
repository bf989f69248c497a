"""Our own run dir: `<task>-predictions.jsonl` joined to `<task>-requests.jsonl`.

A predictions row says which instance (and stage) it answers; the requests row
of that instance, in the requests file of the same task, says the prompt. The
plugin writes both files in the same order (batch by batch while running, in
instance order once finished), so rows are joined in step, and by
(stage, instance_id) where the order differs. Other files of a run dir
(manifest, metrics, failures, journal) play no part in replay, except the
manifest's model as a fallback name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.formats import (
    IndexBuilder,
    SavedRow,
    bad_row,
    malformed,
    parse_lines,
    read_lines,
)
from pytest_evalreplay.model import EvalReplayError, Generation, PromptKey, prompt_key

PREDICTIONS_SUFFIX = "-predictions.jsonl"
REQUESTS_SUFFIX = "-requests.jsonl"
LAYOUT = "evalreplay"
LOOK_AHEAD = 8  # requests rows skipped in step (instances that failed) before joining by id

# (stage, instance) is keyed by the bare instance id for stage 1 (most rows).
JoinKey = Any
_AMBIGUOUS = b""  # a join key with two different prompts in the requests file


def prediction_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob(f"*{PREDICTIONS_SUFFIX}") if p.is_file())


def load_dir(builder: IndexBuilder, directory: Path) -> None:
    manifest = directory / "manifest.json"
    if manifest.is_file():
        try:
            doc = orjson.loads(manifest.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("model"), str):
            builder.fallback_model = doc["model"]
    for path in prediction_files(directory):
        load_file(builder, path)


def load_file(builder: IndexBuilder, path: Path) -> None:
    task = path.name[: -len(PREDICTIONS_SUFFIX)]
    requests_path = path.with_name(task + REQUESTS_SUFFIX)
    if not requests_path.is_file():
        raise EvalReplayError(
            f"{path}: no {requests_path.name} beside it; replay needs the requests file "
            "to know which prompt each saved row answered (copy it along with the predictions)"
        )
    joins, prompts = read_requests(requests_path)
    lines = read_lines(path)
    base = builder.add_file(path, task, LAYOUT, decode).start
    builder.blobs.extend(lines)  # every line, so a line number is position - base + 1
    n = len(joins)
    i = 0  # the requests row expected next
    table: dict[JoinKey, PromptKey | None] | None = None
    setdefault = builder.keys.setdefault
    loads = orjson.loads
    model: Any = None
    skipped = 0
    for pos, line in enumerate(lines, base):
        try:
            row = loads(line)
        except orjson.JSONDecodeError as exc:
            if line.strip():
                raise malformed(path, pos - base + 1, exc) from None
            continue
        try:
            iid = row["instance_id"]
            stage = row.get("stage", 1)
            row_model = row.get("model")
            gens = row["generations"]
            k = iid if stage == 1 else (stage, iid)
            if i < n and joins[i] == k:
                key = prompts[i]
                i += 1
            else:
                j = _find(joins, k, i, min(n, i + LOOK_AHEAD))
                if j >= 0:
                    key = prompts[j]
                    i = j + 1
                else:
                    if table is None:
                        table = _table(joins, prompts)
                    key = table[k]
                    if key is _AMBIGUOUS:
                        raise EvalReplayError(
                            f"{requests_path}: instance {iid!r} (stage {stage}) appears with "
                            f"different prompts, and {path}:{pos - base + 1} cannot be matched "
                            "to one of them by order; was the file edited or concatenated?"
                        )
        except KeyError:
            lineno = pos - base + 1
            if isinstance(row, dict) and "instance_id" in row and "generations" in row:
                raise EvalReplayError(
                    f"{path}:{lineno}: predictions row for instance {row['instance_id']!r} "
                    f"(stage {row.get('stage', 1)}) has no row in {requests_path.name}, so its "
                    "prompt is unknown; restore the requests file the run wrote, or delete the row"
                ) from None
            raise bad_row(path, lineno, "a predictions row needs 'instance_id' and 'generations'") from None
        except (TypeError, AttributeError):
            raise bad_row(
                path, pos - base + 1, "a predictions row is an object with a string 'instance_id'"
            ) from None
        if type(gens) is not list:
            raise bad_row(path, pos - base + 1, "'generations' must be a list")
        if row_model != model:
            builder.note_model(row_model, path)
            model = row_model
        if key is None:
            skipped += 1
            continue
        prev = setdefault(key, pos)
        if prev is not pos:
            builder.collide(key, prev, pos)
    builder.skipped += skipped


def read_requests(path: Path) -> tuple[list[JoinKey], list[PromptKey | None]]:
    """Each requests row's join key and prompt key, in file order; the prompt
    key is None for rows replay skips (loglikelihood, images, tools)."""
    joins: list[JoinKey] = []
    prompts: list[PromptKey | None] = []
    add_join, add_prompt = joins.append, prompts.append
    key_of = prompt_key
    for lineno, _, row in parse_lines(path):
        try:
            iid = row["instance_id"]
            stage = row.get("stage", 1)
            if row["request_type"] == "generate" and (
                ("images" not in row or not row["images"]) and ("tools" not in row or not row["tools"])
            ):
                add_prompt(key_of(row["context"], row.get("system_prompt")))
            else:
                add_prompt(None)
        except (KeyError, TypeError, AttributeError):
            raise bad_row(
                path,
                lineno,
                "a requests row is an object with 'instance_id', 'request_type', 'context' "
                "and a string or null 'system_prompt'",
            ) from None
        add_join(iid if stage == 1 else (stage, iid))
    return joins, prompts


def _find(joins: list[JoinKey], k: JoinKey, start: int, stop: int) -> int:
    for j in range(start, stop):
        if joins[j] == k:
            return j
    return -1


def _table(joins: list[JoinKey], prompts: list[PromptKey | None]) -> dict[JoinKey, PromptKey | None]:
    """Join key -> prompt key for rows that cannot be joined in step."""
    table: dict[JoinKey, PromptKey | None] = {}
    for k, key in zip(joins, prompts, strict=True):
        prev = table.setdefault(k, key)
        if prev != key:
            table[k] = _AMBIGUOUS
    return table


def decode(blob: bytes, where: str, file: Path) -> SavedRow:
    try:
        row = orjson.loads(blob)
        iid = row["instance_id"]
        gens = [Generation.from_row(g, where) for g in row["generations"]]
        rollouts = row.get("rollouts")
        stage = row.get("stage", 1)
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise EvalReplayError(f"{where}: unreadable predictions row ({exc})") from None
    if rollouts is None:
        rollouts = list(range(len(gens)))
    if (
        not isinstance(rollouts, list)
        or len(rollouts) != len(gens)
        or not all(type(r) is int and r >= 0 for r in rollouts)
    ):
        raise EvalReplayError(
            f"{where}: 'rollouts' must list one sample index per generation "
            f"({len(gens)} generations, rollouts {rollouts!r})"
        )
    return SavedRow(
        instance_id=str(iid),
        stage=stage if type(stage) is int else 1,
        rollouts=tuple(rollouts),
        generations=tuple(gens),
        where=where,
        file=file,
    )
