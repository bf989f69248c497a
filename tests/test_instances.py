"""A task's instances file: every bad file is an EvalReplayError naming it (and the line)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from unreadable import Unreadable

from pytest_evalreplay import EvalReplayError
from pytest_evalreplay.formats import lm_eval, olmo_eval
from pytest_evalreplay.formats.instances import load_instances


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def lines(*rows: Any) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


def error(path: Path) -> str:
    with pytest.raises(EvalReplayError) as info:
        load_instances(path, path.parent)
    return str(info.value)


def test_rows_are_read_with_ids_as_strings(tmp_path: Path) -> None:
    path = write(tmp_path / "i.jsonl", lines({"id": "a", "q": 1}, {"id": 7, "q": 2}))
    assert load_instances("i.jsonl", tmp_path) == [{"id": "a", "q": 1}, {"id": "7", "q": 2}]
    assert load_instances(path, Path("/elsewhere")) == load_instances(str(path), tmp_path)


@pytest.mark.parametrize("data", [b"", b"\n\n  \n"], ids=["empty", "blank lines"])
def test_an_empty_instances_file_is_an_error_naming_it(tmp_path: Path, data: bytes) -> None:
    path = write(tmp_path / "i.jsonl", data)
    message = error(path)
    assert message.startswith(f"{path}: no instances")
    assert "one JSON object with an 'id' per line" in message


def test_a_byte_order_mark_is_ignored(tmp_path: Path) -> None:
    path = write(tmp_path / "i.jsonl", b"\xef\xbb\xbf" + lines({"id": "a"}, {"id": "b"}))
    assert [i["id"] for i in load_instances(path, tmp_path)] == ["a", "b"]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"{oops", ":2: not valid JSON"),
        (b'{"id": "\xff"}', ":2: not valid JSON (str is not valid UTF-8"),
        (b'{"id": "\\ud800"}', ":2: not valid JSON"),
        (b"7", ":2: an instance must be a JSON object with an 'id', got a number"),
        (b'["a"]', ":2: an instance must be a JSON object with an 'id', got a list"),
        (b'"a"', ":2: an instance must be a JSON object with an 'id', got a string"),
        (b"null", ":2: an instance must be a JSON object with an 'id', got null"),
        (
            b'{"q": 1}',
            ":2: an instance needs a non-empty string 'id' (or an integer one), and this one's is missing",
        ),
        (
            b'{"id": ["a"]}',
            ":2: an instance needs a non-empty string 'id' (or an integer one), and this one's is a list",
        ),
        (b'{"id": true}', "and this one's is a boolean True"),
        (b'{"id": 1.5}', "and this one's is a number 1.5"),
        (b'{"id": "  "}', "and this one's is a string '  '"),
        (b'{"id": "a\\nb"}', ":2: instance id 'a\\nb' may not contain '\\n'"),
        (b'{"id": "a\\rb"}', ":2: instance id 'a\\rb' may not contain '\\r'"),
        (b'{"id": "a\\tb"}', "may not contain '\\t'"),
        (b'{"id": "a::b"}', "may not contain '::'"),
        (b'{"id": "q[1]"}', "may not contain '[', ']'"),
        (b'{"id": "a"}', ":2: duplicate instance id 'a' (first at "),
    ],
    ids=lambda v: repr(v) if isinstance(v, bytes) else "",
)
def test_bad_lines_name_the_file_and_line(tmp_path: Path, line: bytes, expected: str) -> None:
    path = write(tmp_path / "i.jsonl", lines({"id": "a"}) + line + b"\n")
    message = error(path)
    assert message.startswith(str(path)) and expected in message
    assert "Traceback" not in message


def test_ids_with_newlines_say_what_to_do(tmp_path: Path) -> None:
    path = write(tmp_path / "i.jsonl", lines({"id": "line\r\nbreak"}))
    message = error(path)
    assert f"{path}:1: instance id" in message and "rename the instance" in message


@pytest.mark.parametrize("what", ["missing", "directory", "unreadable"])
def test_unreadable_instances_files_name_the_path(tmp_path: Path, what: str, unreadable: Unreadable) -> None:
    path = tmp_path / "i.jsonl"
    if what == "directory":
        path.mkdir()
    elif what == "unreadable":
        write(path, lines({"id": "a"}))
        unreadable(path)
    message = error(path)
    assert message.startswith(f"{path}: cannot read")
    expected = {
        "missing": "No such file",
        "directory": "from a directory",
        "unreadable": "check its permissions",
    }
    assert expected[what] in message


def test_an_iterable_source_names_the_index(tmp_path: Path) -> None:
    with pytest.raises(EvalReplayError, match=r"instance #1: an instance must be a JSON object"):
        load_instances([{"id": "a"}, ["b"]], tmp_path)
    with pytest.raises(EvalReplayError, match="lone surrogate"):
        load_instances([{"id": "a\ud800"}], tmp_path)
    with pytest.raises(EvalReplayError, match=r"a path to a \.jsonl file or an iterable of dicts, got int"):
        load_instances(7, tmp_path)  # type: ignore[arg-type]


@pytest.mark.slow  # 200 MB written and read twice
def test_a_huge_single_line_is_read(tmp_path: Path) -> None:
    path = tmp_path / "i.jsonl"
    with path.open("wb") as fh:
        fh.write(b'{"id": "big", "text": "')
        chunk = b"x" * (1 << 20)
        for _ in range(200):
            fh.write(chunk)
        fh.write(b'"}\n{"id": "small"}\n')
    found = load_instances(path, tmp_path)
    assert [i["id"] for i in found] == ["big", "small"] and len(found[0]["text"]) == 200 << 20
    with path.open("r+b") as fh:  # the same line cut short: a message, not a crash
        fh.truncate(100 << 20)
    assert re.search(rf"{re.escape(str(path))}:1: not valid JSON", error(path))


# -- the foreign helpers ------------------------------------------------------


def test_olmo_eval_instances_of_a_file_without_generate_requests_is_an_error(tmp_path: Path) -> None:
    row = {"request_type": "loglikelihood_rolling", "doc_id": 0, "request": {"context": "Q"}}
    path = write(tmp_path / "t-requests.jsonl", lines(row, row))
    with pytest.raises(
        EvalReplayError, match=rf"{re.escape(str(path))}: no generate_until or loglikelihood requests.*2 rows"
    ):
        olmo_eval.instances(path)
    # a loglikelihood row (multiple choice, since #20) must say its continuation
    write(path, lines({"request_type": "loglikelihood", "doc_id": 0, "request": {"context": "Q"}}))
    with pytest.raises(EvalReplayError, match=r":1: 'request.continuation' must be a string"):
        olmo_eval.instances(path)
    write(path, lines({"request_type": "generate_until", "doc_id": [0], "request": {"context": "Q"}}))
    with pytest.raises(
        EvalReplayError, match=rf"{re.escape(str(path))}:1: 'doc_id' must be an integer or a string"
    ):
        olmo_eval.instances(path)


def test_lm_eval_instances_of_a_file_without_generations_is_an_error(tmp_path: Path) -> None:
    row = {"doc_id": 0, "arguments": [["Q"]], "resps": [[-1.0]]}  # loglikelihood_rolling
    path = write(tmp_path / "samples_mc.jsonl", lines(row))
    with pytest.raises(
        EvalReplayError,
        match=r"no generation or multiple-choice documents in this samples file \(1 loglikelihood_rolling",
    ):
        lm_eval.instances(path)
    write(path, lines({"doc_id": 0, "resps": [["x"]]}))
    with pytest.raises(EvalReplayError, match=r":1: an lm-eval samples row needs 'arguments'"):
        lm_eval.instances(path)


@pytest.mark.parametrize(
    ("line", "key"),
    [
        (b'{"id": "a", "q": "x", "q": "y"}', "'q'"),
        (b'{"id": "a", "meta": {"k": 1, "k": 2}}', "'k'"),
        (b'{"id": "a", "id": "b"}', "'id'"),
        (b'{"id": "a", "rows": [{"x": 1}, {"x": 2, "y": 3, "x": 4}]}', "'x'"),
    ],
)
def test_a_duplicate_key_in_an_instances_line_is_refused_naming_file_line_and_key(
    tmp_path: Path, line: bytes, key: str
) -> None:
    """Issue #30 case 14: JSON readers keep the last of two equal keys, so the
    first value was dropped without a word."""
    path = tmp_path / "i.jsonl"
    path.write_bytes(b'{"id": "z"}\n' + line + b"\n")
    with pytest.raises(EvalReplayError) as info:
        load_instances(path, tmp_path)
    message = str(info.value)
    assert message.startswith(f"{path}:2: key {key} appears twice in one object")
    assert "keep one of them" in message


def test_colons_inside_strings_are_no_duplicate_keys(tmp_path: Path) -> None:
    path = tmp_path / "i.jsonl"
    row = {"id": "a", "q": "at 10:30, see http://x:8", "m": {"k": "a:b", "j": [{"t": ":"}]}}
    path.write_bytes(orjson.dumps(row) + b"\n")
    assert load_instances(path, tmp_path) == [row]
