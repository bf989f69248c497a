"""inspect_ai `.eval` logs, read as they are.

A `.eval` log is a zip archive: `header.json` (the eval: its `model`, task,
config and results; `_journal/start.json` while a run is in progress) and one
`samples/<id>_epoch_<n>.json` per sample and epoch: `{"id", "epoch", "input",
"target", "messages", "output", "scores", "metadata", "attachments", ...}`.

A sample is read as a generation save. Its prompt is `messages` up to the
last assistant message (the conversation the model answered, the solver's
system message included), each message as `{"role", "content"}`; a content
given as a list of text parts stays a list of `{"type": "text", "text"}`
parts, and `attachment://<hash>` references are resolved from the sample's
`attachments`. A system message first is also matched as `system_prompt`
(see `formats.chat`). The generation is `output.completion`, with
`output.choices[0].stop_reason` as the finish reason and
`output.usage.input_tokens` / `output_tokens` as the token counts; epoch n is
rollout n - 1 of the instance `id`. Samples that cannot be replayed as a text
generation are skipped (and counted): one with no output (an error), with
tool calls or tool messages, or with image, audio or other non-text content.

inspect_ai 0.3.285 compresses each member with zstd (zip method 93).
Python's zipfile reads that from 3.14 on; before that, the members are
decompressed with the `zstandard` package when it is installed (inspect_ai
installs it), else the log is refused with what to install.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.formats import chat
from pytest_evalreplay.formats.saved import IndexBuilder, SavedRow, index_key, list_dir, malformed_at
from pytest_evalreplay.model import Context, EvalReplayError, Generation
from pytest_evalreplay.storage.rowfields import described, optional_string, token_count

LAYOUT = "inspect-ai"
SUFFIX = ".eval"
SAMPLES = "samples/"
ZSTD = 93  # zip compression method: Zstandard
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., name length, extra length


# A member of a .eval log is unpacked whole into memory: one sample, or the
# header. inspect_ai's own members are far under these (the shipped logs: a
# few KB; a long agent sample: tens of MB, packed 5-20 to 1).
MAX_MEMBER_BYTES = 1 << 30
MAX_RATIO = 200  # unpacked / packed; checked for members over MAX_RATIO_FLOOR
MAX_RATIO_FLOOR = 16 << 20


def is_log(path: Path) -> bool:
    return path.name.endswith(SUFFIX)


def log_files(directory: Path) -> list[Path]:
    """The `.eval` logs in `directory` (inspect's log dir)."""
    return [p for p in list_dir(directory, f"*{SUFFIX}") if p.is_file()]


def load_files(builder: IndexBuilder, paths: list[Path]) -> None:
    archives = [_open(p) for p in paths]
    try:
        for path, archive in zip(paths, archives, strict=True):  # every model first
            builder.note_model(_model(path, archive), path)
        builder.check_one_model()
        for path, archive in zip(paths, archives, strict=True):
            _load(builder, path, archive)
    finally:
        for archive in archives:
            archive.close()


def _open(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, ValueError, EOFError) as exc:
        raise EvalReplayError(
            f"{path}: not a readable .eval log ({exc}); an inspect_ai .eval log is a zip archive "
            "(a .json log can be turned into one with `inspect log convert --to eval`)"
        ) from None
    except OSError as exc:
        raise EvalReplayError(f"{path}: cannot read this .eval log ({exc.strerror or exc})") from None


def _model(path: Path, archive: zipfile.ZipFile) -> str | None:
    """`eval.model` of `header.json` (or of `_journal/start.json` for a run in progress)."""
    names = set(archive.namelist())
    for name in ("header.json", "_journal/start.json"):
        if name in names:
            doc = _json(path, archive, archive.getinfo(name))
            ev = doc.get("eval") if type(doc) is dict else None
            model = ev.get("model") if type(ev) is dict else None
            if model is not None and type(model) is not str:
                raise _bad(f"{path}:{name}", "eval.model", "a string or null", model)
            return model
    return None


def _samples(path: Path, archive: zipfile.ZipFile) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """Each sample member's position (1-based), its `file:member` and its JSON."""
    members = [i for i in archive.infolist() if i.filename.startswith(SAMPLES) and not i.is_dir()]
    if not members:
        raise EvalReplayError(
            f"{path}: this .eval log holds no samples (was it run with --no-log-samples?); "
            "replay needs each sample's messages and output"
        )
    for n, info in enumerate(members, 1):
        where = f"{path}:{info.filename}"
        sample = _json(path, archive, info)
        if type(sample) is not dict:
            raise _not_object(where, "an inspect_ai sample", sample)
        yield n, where, sample


def _load(builder: IndexBuilder, path: Path, archive: zipfile.ZipFile) -> None:
    linenos: list[int] = []
    saved = builder.add_file(path, path.stem, LAYOUT, decode, linenos, identify=identify)
    for n, where, sample in _samples(path, archive):
        read = _read(sample, where)
        if read is None:
            builder.skipped += 1
            continue
        context, blob = read
        pos = saved.start + len(saved.lines)
        saved.lines.append(orjson.dumps({**blob, "member": where.rpartition(":")[2]}))
        linenos.append(n)
        for prompt, system in chat.prompts(context):
            builder.insert(index_key(prompt, system), pos)


def _read(sample: dict[str, Any], where: str) -> tuple[Context, dict[str, Any]] | None:
    """A sample's prompt and its save (id, epoch, text, finish reason, token
    counts), or None for a sample replay skips."""
    sid = sample.get("id")
    if type(sid) is not str and type(sid) is not int:
        raise _bad(where, "id", "a string or an integer", sid)
    epoch = sample.get("epoch", 1)
    if type(epoch) is not int or epoch < 1:
        raise _bad(where, "epoch", "a positive integer", epoch)
    attachments = sample.get("attachments") or {}
    if type(attachments) is not dict:
        raise _bad(where, "attachments", "an object", attachments)
    output = sample.get("output")
    if output is None or (type(output) is dict and not output.get("choices")):
        return None  # the sample failed before the model answered
    if type(output) is not dict:
        raise _not_object(where, "'output'", output)
    text = _resolved(output.get("completion"), attachments)
    if type(text) is not str:
        raise _bad(where, "output.completion", "a string (the model's answer)", text)
    context = _prompt(sample.get("messages"), attachments, where)
    if context is None:
        return None
    choice = output["choices"][0] if type(output["choices"]) is list else None
    if type(choice) is not dict:
        raise _bad(where, "output.choices", "a list of choice objects", output["choices"])
    finish = optional_string(choice, "stop_reason", where, "output.choices[0]", _bad)
    usage = output.get("usage") or {}
    if type(usage) is not dict:
        raise _bad(where, "output.usage", "an object or null", usage)
    blob = {
        "id": sid,
        "epoch": epoch,
        "text": text,
        "finish": finish,
        "pt": token_count(usage.get("input_tokens"), where, "output.usage.input_tokens", _bad),
        "ct": token_count(usage.get("output_tokens"), where, "output.usage.output_tokens", _bad),
    }
    return context, blob


def _prompt(messages: Any, attachments: dict[str, Any], where: str) -> list[dict[str, Any]] | None:
    """The messages the model answered last, as `{"role", "content"}`; None
    when replay cannot serve them as text (tools, images, no answer)."""
    if type(messages) is not list:
        raise _bad(where, "messages", "a list of chat messages", messages)
    last = None
    for i, message in enumerate(messages):
        if type(message) is not dict:
            raise _not_object(where, f"messages[{i}]", message)
        role = message.get("role")
        if type(role) is not str:
            raise _bad(where, f"messages[{i}].role", "a string", role)
        if role == "assistant":
            last = i
    if last is None:
        return None
    prompt = []
    for i, message in enumerate(messages[:last]):
        if message["role"] == "tool" or message.get("tool_calls"):
            return None
        content = _content(message.get("content"), attachments, where, i)
        if content is None:
            return None
        prompt.append({"role": message["role"], "content": content})
    return prompt


def _content(
    value: Any, attachments: dict[str, Any], where: str, i: int
) -> str | list[dict[str, str]] | None:
    """A message's content: a string, or a list of text parts; None for other parts."""
    value = _resolved(value, attachments)
    if type(value) is str:
        return value
    if type(value) is not list:
        raise _bad(where, f"messages[{i}].content", "a string or a list of content parts", value)
    parts = []
    for part in value:
        if type(part) is not dict:
            raise _not_object(where, f"messages[{i}].content part", part)
        if part.get("type") != "text":
            return None  # an image, audio, reasoning or tool part
        text = _resolved(part.get("text"), attachments)
        if type(text) is not str:
            raise _bad(where, f"messages[{i}].content text", "a string", text)
        parts.append({"type": "text", "text": text})
    return parts


def _resolved(value: Any, attachments: dict[str, Any]) -> Any:
    """inspect's `attachment://<hash>` reference, resolved (else as it is)."""
    if type(value) is str and value.startswith("attachment://"):
        return attachments.get(value[len("attachment://") :], value)
    return value


def _json(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> Any:
    where = f"{path}:{info.filename}"
    try:
        return orjson.loads(_member(path, archive, info))
    except orjson.JSONDecodeError as exc:
        raise EvalReplayError(
            f"{where}: not valid JSON ({exc}); the log is damaged: write it again with inspect_ai, "
            "or point --evalreplay-predictions elsewhere"
        ) from None


def _member(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    _check_size(path, info)
    try:
        return archive.read(info)
    except NotImplementedError:
        if info.compress_type != ZSTD:
            raise EvalReplayError(
                f"{path}:{info.filename}: compressed with zip method {info.compress_type}, which "
                "Python's zipfile cannot read; write the log again with inspect_ai"
            ) from None
        return _zstd_member(path, info)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, RuntimeError) as exc:
        raise EvalReplayError(
            f"{path}:{info.filename}: cannot read this member of the .eval log ({exc}); "
            "the log is damaged: write it again with inspect_ai"
        ) from None


def _check_size(path: Path, info: zipfile.ZipInfo) -> None:
    """Refuse a member before unpacking it when its size, as the zip directory
    says, is beyond what a log holds: zipfile (and the zstd path) never unpack
    more than that size, so a lying directory gets a CRC error, not a bomb."""
    where = f"{path}:{info.filename}"
    if info.file_size > MAX_MEMBER_BYTES:
        raise EvalReplayError(
            f"{where}: unpacks to {info.file_size:,} bytes, more than the {MAX_MEMBER_BYTES:,} a member "
            "of an .eval log may hold here; a sample this large is not replayed: write the log again "
            "with fewer or smaller samples, or delete this member"
        )
    packed = max(info.compress_size, 1)
    if info.file_size > MAX_RATIO_FLOOR and info.file_size > MAX_RATIO * packed:
        raise EvalReplayError(
            f"{where}: unpacks to {info.file_size:,} bytes from {info.compress_size:,} "
            f"({info.file_size // packed:,} to 1, more than the {MAX_RATIO} to 1 of real JSON): the log "
            "looks like a zip bomb, not an inspect_ai log; write it again with inspect_ai, or delete it"
        )


def _zstd_member(path: Path, info: zipfile.ZipInfo) -> bytes:
    """A zstd member on a Python whose zipfile cannot read it: its raw bytes
    taken from the archive and unpacked with the `zstandard` package."""
    where = f"{path}:{info.filename}"
    try:
        import zstandard
    except ImportError:
        raise EvalReplayError(
            f"{where}: compressed with zstd, as inspect_ai writes .eval logs; Python's zipfile reads "
            "zstd from Python 3.14 on: install the zstandard package (pip install zstandard; "
            "inspect_ai depends on it) or use Python 3.14+"
        ) from None
    try:
        with path.open("rb") as fh:
            fh.seek(info.header_offset)
            signature, name_len, extra_len = _LOCAL_HEADER.unpack(fh.read(_LOCAL_HEADER.size))
            if signature != b"PK\x03\x04":
                raise ValueError("no local file header where the directory says")
            fh.seek(info.header_offset + _LOCAL_HEADER.size + name_len + extra_len)
            raw = fh.read(info.compress_size)
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        data = reader.read(info.file_size + 1)
        if len(data) != info.file_size or zlib.crc32(data) != info.CRC:
            raise ValueError("its size or CRC differs from the zip directory's")
    except (OSError, ValueError, struct.error, zstandard.ZstdError) as exc:
        raise EvalReplayError(
            f"{where}: cannot read this member of the .eval log ({exc}); "
            "the log is damaged: write it again with inspect_ai"
        ) from None
    return data


def _bad(where: str, name: str, expected: str, value: Any) -> EvalReplayError:
    """A field of a sample (or header) of the wrong type, `where` being
    `log:member`: `rowfields.bad_field`'s message, with advice for a zip
    member rather than a line."""
    return EvalReplayError(
        f"{where}: {name!r} must be {expected}, got {described(value)}; this member of the .eval "
        "log is damaged (written by hand?): write the log again with inspect_ai, or delete the member"
    )


def _not_object(where: str, what: str, value: Any) -> EvalReplayError:
    return _bad(where, what, "a JSON object", value)


def identify(blob: bytes) -> tuple[int, str] | None:
    try:
        return 1, str(orjson.loads(blob)["id"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None


def decode(blob: bytes, where: str, file: Path) -> SavedRow:
    """A save as `_load` kept it (checked there): one sample of one epoch."""
    try:
        row = orjson.loads(blob)
        generation = Generation(
            text=row["text"],
            finish_reason=row["finish"],
            prompt_tokens=row["pt"],
            completion_tokens=row["ct"],
        )
        return SavedRow(
            instance_id=str(row["id"]),
            stage=1,
            rollouts=(row["epoch"] - 1,),
            generations=(generation,),
            where=f"{file}:{row['member']}",
            file=file,
        )
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise malformed_at(where, exc) from None


def instances(path: str | Path) -> list[dict[str, Any]]:
    """A task's instances from a `.eval` log: `{"id", "prompt": the messages
    the model answered (a system message first left out), "system_prompt":
    that message's text or None, "input", "target", "metadata"}` per sample
    (its first epoch), so that `EvalTask(..., prompt=lambda i: i["prompt"],
    system_prompt=...)` renders exactly what inspect sent."""
    path = Path(path)
    found: dict[str, dict[str, Any]] = {}
    skipped = 0
    archive = _open(path)
    with archive:
        for _, where, sample in _samples(path, archive):
            read = _read(sample, where)
            if read is None:
                skipped += 1
                continue
            context, blob = read
            if str(blob["id"]) in found:
                continue
            prompt, system = chat.prompts(context)[-1]
            found[str(blob["id"])] = {
                "id": str(blob["id"]),
                "prompt": prompt,
                "system_prompt": system,
                "input": sample.get("input"),
                "target": sample.get("target"),
                "metadata": sample.get("metadata"),
            }
    if not found:
        raise EvalReplayError(
            f"{path}: no sample of this .eval log can be replayed ({skipped} without an output, "
            "or with tools or non-text content)"
        )
    return list(found.values())
