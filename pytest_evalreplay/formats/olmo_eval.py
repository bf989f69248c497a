"""olmo-eval (and oe-eval / OLMES) predictions, read as they are.

olmo-eval writes a results dir per run:

    <out>/predictions/<model>/<spec>-predictions.jsonl
    <out>/requests/<model>/<spec>-requests.jsonl

A requests row is `{"request_type", "doc", "request": {"context",
"system_prompt"?, "tools"?, "generation_kwargs", "stop_sequences", ...},
"idx", "task_name", "doc_id", "native_id", "label"}`; `request.context` is the
full prompt (a string, or chat messages) and `request_type` is
`generate_until` for generation (`loglikelihood` and the other kinds are
skipped). A predictions row is `{"doc_id", "native_id", "model_output":
[{"text", ...} per sample], "instance_metrics", "label", ...}`; oe-eval names
the text `continuation`. The two files join on `doc_id`. oe-eval's flat
layout (`task-000-<name>-predictions.jsonl` beside `...-requests.jsonl`) is
the same pair of files without the model folders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.formats import (
    IndexBuilder,
    SavedRow,
    bad_row,
    first_row,
    parse_lines,
)
from pytest_evalreplay.model import EvalReplayError, Generation, PromptKey, prompt_key

PREDICTIONS_SUFFIX = "-predictions.jsonl"
REQUESTS_SUFFIX = "-requests.jsonl"
LAYOUT = "olmo-eval"
GENERATE_TYPES = frozenset({"generate_until"})


def is_results_dir(path: Path) -> bool:
    return (path / "predictions").is_dir() and (path / "requests").is_dir()


def is_model_dir(path: Path) -> bool:
    """`<out>/predictions/<model>` passed directly."""
    return path.parent.name == "predictions" and (path.parent.parent / "requests" / path.name).is_dir()


def is_olmo_predictions(path: Path) -> bool:
    """A `*-predictions.jsonl` in olmo-eval's tree, or with oe-eval's rows."""
    if path.parent.parent.name == "predictions" and _requests_for(path).is_file():
        return True
    row = first_row(path)
    return isinstance(row, dict) and "model_output" in row and "instance_id" not in row


def _requests_for(path: Path) -> Path:
    name = path.name[: -len(PREDICTIONS_SUFFIX)] + REQUESTS_SUFFIX
    if path.parent.parent.name == "predictions":
        tree = path.parent.parent.parent / "requests" / path.parent.name / name
        if tree.is_file():
            return tree
    return path.with_name(name)


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob(f"*{PREDICTIONS_SUFFIX}") if p.is_file())


def load_results_dir(builder: IndexBuilder, root: Path) -> None:
    models = sorted(p for p in (root / "predictions").iterdir() if p.is_dir())
    files = [f for m in models for f in _files(m)]
    if not files:
        raise EvalReplayError(
            f"{root}: an olmo-eval results dir with no predictions/<model>/*{PREDICTIONS_SUFFIX} files"
        )
    for model in models:  # note every model first: several are refused before any parsing
        for f in _files(model):
            builder.note_model(model.name, f)
    builder.check_one_model()
    for f in files:
        load_file(builder, f)


def load_dir(builder: IndexBuilder, directory: Path) -> None:
    """`<out>/predictions/<model>/`, or oe-eval's flat output dir."""
    for f in _files(directory):
        load_file(builder, f)


def load_file(builder: IndexBuilder, path: Path) -> None:
    requests_path = _requests_for(path)
    if not requests_path.is_file():
        raise EvalReplayError(
            f"{path}: no {requests_path} for it; replay needs olmo-eval's requests file "
            "to know which prompt each saved row answered"
        )
    in_tree = path.parent.parent.name == "predictions"
    if in_tree:
        builder.note_model(path.parent.name, path)
    prompts = _read_prompts(requests_path)
    task = path.name[: -len(PREDICTIONS_SUFFIX)]
    linenos: list[int] = []
    builder.add_file(path, task, LAYOUT, decode, linenos)
    blobs = builder.blobs
    setdefault = builder.keys.setdefault
    for lineno, line, row in parse_lines(path):
        if not isinstance(row, dict) or "doc_id" not in row or "model_output" not in row:
            raise bad_row(path, lineno, "an olmo-eval predictions row has 'doc_id' and 'model_output'")
        doc_id = row["doc_id"]
        try:
            keys = prompts[doc_id]
        except (KeyError, TypeError):
            raise EvalReplayError(
                f"{path}:{lineno}: doc_id {doc_id!r} has no generate row in {requests_path}, "
                "so its prompt is unknown; restore the requests file of that run"
            ) from None
        if keys is None:
            builder.skipped += 1
            continue
        pos = len(blobs)
        blobs.append(line)
        linenos.append(lineno)
        prev = setdefault(keys, pos)
        if prev is not pos:
            builder.collide(keys, prev, pos)


def _read_prompts(path: Path) -> dict[Any, PromptKey | None]:
    """doc_id -> prompt key (None: a kind replay skips). oe-eval writes one
    loglikelihood row per answer choice, so a doc_id may repeat."""
    prompts: dict[Any, PromptKey | None] = {}
    for lineno, _, row in parse_lines(path):
        try:
            doc_id = row["doc_id"]
            request = row["request"]
            key: PromptKey | None = None
            if row.get("request_type") in GENERATE_TYPES and not request.get("tools"):
                key = prompt_key(request["context"], request.get("system_prompt"))
            prev = prompts.setdefault(doc_id, key)
        except (KeyError, TypeError, AttributeError):
            raise bad_row(
                path,
                lineno,
                "an olmo-eval requests row has 'doc_id', 'request_type' and 'request': {'context', ...}",
            ) from None
        if prev != key:
            raise EvalReplayError(
                f"{path}:{lineno}: doc_id {doc_id!r} appears again with a different prompt "
                "or request type; replay needs one generate prompt per doc_id"
            )
    return prompts


def decode(blob: bytes, where: str, file: Path) -> SavedRow:
    try:
        row = orjson.loads(blob)
        outputs = row["model_output"]
        iid = row.get("native_id")
        if iid is None:
            iid = row["doc_id"]
        gens = tuple(_generation(out, where) for out in outputs)
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise EvalReplayError(f"{where}: unreadable olmo-eval predictions row ({exc})") from None
    return SavedRow(
        instance_id=str(iid),
        stage=1,
        rollouts=tuple(range(len(gens))),
        generations=gens,
        where=where,
        file=file,
    )


def _generation(out: Any, where: str) -> Generation:
    text = out.get("text")
    if text is None:
        text = out.get("continuation")
    if not isinstance(text, str):
        raise EvalReplayError(f"{where}: a model_output entry has no string 'text' (or 'continuation')")
    original = out.get("original_text")
    num_tokens = out.get("num_tokens")
    return Generation(
        text=text,
        original_text=original if isinstance(original, str) else None,
        finish_reason=out.get("finish_reason"),
        completion_tokens=num_tokens if type(num_tokens) is int else None,
    )


def instances(path: str | Path) -> list[dict[str, Any]]:
    """A task's instances from an olmo-eval requests file: `{"id": doc_id,
    "prompt": request.context, "system_prompt", "target": label, "native_id",
    "doc"}` per generate request, so that `EvalTask(..., prompt=lambda i:
    i["prompt"], system_prompt=...)` renders the prompts olmo-eval sent."""
    path = Path(path)
    found: dict[Any, dict[str, Any]] = {}
    for lineno, _, row in parse_lines(path):
        try:
            if row["doc_id"] in found or row.get("request_type") not in GENERATE_TYPES:
                continue
            found[row["doc_id"]] = {
                "id": str(row["doc_id"]),
                "prompt": row["request"]["context"],
                "system_prompt": row["request"].get("system_prompt"),
                "target": row.get("label"),
                "native_id": row.get("native_id"),
                "doc": row.get("doc"),
            }
        except (KeyError, TypeError, AttributeError):
            raise bad_row(path, lineno, "an olmo-eval requests row has 'doc_id' and 'request'") from None
    return list(found.values())
