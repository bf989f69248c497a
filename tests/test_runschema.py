"""The run dir's schema: the rows as the plugin writes them, byte for byte,
and one set of checks behind both readers, so replay and compare say the
same thing (file:line, field, fix) about the same malformed file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from pytest_evalreplay.formats import load
from pytest_evalreplay.model import EvalReplayError, Request
from pytest_evalreplay.rundir.snapshot import load_run_dir
from pytest_evalreplay.rundir.writer import write_manifest
from pytest_evalreplay.storage.runschema import (
    FORMAT,
    REQUEST_FIELDS,
    prediction_row,
    read_manifest,
    request_row,
    request_row_of,
    rollouts_of,
    task_files,
)


def test_a_requests_row_has_the_six_fields_in_order_and_extras_only_when_set() -> None:
    content = {"request_type": "generate", "context": "Q?", "system_prompt": None, "sampling": {"seed": 1}}
    row = request_row("a", 1, content, 2)
    assert tuple(row) == REQUEST_FIELDS
    assert orjson.dumps(row) == (
        b'{"instance_id":"a","request_type":"generate","context":"Q?","system_prompt":null,'
        b'"num_samples":2,"sampling":{"seed":1}}'
    )
    staged = request_row("a", 3, {**content, "images": [], "tools": [{"name": "calc"}]}, 1)
    assert list(staged)[6:] == ["tools", "stage"]
    assert staged["stage"] == 3


def test_the_row_of_a_request_is_the_row_of_its_content() -> None:
    request = Request(task="t", instance_id="q", context=[{"role": "user", "content": "hi"}], num_samples=3)
    assert request_row_of(request) == {
        "instance_id": "q",
        "request_type": "generate",
        "context": [{"role": "user", "content": "hi"}],
        "system_prompt": None,
        "num_samples": 3,
        "sampling": {},
    }


def test_a_predictions_row_keeps_a_failed_sample_and_says_which_rollouts_it_holds() -> None:
    gens = [{"text": "x"}, {"text": "y"}]
    row = prediction_row("a", 2, "m", gens, [{"acc": 1.0}, None], [1, 3], 4)
    assert orjson.dumps(row) == (
        b'{"instance_id":"a","model":"m","generations":[{"text":"x"},{"text":"y"}],'
        b'"scores":{"acc":1.0},"sample_scores":[{"acc":1.0},null],"stage":2,"rollouts":[1,3]}'
    )
    whole = prediction_row("a", 1, None, gens, [{"acc": 1.0}, {"acc": 0.0}], [0, 1], 2)
    assert "stage" not in whole and "rollouts" not in whole
    assert whole["scores"] == {"acc": 0.5}


def test_rollouts_default_to_the_generations_order_and_must_be_distinct() -> None:
    assert rollouts_of(None, 3, "f:1") == (0, 1, 2)
    assert rollouts_of([2, 0], 2, "f:1") == (2, 0)
    with pytest.raises(EvalReplayError, match=r"^f:1: 'rollouts' must list one distinct sample index"):
        rollouts_of([1, 1], 2, "f:1")


def test_the_manifest_the_plugin_writes_is_the_one_the_readers_read(tmp_path: Path) -> None:
    assert read_manifest(tmp_path / "manifest.json") is None
    write_manifest(tmp_path, "m", {"kind": "x"}, ["b", "a"])
    manifest = read_manifest(tmp_path / "manifest.json")
    assert manifest is not None and (manifest.model, manifest.tasks) == ("m", ("a", "b"))
    assert orjson.loads((tmp_path / "manifest.json").read_bytes())["format"] == FORMAT == "evalreplay/1"


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"model": "m"}, "run dir format None, and this version of pytest-evalreplay reads 'evalreplay/1'"),
        ({"format": FORMAT, "tasks": ["../x"]}, "'tasks' must be a list of task names"),
        ({"format": FORMAT, "model": 7}, "'model' must be a string or null, got a number"),
    ],
)
def test_a_bad_manifest_names_itself(tmp_path: Path, doc: dict[str, Any], expected: str) -> None:
    path = tmp_path / "manifest.json"
    path.write_bytes(orjson.dumps(doc))
    with pytest.raises(EvalReplayError) as info:
        read_manifest(path)
    assert str(info.value).startswith(f"{path}: {expected}"), str(info.value)


# -- replay and compare read with the same checks -----------------------------


def run_dir(root: Path, requests: list[Any], predictions: list[Any], manifest: Any = None) -> Path:
    """A one-task run dir, as far as both readers look at it."""
    files = task_files(root, "t")
    dump = lambda rows: b"".join(orjson.dumps(r) + b"\n" for r in rows)  # noqa: E731
    files["requests"].write_bytes(dump(requests))
    files["predictions"].write_bytes(dump(predictions))
    files["metrics"].write_bytes(orjson.dumps({"task": "t", "metrics": {"acc": 1.0}}))
    doc = {"format": "evalreplay/1", "model": "m", "tasks": ["t"]} if manifest is None else manifest
    (root / "manifest.json").write_bytes(orjson.dumps(doc))
    return root


REQUEST = {
    "instance_id": "a",
    "request_type": "generate",
    "context": "Q?",
    "system_prompt": None,
    "num_samples": 1,
    "sampling": {},
}
PREDICTION = {"instance_id": "a", "model": "m", "generations": [{"text": "x"}], "scores": {"acc": 1.0}}


def messages(root: Path) -> tuple[str, str]:
    """What replay (`formats.load`) and compare (`load_run_dir`) say about a run dir."""
    said = []
    for read in (load, load_run_dir):
        with pytest.raises(EvalReplayError) as info:
            read(root)
        said.append(str(info.value))
    return said[0], said[1]


def test_a_good_run_dir_reads_the_same_both_ways(tmp_path: Path) -> None:
    root = run_dir(tmp_path, [REQUEST], [PREDICTION])
    assert load(root).model == "m" and len(load(root)) == 1
    assert load_run_dir(root).tasks["t"].scores == {"a": {"acc": 1.0}}


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("stage", "2", "'stage' must be a positive integer, got a string"),
        ("stage", 0, "'stage' must be a positive integer, got a number (0)"),
        ("instance_id", 7, "'instance_id' must be a string, got a number"),
        ("generations", "x", "'generations' must be a list, got a string"),
        ("model", 7, "'model' must be a string or null, got a number"),
    ],
)
def test_a_bad_predictions_row_gets_one_message_from_both_readers(
    tmp_path: Path, field: str, value: Any, expected: str
) -> None:
    root = run_dir(
        tmp_path, [REQUEST, {**REQUEST, "instance_id": "b"}], [PREDICTION, {**PREDICTION, field: value}]
    )
    replay, compare = messages(root)
    assert replay == compare
    assert replay.startswith(f"{root / 't-predictions.jsonl'}:2: {expected}"), replay


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"instance_id": "b"}, "a requests row needs its 'context'"),
        ({**REQUEST, "stage": -1}, "'stage' must be a positive integer, got a number (-1)"),
        ({**REQUEST, "system_prompt": ["s"]}, "'system_prompt' must be a string or null, got a list"),
    ],
)
def test_a_bad_requests_row_gets_one_message_from_both_readers(
    tmp_path: Path, row: dict[str, Any], expected: str
) -> None:
    root = run_dir(tmp_path, [REQUEST, row], [PREDICTION])
    replay, compare = messages(root)
    assert replay == compare
    assert replay.startswith(f"{root / 't-requests.jsonl'}:2: {expected}"), replay


def test_a_manifest_of_another_format_gets_one_message_from_both_readers(tmp_path: Path) -> None:
    root = run_dir(tmp_path, [REQUEST], [PREDICTION], manifest={"format": "evalreplay/2", "tasks": ["t"]})
    replay, compare = messages(root)
    assert replay == compare
    assert replay.startswith(f"{root / 'manifest.json'}: run dir format 'evalreplay/2', and this version")
