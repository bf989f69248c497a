"""lm-evaluation-harness `--log_samples` output, read as it is.

lm-eval writes `<output>/<model_name_sanitized>/samples_<task>_<date>.jsonl`
beside `results_<date>.json`. A row is one document under one filter:
`{"doc_id", "doc", "target", "arguments": {"gen_args_0": {"arg_0": context,
"arg_1": generation kwargs}}, "resps": [[text, ...]], "filtered_resps",
"filter", "metrics", "doc_hash", "prompt_hash", "target_hash", <metric>: ...}`.
Older versions wrote `arguments` as a list of argument lists. A generation
request has exactly one argument pair whose second element is the kwargs dict;
multiple-choice (loglikelihood) rows have one pair per choice and are skipped.
`resps[0]` holds one raw text per repeat (the samples). A document appears
once per filter with the same responses; those rows collapse into one save.

`arg_0` is the rendered prompt: few-shot examples, chat template and system
instruction included. Chat API models log it as a one-element list holding
the JSON of the message list; that is read back as chat messages.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.formats import (
    IndexBuilder,
    SavedRow,
    bad_row,
    parse_lines,
)
from pytest_evalreplay.model import Context, EvalReplayError, Generation, PromptKey, prompt_key

LAYOUT = "lm-eval"
SAMPLES = re.compile(r"samples_(?P<task>.+)_(?P<date>\d{4}-\d\d-\d\dT[0-9.\-]+)\.jsonl")
LOOSE_SAMPLES = re.compile(r"samples_(?P<task>.+)\.jsonl")


def is_samples_file(path: Path) -> bool:
    return LOOSE_SAMPLES.fullmatch(path.name) is not None


def samples_files(directory: Path) -> list[Path]:
    """`samples_*.jsonl` in `directory`, or one level down (lm-eval's
    per-model folders under the output path)."""
    found = sorted(p for p in directory.glob("samples_*.jsonl") if p.is_file())
    if not found:
        found = sorted(p for p in directory.glob("*/samples_*.jsonl") if p.is_file())
    return found


def model_of(path: Path) -> str:
    """The model that wrote a samples file: `model_name` of the results file of
    the same run, else the folder lm-eval named after the model."""
    match = SAMPLES.fullmatch(path.name)
    if match:
        results = path.with_name(f"results_{match['date']}.json")
        try:
            doc = orjson.loads(results.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("model_name"), str) and doc["model_name"]:
            return doc["model_name"]
    return path.parent.resolve().name


def load_files(builder: IndexBuilder, paths: list[Path]) -> None:
    for path in paths:  # every model first: several are refused before any parsing
        builder.note_model(model_of(path), path)
    builder.check_one_model()
    for path in paths:
        _load(builder, path)


def _load(builder: IndexBuilder, path: Path) -> None:
    match = SAMPLES.fullmatch(path.name) or LOOSE_SAMPLES.fullmatch(path.name)
    task = match["task"] if match else path.stem
    linenos: list[int] = []
    builder.add_file(path, task, LAYOUT, decode, linenos)
    blobs = builder.blobs
    setdefault = builder.keys.setdefault
    seen: dict[Any, tuple[PromptKey, ...]] = {}  # doc_id -> keys: one save per doc, not per filter
    for lineno, _, row in parse_lines(path):
        try:
            doc_id = row["doc_id"]
            args = _arguments(row["arguments"])
            resps = row["resps"]
            if not isinstance(doc_id, (int, str)):
                raise TypeError("doc_id")
        except (KeyError, TypeError, AttributeError, ValueError):
            raise bad_row(
                path, lineno, "an lm-eval samples row has 'doc_id', 'arguments' and 'resps'"
            ) from None
        if len(args) != 1 or len(args[0]) < 2 or not isinstance(args[0][1], dict):
            builder.skipped += 1  # loglikelihood / multiple choice
            continue
        try:
            keys = tuple(prompt_key(context, system) for context, system in _prompts(_context(args[0][0])))
        except (TypeError, AttributeError):
            raise bad_row(path, lineno, "arguments.gen_args_0.arg_0 must be the prompt") from None
        if seen.get(doc_id) == keys:
            continue  # the same document under another filter
        seen[doc_id] = keys
        if not isinstance(resps, list) or not resps:
            raise bad_row(path, lineno, "'resps' must hold the generations as [[text, ...]]")
        pos = len(blobs)
        blobs.append(orjson.dumps([doc_id, resps[0]]))  # the row's doc is not needed again
        linenos.append(lineno)
        for key in keys:
            prev = setdefault(key, pos)
            if prev is not pos:
                builder.collide(key, prev, pos)


def _arguments(arguments: Any) -> list[list[Any]]:
    """`{"gen_args_0": {"arg_0": a, "arg_1": b}, ...}` (or the older list of
    lists) as a list of argument lists, in order."""
    if isinstance(arguments, list):
        return [list(a) for a in arguments]
    ordered = sorted(arguments.items(), key=lambda kv: int(kv[0].rpartition("_")[2]))
    return [
        [v for _, v in sorted(arg.items(), key=lambda kv: int(kv[0].rpartition("_")[2]))]
        for _, arg in ordered
    ]


def _context(arg0: Any) -> Context:
    """The logged prompt: a string, or (chat APIs) `[json of the messages]`."""
    if isinstance(arg0, list) and len(arg0) == 1 and isinstance(arg0[0], str):
        arg0 = arg0[0]
        try:
            messages = orjson.loads(arg0)
        except orjson.JSONDecodeError:
            return arg0
        if (
            isinstance(messages, list)
            and messages
            and all(isinstance(m, dict) and "role" in m for m in messages)
        ):
            return messages
        return arg0
    if not isinstance(arg0, str):
        raise TypeError("prompt is not a string")
    return arg0


def _prompts(context: Context) -> list[tuple[Context, str | None]]:
    """Chat messages led by a system message match both a task that puts it in
    its messages and one that passes it as `system_prompt`."""
    found: list[tuple[Context, str | None]] = [(context, None)]
    if (
        isinstance(context, list)
        and len(context) > 1
        and context[0].get("role") == "system"
        and isinstance(context[0].get("content"), str)
    ):
        found.append((context[1:], context[0]["content"]))
    return found


def decode(blob: bytes, where: str, file: Path) -> SavedRow:
    try:
        doc_id, texts = orjson.loads(blob)
    except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
        raise EvalReplayError(f"{where}: unreadable lm-eval samples row ({exc})") from None
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise EvalReplayError(f"{where}: 'resps' must hold the generations as [[text, ...]]")
    return SavedRow(
        instance_id=str(doc_id),
        stage=1,
        rollouts=tuple(range(len(texts))),
        generations=tuple(Generation(text=t) for t in texts),
        where=where,
        file=file,
    )


def instances(path: str | Path) -> list[dict[str, Any]]:
    """A task's instances from a samples file: `{"id": doc_id, "prompt": the
    logged prompt, "target", "doc"}` per generation document, so that
    `EvalTask(..., instances=instances(path), prompt=lambda i: i["prompt"])`
    renders exactly the prompts lm-eval sent and replay finds their saves."""
    path = Path(path)
    found: dict[Any, dict[str, Any]] = {}
    for lineno, _, row in parse_lines(path):
        try:
            args = _arguments(row["arguments"])
            if row["doc_id"] in found or len(args) != 1 or not isinstance(args[0][1], dict):
                continue
            found[row["doc_id"]] = {
                "id": str(row["doc_id"]),
                "prompt": _context(args[0][0]),
                "target": row.get("target"),
                "doc": row.get("doc"),
            }
        except (KeyError, TypeError, AttributeError, ValueError, IndexError):
            raise bad_row(path, lineno, "an lm-eval samples row has 'doc_id' and 'arguments'") from None
    return list(found.values())
