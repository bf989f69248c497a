"""olmo-eval (and oe-eval / OLMES) predictions, read as they are.

olmo-eval writes a results dir per run:

    <out>/predictions/<model>/<spec>-predictions.jsonl
    <out>/requests/<model>/<spec>-requests.jsonl

A requests row is `{"request_type", "doc", "request": {"context",
"system_prompt"?, "tools"?, "generation_kwargs", "stop_sequences", ...},
"idx", "task_name", "doc_id", "native_id", "label"}`; `request.context` is the
full prompt (a string, or chat messages). A predictions row is `{"doc_id",
"native_id", "model_output": [...], "instance_metrics" | "metrics", "label",
...}`. The two files join on `doc_id`. oe-eval's flat layout
(`task-000-<name>-predictions.jsonl` beside `...-requests.jsonl`) is the same
pair of files without the model folders.

Generation (`request_type` `generate_until`, no tools): `model_output` holds
one entry per sample, `{"text", ...}` (oe-eval names the text
`continuation`); its `prompt_tokens` and `num_tokens` are its token counts,
and every other field it has is kept in the metadata.

Loglikelihood (`request_type` `loglikelihood`: multiple choice, and the BPB
tasks, whose one continuation is the gold answer) is read as one
loglikelihood save per document, its continuations in order, and
`model_output` holds one entry per continuation, `{"sum_logits", "is_greedy",
"num_tokens", "num_tokens_all", "logits_per_token", "logits_per_char",
"bits_per_byte", "num_chars", ...}`. Two layouts say the continuations:

- olmo-eval: one requests row per document, `request.continuations` (the
  whole list; `request.continuation` is its first). A row with
  `request.continuation_prompts` (unconditional scoring for acc_uncond: the
  continuations twice, the second half against "Answer:") keeps the
  continuations scored against the row's own context, and their outputs.
- oe-eval / OLMES: one requests row per choice, `request.continuation`, the
  choice's position in `idx`; `model_output` is in `idx` order.

The save's generation has text "" and per continuation the pair
(`sum_logits`, `is_greedy`); `is_greedy` is false where an output lacks it.
`num_tokens` (per continuation) goes into the metadata. Every other metric
olmo-eval derives (`logits_per_char`, `bits_per_byte`, ...) is recomputed by
the replaying task's scorer from the log-likelihoods and the continuations.
`loglikelihood_rolling`, `generate_until_and_loglikelihood` and other kinds
are skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
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
from pytest_evalreplay.model import EvalReplayError, Generation
from pytest_evalreplay.storage.rowfields import optional_string, show

PREDICTIONS_SUFFIX = "-predictions.jsonl"
REQUESTS_SUFFIX = "-requests.jsonl"
LAYOUT = "olmo-eval"
GENERATE_TYPES = frozenset({"generate_until"})
LOGLIKELIHOOD = "loglikelihood"
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
        prompt = prompts[doc_id]
        if prompt.key is None:
            builder.skipped += 1
            continue
        if prompt.continuations is not None:
            if len(row["model_output"]) != len(prompt.continuations):
                raise EvalReplayError(
                    f"{where}: 'model_output' has {len(row['model_output'])} entries, but "
                    f"{requests_path} asks {len(prompt.continuations)} continuations of doc_id "
                    f"{show(doc_id)}; one entry per continuation is expected (restore the files of one run)"
                )
            # [continuations, kept positions, the row]: `decode` tells it by the "["
            line = orjson.dumps([list(prompt.continuations), list(prompt.keep)])[:-1] + b"," + line + b"]"
        pos = saved.start + len(blobs)
        blobs.append(line)
        linenos.append(lineno)
        builder.insert(prompt.key, pos)


def _doc_id(value: Any, where: str) -> int | str:
    if type(value) is int or type(value) is str:
        return value
    raise bad_field(where, "doc_id", "an integer or a string", value)


@dataclass
class _Prompt:
    """What a doc_id's requests rows say: its prompt key (None: a kind replay
    skips), and for a loglikelihood request its continuations (all of them, in
    `model_output` order) and the positions of those scored against the
    prompt itself (`keep`)."""

    key: IndexKey | None
    continuations: tuple[str, ...] | None = None
    keep: tuple[int, ...] = ()
    by_idx: dict[int, str] = field(default_factory=dict)  # oe-eval: one row per choice
    where: str = ""


def _read_prompts(path: Path) -> dict[int | str, _Prompt]:
    """doc_id -> its `_Prompt`. oe-eval writes one loglikelihood row per
    answer choice, so a doc_id may repeat (with the same prompt)."""
    prompts: dict[int | str, _Prompt] = {}
    for lineno, _, row in parse_lines(path):
        where = f"{path}:{lineno}"
        doc_id, kind, request = _request_row(row, path, lineno)
        key: IndexKey | None = None
        if (kind in GENERATE_TYPES and not request.get("tools")) or kind == LOGLIKELIHOOD:
            key = _key(request, where)
        prev = prompts.get(doc_id)
        if prev is not None and (prev.key != key or (prev.continuations is None) != (kind != LOGLIKELIHOOD)):
            raise EvalReplayError(
                f"{where}: doc_id {show(doc_id)} appears again with a different prompt "
                "or request type; replay needs one prompt per doc_id"
            )
        if kind != LOGLIKELIHOOD:
            prompts.setdefault(doc_id, _Prompt(key))
            continue
        prompt = prompts.setdefault(doc_id, _Prompt(key, (), where=where))
        if "continuations" in request:
            if prev is not None:
                raise EvalReplayError(
                    f"{where}: doc_id {show(doc_id)} has a second loglikelihood row, and this one "
                    "lists all its 'continuations'; replay needs one such row per doc_id"
                )
            prompt.continuations, prompt.keep = _continuations(request, where)
        else:
            _add_choice(prompt, row, request, doc_id, where)
    for doc_id, prompt in prompts.items():
        if prompt.by_idx:
            missing = [i for i in range(len(prompt.by_idx)) if i not in prompt.by_idx]
            if missing:
                raise EvalReplayError(
                    f"{prompt.where}: the loglikelihood rows of doc_id {show(doc_id)} have idx "
                    f"{sorted(prompt.by_idx)}, with no row for choice {missing[0]}; "
                    "restore the requests file of that run"
                )
            prompt.continuations = tuple(prompt.by_idx[i] for i in range(len(prompt.by_idx)))
            prompt.keep = tuple(range(len(prompt.continuations)))
        elif prompt.continuations is not None and not prompt.keep:
            prompt.key = None  # every continuation scored against another prompt: nothing to serve
    return prompts


def _request_row(row: Any, path: Path, lineno: int) -> tuple[int | str, str, dict[str, Any]]:
    """A requests row's doc_id, request_type and request, checked."""
    where = f"{path}:{lineno}"
    if type(row) is not dict:
        raise not_an_object(where, "an olmo-eval requests row", row)
    if "doc_id" not in row or "request" not in row:
        raise bad_row(path, lineno, "an olmo-eval requests row needs 'doc_id', 'request_type' and 'request'")
    doc_id = _doc_id(row["doc_id"], where)
    request = row["request"]
    if type(request) is not dict:
        raise not_an_object(where, "'request'", request)
    kind = row.get("request_type")
    if type(kind) is not str:
        raise bad_field(where, "request_type", "a string such as 'generate_until'", kind)
    return doc_id, kind, request


def _key(request: dict[str, Any], where: str) -> IndexKey:
    context = request.get("context")
    if type(context) is not str and type(context) is not list:
        raise bad_field(where, "request.context", "a string or a list of chat messages", context)
    system = optional_string(request, "system_prompt", where, "request")
    try:
        return index_key(context, system)
    except TypeError as exc:
        raise bad_field(where, "request.context", f"JSON orjson can encode ({exc})", context) from None


def _continuations(request: dict[str, Any], where: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """olmo-eval's `request.continuations`, and the positions scored against
    the request's own context (all but the unconditional half)."""
    conts = request["continuations"]
    if type(conts) is not list or not conts or not all(type(c) is str for c in conts):
        raise bad_field(where, "request.continuations", "a non-empty list of strings", conts)
    prompts = request.get("continuation_prompts")
    if prompts is None:
        return tuple(conts), tuple(range(len(conts)))
    if type(prompts) is not list or len(prompts) != len(conts):
        raise bad_field(
            where,
            "request.continuation_prompts",
            f"a list of {len(conts)} prompts, one per continuation",
            prompts,
        )
    keep = tuple(i for i, p in enumerate(prompts) if p == request.get("context"))
    return tuple(conts), keep


def _add_choice(
    prompt: _Prompt, row: dict[str, Any], request: dict[str, Any], doc_id: Any, where: str
) -> None:
    """oe-eval: one row per choice, `request.continuation` at position `idx`."""
    cont, idx = request.get("continuation"), row.get("idx")
    if type(cont) is not str:
        raise bad_field(where, "request.continuation", "a string (the continuation scored)", cont)
    if type(idx) is not int or idx < 0:
        raise bad_field(where, "idx", "the choice's position, a non-negative integer", idx)
    if prompt.by_idx.setdefault(idx, cont) != cont:
        raise EvalReplayError(
            f"{where}: doc_id {show(doc_id)} has two loglikelihood rows for choice idx {idx} with "
            "different continuations; restore the requests file of that run"
        )


def decode(blob: bytes, where: str, file: Path) -> SavedRow:
    """A predictions row; a loglikelihood one as `[continuations, keep, row]`
    (`load_file` wraps it so)."""
    try:
        row = orjson.loads(blob)
    except orjson.JSONDecodeError as exc:
        raise malformed_at(where, exc) from None
    if type(row) is list:
        conts, keep, row = row
        return _loglikelihood_row(row, conts, keep, where, file)
    if type(row) is not dict:
        raise not_an_object(where, "an olmo-eval predictions row", row)
    outputs = row.get("model_output")
    if type(outputs) is not list:
        raise bad_field(where, "model_output", "a list (one entry per sample)", outputs)
    gens = tuple(_generation(out, where, i) for i, out in enumerate(outputs))
    return SavedRow(
        instance_id=_instance_id(row, where),
        stage=1,
        rollouts=tuple(range(len(gens))),
        generations=gens,
        where=where,
        file=file,
    )


def _loglikelihood_row(
    row: dict[str, Any], conts: list[str], keep: list[int], where: str, file: Path
) -> SavedRow:
    outputs = row["model_output"]  # checked at load: a list, one entry per continuation
    pairs = []
    tokens = []
    for i in keep:
        out = outputs[i]
        name = f"model_output[{i}]"
        if type(out) is not dict:
            raise not_an_object(where, name, out)
        ll = out.get("sum_logits")
        if type(ll) is int:
            ll = float(ll)
        if type(ll) is not float or not math.isfinite(ll):
            raise bad_field(
                where, f"{name}.sum_logits", "a finite number (the continuation's log-likelihood)", ll
            )
        greedy = out.get("is_greedy", False)
        if type(greedy) is not bool:
            raise bad_field(where, f"{name}.is_greedy", "true or false", greedy)
        pairs.append((ll, greedy))
        tokens.append(token_count(out.get("num_tokens"), where, f"{name}.num_tokens"))
    return SavedRow(
        instance_id=_instance_id(row, where),
        stage=1,
        rollouts=(0,),
        generations=(
            Generation(
                text="",
                loglikelihoods=tuple(pairs),
                metadata={"num_tokens": tokens} if any(t is not None for t in tokens) else {},
            ),
        ),
        where=where,
        file=file,
        continuations=tuple(conts[i] for i in keep),
    )


def _instance_id(row: dict[str, Any], where: str) -> str:
    iid = row.get("native_id")
    if iid is None:
        iid = _doc_id(row.get("doc_id"), where)
    elif type(iid) is not str and type(iid) is not int:
        raise bad_field(where, "native_id", "a string, an integer or null", iid)
    return str(iid)


def _generation(out: Any, where: str, index: int) -> Generation:
    name = f"model_output[{index}]"
    if type(out) is not dict:
        raise not_an_object(where, name, out)
    text = out.get("text")
    if text is None:
        text = out.get("continuation")
    if type(text) is not str:
        raise bad_field(where, f"{name}.text", "a string (or 'continuation', oe-eval's name)", text)
    original = optional_string(out, "original_text", where, name)
    finish = optional_string(out, "finish_reason", where, name)
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
    "doc"}` per generate or loglikelihood document (a loglikelihood one also
    has its `"continuations"`, as olmo-eval scored them), so that
    `EvalTask(..., prompt=lambda i: i["prompt"], system_prompt=...)` renders
    the prompts olmo-eval sent."""
    path = Path(path)
    prompts = _read_prompts(path)
    found: dict[int | str, dict[str, Any]] = {}
    skipped = 0
    for lineno, _, row in parse_lines(path):
        doc_id, kind, request = _request_row(row, path, lineno)
        prompt = prompts[doc_id]
        if kind not in GENERATE_TYPES and prompt.key is None:
            skipped += 1
            continue
        if doc_id in found:
            continue
        _key(request, f"{path}:{lineno}")  # checked: a generate row with tools is read too
        found[doc_id] = {
            "id": str(doc_id),
            "prompt": request.get("context"),
            "system_prompt": request.get("system_prompt"),
            "target": row.get("label"),
            "native_id": row.get("native_id"),
            "doc": row.get("doc"),
        }
        if prompt.continuations is not None:
            found[doc_id]["continuations"] = [prompt.continuations[i] for i in prompt.keep]
    if not found:
        raise EvalReplayError(
            f"{path}: no generate_until or loglikelihood requests in this file ({skipped} rows of "
            "other kinds); olmo_eval.instances reads the requests of a generation, multiple-choice "
            "or BPB task"
        )
    return list(found.values())
