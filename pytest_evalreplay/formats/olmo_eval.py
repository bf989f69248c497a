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
the text `continuation`. A sample's `prompt_tokens` and `num_tokens` are its
token counts, and every other field it has is kept in the metadata. The
two files join on `doc_id`. oe-eval's flat layout
(`task-000-<name>-predictions.jsonl` beside `...-requests.jsonl`) is the same
pair of files without the model folders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.formats.saved import (
    IndexBuilder,
    IndexKey,
    SavedRow,
    bad_field,
    bad_row,
    first_row,
    index_key,
    list_dir,
    malformed_at,
    not_an_object,
    only_files,
    parse_lines,
    require_file,
    token_count,
)
from pytest_evalreplay.model import EvalReplayError, Generation, show

PREDICTIONS_SUFFIX = "-predictions.jsonl"
REQUESTS_SUFFIX = "-requests.jsonl"
LAYOUT = "olmo-eval"
GENERATE_TYPES = frozenset({"generate_until"})
# A sample's fields that become a Generation's own; every other field of it
# (a Harmony decode, a parser error, a context-cut marker, an extracted
# answer...) is kept whole in the Generation's metadata.
SAMPLE_FIELDS = frozenset(
    {"text", "continuation", "original_text", "finish_reason", "num_tokens", "prompt_tokens"}
)


def is_results_dir(path: Path) -> bool:
    """`<out>/` of olmo-eval: a `predictions/` folder (and no run dir files of ours)."""
    return (path / "predictions").is_dir() and not any(path.glob(f"*{PREDICTIONS_SUFFIX}"))


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
    return only_files(list_dir(directory, f"*{PREDICTIONS_SUFFIX}"), "a predictions file")


def load_results_dir(builder: IndexBuilder, root: Path) -> None:
    if not (root / "requests").is_dir():
        raise EvalReplayError(
            f"{root}: an olmo-eval results dir with predictions/ but no requests/ beside it; replay "
            "needs requests/<model>/*-requests.jsonl to know which prompt each saved row answered "
            "(copy it along with the predictions)"
        )
    models = [p for p in list_dir(root / "predictions", "*") if p.is_dir()]
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
    require_file(
        requests_path,
        f"{path}: no {requests_path} for it; replay needs olmo-eval's requests file "
        "to know which prompt each saved row answered (copy it along with the predictions)",
    )
    if path.parent.parent.name == "predictions":
        builder.note_model(path.parent.name, path)
    prompts = _read_prompts(requests_path)
    task = path.name[: -len(PREDICTIONS_SUFFIX)]
    linenos: list[int] = []
    saved = builder.add_file(path, task, LAYOUT, decode, linenos)
    blobs = saved.lines
    for lineno, line, row in parse_lines(path):
        where = f"{path}:{lineno}"
        if type(row) is not dict:
            raise not_an_object(where, "an olmo-eval predictions row", row)
        if "doc_id" not in row or "model_output" not in row:
            raise bad_row(path, lineno, "an olmo-eval predictions row needs 'doc_id' and 'model_output'")
        doc_id = _doc_id(row["doc_id"], where)
        if type(row["model_output"]) is not list:
            raise bad_field(where, "model_output", "a list (one entry per sample)", row["model_output"])
        if doc_id not in prompts:
            raise EvalReplayError(
                f"{where}: doc_id {show(doc_id)} has no generate row in {requests_path}, "
                "so its prompt is unknown; restore the requests file of that run"
            )
        key = prompts[doc_id]
        if key is None:
            builder.skipped += 1
            continue
        pos = saved.start + len(blobs)
        blobs.append(line)
        linenos.append(lineno)
        builder.insert(key, pos)


def _doc_id(value: Any, where: str) -> int | str:
    if type(value) is int or type(value) is str:
        return value
    raise bad_field(where, "doc_id", "an integer or a string", value)


def _read_prompts(path: Path) -> dict[int | str, IndexKey | None]:
    """doc_id -> prompt key (None: a kind replay skips). oe-eval writes one
    loglikelihood row per answer choice, so a doc_id may repeat."""
    prompts: dict[int | str, IndexKey | None] = {}
    for lineno, _, row in parse_lines(path):
        where = f"{path}:{lineno}"
        if type(row) is not dict:
            raise not_an_object(where, "an olmo-eval requests row", row)
        if "doc_id" not in row or "request" not in row:
            raise bad_row(
                path, lineno, "an olmo-eval requests row needs 'doc_id', 'request_type' and 'request'"
            )
        doc_id = _doc_id(row["doc_id"], where)
        request = row["request"]
        if type(request) is not dict:
            raise not_an_object(where, "'request'", request)
        kind = row.get("request_type")
        if type(kind) is not str:
            raise bad_field(where, "request_type", "a string such as 'generate_until'", kind)
        key: IndexKey | None = None
        if kind in GENERATE_TYPES and not request.get("tools"):
            context = request.get("context")
            if type(context) is not str and type(context) is not list:
                raise bad_field(where, "request.context", "a string or a list of chat messages", context)
            system = request.get("system_prompt")
            if system is not None and type(system) is not str:
                raise bad_field(where, "request.system_prompt", "a string or null", system)
            try:
                key = index_key(context, system)
            except TypeError as exc:
                raise bad_field(
                    where, "request.context", f"JSON orjson can encode ({exc})", context
                ) from None
        prev = prompts.setdefault(doc_id, key)
        if prev != key:
            raise EvalReplayError(
                f"{where}: doc_id {show(doc_id)} appears again with a different prompt "
                "or request type; replay needs one generate prompt per doc_id"
            )
    return prompts


def decode(blob: bytes, where: str, file: Path) -> SavedRow:
    try:
        row = orjson.loads(blob)
    except orjson.JSONDecodeError as exc:
        raise malformed_at(where, exc) from None
    if type(row) is not dict:
        raise not_an_object(where, "an olmo-eval predictions row", row)
    outputs = row.get("model_output")
    if type(outputs) is not list:
        raise bad_field(where, "model_output", "a list (one entry per sample)", outputs)
    iid = row.get("native_id")
    if iid is None:
        iid = _doc_id(row.get("doc_id"), where)
    elif type(iid) is not str and type(iid) is not int:
        raise bad_field(where, "native_id", "a string, an integer or null", iid)
    gens = tuple(_generation(out, where, i) for i, out in enumerate(outputs))
    return SavedRow(
        instance_id=str(iid),
        stage=1,
        rollouts=tuple(range(len(gens))),
        generations=gens,
        where=where,
        file=file,
    )


def _generation(out: Any, where: str, index: int) -> Generation:
    name = f"model_output[{index}]"
    if type(out) is not dict:
        raise not_an_object(where, name, out)
    text = out.get("text")
    if text is None:
        text = out.get("continuation")
    if type(text) is not str:
        raise bad_field(where, f"{name}.text", "a string (or 'continuation', oe-eval's name)", text)
    original = out.get("original_text")
    if original is not None and type(original) is not str:
        raise bad_field(where, f"{name}.original_text", "a string or null", original)
    finish = out.get("finish_reason")
    if finish is not None and type(finish) is not str:
        raise bad_field(where, f"{name}.finish_reason", "a string or null", finish)
    return Generation(
        text=text,
        original_text=original,
        finish_reason=finish,
        prompt_tokens=token_count(out.get("prompt_tokens"), where, f"{name}.prompt_tokens"),
        completion_tokens=token_count(out.get("num_tokens"), where, f"{name}.num_tokens"),
        metadata={k: v for k, v in out.items() if k not in SAMPLE_FIELDS},
    )


def instances(path: str | Path) -> list[dict[str, Any]]:
    """A task's instances from an olmo-eval requests file: `{"id": doc_id,
    "prompt": request.context, "system_prompt", "target": label, "native_id",
    "doc"}` per generate request, so that `EvalTask(..., prompt=lambda i:
    i["prompt"], system_prompt=...)` renders the prompts olmo-eval sent."""
    path = Path(path)
    found: dict[int | str, dict[str, Any]] = {}
    skipped = 0
    for lineno, _, row in parse_lines(path):
        where = f"{path}:{lineno}"
        if type(row) is not dict:
            raise not_an_object(where, "an olmo-eval requests row", row)
        if "doc_id" not in row or "request" not in row:
            raise bad_row(path, lineno, "an olmo-eval requests row needs 'doc_id' and 'request'")
        doc_id = _doc_id(row["doc_id"], where)
        kind = row.get("request_type")
        if type(kind) is not str:
            raise bad_field(where, "request_type", "a string such as 'generate_until'", kind)
        if kind not in GENERATE_TYPES:
            skipped += 1
            continue
        if doc_id in found:
            continue
        request = row["request"]
        if type(request) is not dict:
            raise not_an_object(where, "'request'", request)
        context = request.get("context")
        if type(context) is not str and type(context) is not list:
            raise bad_field(where, "request.context", "a string or a list of chat messages", context)
        system = request.get("system_prompt")
        if system is not None and type(system) is not str:
            raise bad_field(where, "request.system_prompt", "a string or null", system)
        found[doc_id] = {
            "id": str(doc_id),
            "prompt": context,
            "system_prompt": system,
            "target": row.get("label"),
            "native_id": row.get("native_id"),
            "doc": row.get("doc"),
        }
    if not found:
        raise EvalReplayError(
            f"{path}: no generate_until requests in this file ({skipped} rows of other kinds); "
            "olmo_eval.instances reads the requests of a generation task"
        )
    return list(found.values())
