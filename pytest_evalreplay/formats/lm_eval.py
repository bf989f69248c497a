"""lm-evaluation-harness `--log_samples` output, read as it is.

lm-eval writes `<output>/<model_name_sanitized>/samples_<task>_<date>.jsonl`
beside `results_<date>.json`. A row is one document under one filter:
`{"doc_id", "doc", "target", "arguments": {"gen_args_0": {"arg_0": context,
"arg_1": generation kwargs}}, "resps": [[text, ...]], "filtered_resps",
"filter", "metrics", "doc_hash", "prompt_hash", "target_hash", <metric>: ...}`.
Older versions wrote `arguments` as a list of argument lists. A generation
request has exactly one argument pair whose second element is the kwargs dict;
`resps[0]` holds one raw text per repeat (the samples).

A multiple-choice document (`output_type: multiple_choice`) has one argument
pair per choice, `(context, target_delimiter + choice)`, all with the same
context, and `resps[i] = [[loglikelihood, is_greedy]]` for choice i (lm-eval
0.4.13 writes both as strings: `["-23.88", "False"]`). It is read as a
loglikelihood save: the context is the prompt, the pairs' second elements are
its continuations, and its one generation has text "" and those
(log-likelihood, is_greedy) pairs. Documents whose pairs have different
contexts (winogrande's partial scoring) and `loglikelihood_rolling`
documents (one argument, no continuation) are skipped.

A document appears once per filter with the same responses; those rows
collapse into one save. Samples files gzipped after the run (`.jsonl.gz`)
read the same.

`arg_0` is the rendered prompt: few-shot examples, chat template and system
instruction included. Chat API models log it as a one-element list holding
the JSON of the message list; that is read back as chat messages.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.formats import chat
from pytest_evalreplay.formats.saved import (
    IndexBuilder,
    IndexKey,
    SavedRow,
    bad_field,
    index_key,
    list_dir,
    malformed_at,
    not_an_object,
    rows_of,
    split_lines,
)
from pytest_evalreplay.model import Context, EvalReplayError, Generation
from pytest_evalreplay.storage.files import read_bytes
from pytest_evalreplay.storage.lines import check_line_lengths

LAYOUT = "lm-eval"
SAMPLES = re.compile(r"samples_(?P<task>.+)_(?P<date>\d{4}-\d\d-\d\dT[0-9.\-]+)\.jsonl(?:\.gz)?")
LOOSE_SAMPLES = re.compile(r"samples_(?P<task>.+)\.jsonl(?:\.gz)?")
_ARG_INDEX = re.compile(r"(?:gen_args|arg)_(\d+)")


def is_samples_file(path: Path) -> bool:
    return LOOSE_SAMPLES.fullmatch(path.name) is not None


def samples_files(directory: Path) -> list[Path]:
    """`samples_*.jsonl(.gz)` in `directory`, or one level down (lm-eval's
    per-model folders under the output path)."""
    found = [p for p in list_dir(directory, "samples_*") if is_samples_file(p) and p.is_file()]
    if not found:
        found = sorted(p for p in directory.glob("*/samples_*") if is_samples_file(p) and p.is_file())
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
            doc = None  # the results file is optional: the folder names the model too
        if isinstance(doc, dict) and isinstance(doc.get("model_name"), str) and doc["model_name"]:
            return doc["model_name"]
    return path.parent.resolve().name


# A gzipped samples file unpacking more than this many times its size (past
# the floor) is a bomb, not JSONL: refused before it fills memory, as an
# inspect_ai member is (JSONL packs 5-20 to 1).
MAX_RATIO = 200
MAX_RATIO_FLOOR = 16 << 20
_GUNZIP_CHUNK = 1 << 20


def read_samples(path: Path) -> list[bytes]:
    """A samples file's lines, unpacked first if it is gzipped."""
    data = read_bytes(path)
    if path.name.endswith(".gz"):
        try:
            data = _gunzip(path, data)
        except (OSError, EOFError, zlib.error) as exc:
            raise EvalReplayError(
                f"{path}: not a readable gzip file ({exc}); unpack it by hand to see what is wrong"
            ) from None
    check_line_lengths(path, data)
    return split_lines(data)


def _gunzip(path: Path, data: bytes) -> bytes:
    """`data` unpacked (every gzip member, as `gzip.decompress`) a chunk at a
    time, refused once it passes MAX_RATIO times its packed size."""
    limit = max(MAX_RATIO_FLOOR, MAX_RATIO * len(data))
    parts: list[bytes] = []
    size, rest = 0, data
    while rest.strip(b"\0"):
        unpack = zlib.decompressobj(wbits=31)
        pending = rest
        while not unpack.eof:
            piece = unpack.decompress(pending, _GUNZIP_CHUNK)
            pending = unpack.unconsumed_tail
            if not (piece or pending or unpack.eof):
                raise EOFError("the file ends inside a gzip member")
            size += len(piece)
            if size > limit:
                raise EvalReplayError(
                    f"{path}: unpacks to over {limit:,} bytes from {len(data):,} (more than the {MAX_RATIO} "
                    "to 1 of real JSONL): it looks like a gzip bomb, not lm-eval samples; unpack it by hand "
                    "if it is real"
                )
            parts.append(piece)
        rest = unpack.unused_data
    return b"".join(parts)


def load_files(builder: IndexBuilder, paths: list[Path]) -> None:
    for path in paths:  # every model first: several are refused before any parsing
        builder.note_model(model_of(path), path)
    builder.check_one_model()
    for path in paths:
        _load(builder, path)


def _rows(path: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    for lineno, row in rows_of(path, read_samples(path)):
        where = f"{path}:{lineno}"
        if type(row) is not dict:
            raise not_an_object(where, "an lm-eval samples row", row)
        for name in ("doc_id", "arguments"):
            if name not in row:
                raise EvalReplayError(
                    f"{where}: an lm-eval samples row needs {name!r}, and this one has none; "
                    "was it written by lm_eval --log_samples?"
                )
        doc_id = row["doc_id"]
        if type(doc_id) is not int and type(doc_id) is not str:
            raise bad_field(where, "doc_id", "an integer or a string", doc_id)
        yield lineno, where, row


def _load(builder: IndexBuilder, path: Path) -> None:
    match = SAMPLES.fullmatch(path.name) or LOOSE_SAMPLES.fullmatch(path.name)
    task = match["task"] if match else path.stem
    linenos: list[int] = []
    saved = builder.add_file(path, task, LAYOUT, decode, linenos, identify=identify)
    blobs = saved.lines
    # doc_id -> its prompts and texts: one save per document, not one per filter
    # (a filter's row with other texts is saved too, and replay reports the conflict)
    seen: dict[int | str, tuple[tuple[IndexKey, ...], Any]] = {}
    for lineno, where, row in _rows(path):
        doc_id = row["doc_id"]
        args = _arguments(row["arguments"], where)
        choice = _is_choice(args)
        if not choice and not _is_generation(args):
            builder.skipped += 1  # loglikelihood_rolling, or contexts that differ per choice
            continue
        keys = tuple(
            index_key(context, system) for context, system in chat.prompts(_context(args[0][0], where))
        )
        if "resps" not in row:
            raise EvalReplayError(
                f"{where}: an lm-eval samples row needs 'resps' (the generations), and this one has "
                "none; was it written by lm_eval --log_samples?"
            )
        saved_row: Any
        if choice:
            saved_row = {"doc_id": doc_id, "continuations": [a[1] for a in args]}
            saved_row["loglikelihoods"] = _pairs(row["resps"], len(args), where)
        else:
            saved_row = [doc_id, _texts(row["resps"], where)]
        if seen.get(doc_id) == (keys, saved_row):
            continue  # the same document under another filter
        seen[doc_id] = (keys, saved_row)
        pos = saved.start + len(blobs)
        blobs.append(orjson.dumps(saved_row))  # the row's doc is not needed again
        linenos.append(lineno)
        for key in keys:
            builder.insert(key, pos)


def _is_generation(args: list[list[Any]]) -> bool:
    return len(args) == 1 and len(args[0]) >= 2 and type(args[0][1]) is dict


def _is_choice(args: list[list[Any]]) -> bool:
    """A multiple-choice document: one (context, continuation) pair per
    choice, every context the same."""
    return bool(args) and all(
        len(a) == 2 and type(a[1]) is str and a[0] == args[0][0] and type(a[0]) is str for a in args
    )


def _pairs(resps: Any, n: int, where: str) -> list[list[Any]]:
    """`resps`: per choice `[[loglikelihood, is_greedy]]`, numbers and booleans
    or (lm-eval 0.4.13) their strings, as `[float, bool]` pairs."""
    if type(resps) is not list or len(resps) != n:
        raise bad_field(
            where, "resps", f"a list of {n} [[loglikelihood, is_greedy]] entries, one per choice", resps
        )
    pairs = []
    for i, entry in enumerate(resps):
        pair = entry[0] if type(entry) is list and len(entry) == 1 and type(entry[0]) is list else entry
        if type(pair) is not list or len(pair) != 2:
            raise bad_field(where, f"resps[{i}]", "[[loglikelihood, is_greedy]]", entry)
        ll, greedy = _loglikelihood(pair[0]), _greedy(pair[1])
        if ll is None:
            raise bad_field(
                where, f"resps[{i}][0][0]", "a finite log-likelihood (a number or its string)", pair[0]
            )
        if greedy is None:
            raise bad_field(where, f"resps[{i}][0][1]", "is_greedy: true/false or 'True'/'False'", pair[1])
        pairs.append([ll, greedy])
    return pairs


def _loglikelihood(value: Any) -> float | None:
    if type(value) is str:
        try:
            value = float(value)
        except ValueError:
            return None
    if type(value) is int:
        value = float(value)
    return value if type(value) is float and math.isfinite(value) else None


def _greedy(value: Any) -> bool | None:
    if type(value) is bool:
        return value
    return (
        {"True": True, "False": False, "true": True, "false": False}.get(value)
        if type(value) is str
        else None
    )


def _texts(resps: Any, where: str) -> list[str]:
    """`resps[0]`: the raw texts of one document's samples."""
    if type(resps) is not list or not resps:
        raise bad_field(where, "resps", "a non-empty list ([[text, ...]])", resps)
    texts = resps[0]
    if type(texts) is str:
        texts = [texts]
    if type(texts) is not list or not all(type(t) is str for t in texts):
        raise bad_field(where, "resps[0]", "a list of generated texts", texts)
    return texts


def _arguments(arguments: Any, where: str) -> list[list[Any]]:
    """`{"gen_args_0": {"arg_0": a, "arg_1": b}, ...}` (or the older list of
    lists) as a list of argument lists, in order."""
    if type(arguments) is list:
        if not all(type(a) is list for a in arguments):
            raise bad_field(where, "arguments", "a list of argument lists", arguments)
        return arguments
    if type(arguments) is not dict:
        raise bad_field(where, "arguments", "an object of gen_args_N (or a list)", arguments)
    ordered = []
    for name, arg in arguments.items():
        if type(arg) is not dict:
            raise bad_field(where, f"arguments.{name}", "an object of arg_N", arg)
        ordered.append((_arg_index(name, where, "arguments"), [v for _, v in _sorted_args(arg, where, name)]))
    return [values for _, values in sorted(ordered, key=lambda kv: kv[0])]


def _sorted_args(arg: dict[str, Any], where: str, parent: str) -> list[tuple[int, Any]]:
    return sorted(
        ((_arg_index(k, where, f"arguments.{parent}"), v) for k, v in arg.items()), key=lambda kv: kv[0]
    )


def _arg_index(name: str, where: str, parent: str) -> int:
    match = _ARG_INDEX.fullmatch(name)
    if match is None:
        raise EvalReplayError(
            f"{where}: {parent} has a key {name!r}, where lm-eval writes gen_args_N / arg_N; "
            "fix or delete that line"
        )
    return int(match[1])


def _context(arg0: Any, where: str) -> Context:
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
    if type(arg0) is not str:
        raise bad_field(where, "arguments.gen_args_0.arg_0", "the prompt (a string)", arg0)
    return arg0


def identify(blob: bytes) -> tuple[int, str] | None:
    try:
        row = orjson.loads(blob)
        doc_id = row["doc_id"] if type(row) is dict else row[0]
    except (orjson.JSONDecodeError, ValueError, TypeError, KeyError, IndexError):
        return None
    return 1, str(doc_id)


def decode(blob: bytes, where: str, file: Path) -> SavedRow:
    """A save as `_load` kept it (checked there): `[doc_id, texts]` for a
    generation document, `{"doc_id", "continuations", "loglikelihoods"}` for
    a multiple-choice one."""
    try:
        row = orjson.loads(blob)
        if type(row) is dict:
            pairs = tuple((float(ll), greedy) for ll, greedy in row["loglikelihoods"])
            return SavedRow(
                instance_id=str(row["doc_id"]),
                stage=1,
                rollouts=(0,),
                generations=(Generation(text="", loglikelihoods=pairs),),
                where=where,
                file=file,
                continuations=tuple(row["continuations"]),
            )
        doc_id, texts = row
    except (orjson.JSONDecodeError, ValueError, TypeError, KeyError) as exc:
        raise malformed_at(where, exc) from None
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
    logged prompt, "target", "doc"}` per document (a multiple-choice one also
    has its `"continuations"`: delimiter + choice, as lm-eval scored them), so that
    `EvalTask(..., instances=instances(path), prompt=lambda i: i["prompt"])`
    renders exactly the prompts lm-eval sent and replay finds their saves."""
    path = Path(path)
    found: dict[int | str, dict[str, Any]] = {}
    skipped = 0
    for _, where, row in _rows(path):
        args = _arguments(row["arguments"], where)
        choice = _is_choice(args)
        if not choice and not _is_generation(args):
            skipped += 1
            continue
        if row["doc_id"] in found:
            continue
        found[row["doc_id"]] = {
            "id": str(row["doc_id"]),
            "prompt": _context(args[0][0], where),
            "target": row.get("target"),
            "doc": row.get("doc"),
        }
        if choice:
            found[row["doc_id"]]["continuations"] = [a[1] for a in args]
    if not found:
        raise EvalReplayError(
            f"{path}: no generation or multiple-choice documents in this samples file ({skipped} "
            "loglikelihood_rolling rows, or rows whose choices have different contexts); "
            "lm_eval.instances reads the samples of a generate_until or multiple_choice task"
        )
    return list(found.values())
