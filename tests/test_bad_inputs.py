"""Every reader of saved data on bad input: a valid result, or an
EvalReplayError (at load) / GenerationError (at serving) naming the file, the
line and the field, and what to do. Never another exception, never a silent
drop without a count. Each test is one entry of the bad-input catalogue."""

from __future__ import annotations

import gzip
import re
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from unreadable import Unreadable

from pytest_evalreplay import EvalReplayError, GenerationError, Request
from pytest_evalreplay.formats import load
from pytest_evalreplay.providers.replay import ReplayProvider
from pytest_evalreplay.rundir.baseline import read as read_baseline
from pytest_evalreplay.storage.runschema import request_row_of


def dump(*rows: Any) -> bytes:
    return b"".join((r if isinstance(r, bytes) else orjson.dumps(r)) + b"\n" for r in rows)


def req(iid: str = "a", context: Any = None, **kw: Any) -> Request:
    return Request(task="t", instance_id=iid, context=f"Q {iid}?" if context is None else context, **kw)


def pred(iid: str = "a", *texts: str, **extra: Any) -> dict[str, Any]:
    gens = [
        {"text": t, "finish_reason": "stop", "prompt_tokens": 3, "completion_tokens": 1}
        for t in texts or ("x",)
    ]
    return {"instance_id": iid, "model": "m", "generations": gens, "scores": {}, **extra}


def run_dir(tmp: Path, requests: bytes, predictions: bytes) -> Path:
    (tmp / "t-requests.jsonl").write_bytes(requests)
    (tmp / "t-predictions.jsonl").write_bytes(predictions)
    return tmp


def load_error(path: Path) -> str:
    with pytest.raises(EvalReplayError) as info:
        ReplayProvider.from_path(path)
    return str(info.value)


def served(path: Path, request: Request) -> Any:
    (result,) = ReplayProvider.from_path(path).generate([request])
    return result


def failure(path: Path, request: Request) -> str:
    result = served(path, request)
    assert isinstance(result, GenerationError) and not result.retryable, result
    return result.message


# -- our run dir: the files -----------------------------------------------------


def test_empty_files_load_as_no_saves(tmp_path: Path) -> None:
    provider = ReplayProvider.from_path(run_dir(tmp_path, b"", b""))
    assert len(provider.index) == 0
    assert "holds 0 saved prompts" in failure(tmp_path, req())


def test_predictions_with_an_empty_requests_file_name_the_row(tmp_path: Path) -> None:
    path = run_dir(tmp_path, b"", dump(pred()))
    message = load_error(path)
    assert (
        f"{path / 't-predictions.jsonl'}:1: predictions row for instance 'a' (stage 1) has no row" in message
    )


def test_a_byte_order_mark_is_ignored(tmp_path: Path) -> None:
    bom = b"\xef\xbb\xbf"
    path = run_dir(tmp_path, bom + dump(request_row_of(req())), bom + dump(pred("a", "yes")))
    (tmp_path / "manifest.json").write_bytes(bom + b'{"format": "evalreplay/1", "model": "m"}')
    assert [g.text for g in served(path, req())] == ["yes"]


def test_crlf_line_endings_and_blank_lines_are_read(tmp_path: Path) -> None:
    requests = dump(request_row_of(req("a", "A")), request_row_of(req("b", "B"))).replace(b"\n", b"\r\n")
    predictions = b"\n" + dump(pred("a", "x"), pred("b", "y")).replace(b"\n", b"\r\n\n")
    path = run_dir(tmp_path, requests, predictions)
    assert [
        [g.text for g in r] for r in ReplayProvider.from_path(path).generate([req("a", "A"), req("b", "B")])
    ] == [
        ["x"],
        ["y"],
    ]


def test_invalid_utf8_in_a_requests_row_names_its_line(tmp_path: Path) -> None:
    bad = orjson.dumps(request_row_of(req("b", "B"))).replace(b'"B"', b'"\xff"')
    path = run_dir(tmp_path, dump(request_row_of(req()), bad), dump(pred(), pred("b")))
    assert f"{path / 't-requests.jsonl'}:2: not valid JSON (str is not valid UTF-8" in load_error(path)


def test_invalid_utf8_in_a_saved_text_fails_its_request_naming_the_line(tmp_path: Path) -> None:
    bad = orjson.dumps(pred("b", "B")).replace(b'"B"', b'"\xff"')
    path = run_dir(
        tmp_path, dump(request_row_of(req()), request_row_of(req("b", "B"))), dump(pred("a", "ok"), bad)
    )
    a, b = ReplayProvider.from_path(path).generate([req(), req("b", "B")])
    assert [g.text for g in a] == ["ok"]
    assert isinstance(b, GenerationError)
    assert f"{path / 't-predictions.jsonl'}:2: not valid JSON (str is not valid UTF-8" in b.message


@pytest.mark.parametrize("line", [b"7", b"[1, 2]", b'"row"', b"null", b"true"])
@pytest.mark.parametrize("which", ["requests", "predictions"])
def test_a_line_that_is_not_an_object_names_its_line(tmp_path: Path, which: str, line: bytes) -> None:
    requests = dump(request_row_of(req()), line if which == "requests" else request_row_of(req("b")))
    predictions = dump(pred(), line if which == "predictions" else pred("b"))
    path = run_dir(tmp_path, requests, predictions)
    message = load_error(path)
    assert f"{path / f't-{which}.jsonl'}:2: a {which} row must be a JSON object, got " in message


@pytest.mark.parametrize("value", [["Be brief."], {"text": "Be brief."}, 3])
def test_a_system_prompt_that_is_not_a_string_names_the_field(tmp_path: Path, value: Any) -> None:
    # Once an INTERNALERROR: "unhashable type: 'list'".
    row = {**request_row_of(req("b")), "system_prompt": value}
    path = run_dir(tmp_path, dump(request_row_of(req()), row), dump(pred(), pred("b")))
    message = load_error(path)
    assert f"{path / 't-requests.jsonl'}:2: 'system_prompt' must be a string or null, got " in message


@pytest.mark.parametrize(
    ("which", "field", "value", "expected"),
    [
        ("requests", "instance_id", ["a"], "'instance_id' must be a string, got a list"),
        ("requests", "instance_id", 7, "'instance_id' must be a string, got a number"),
        ("requests", "context", 7, "'context' must be a string or a list of chat messages, got a number"),
        ("requests", "context", {"role": "user"}, "'context' must be a string or a list of chat messages"),
        (
            "requests",
            "request_type",
            None,
            "'request_type' must be 'generate', 'loglikelihood' or 'loglikelihood_rolling', got null",
        ),
        ("requests", "stage", "2", "'stage' must be a positive integer, got a string"),
        ("requests", "stage", 0, "'stage' must be a positive integer, got a number (0)"),
        ("requests", "stage", True, "'stage' must be a positive integer, got a boolean"),
        ("requests", "images", "cat.png", "'images' must be a list or null, got a string"),
        ("predictions", "instance_id", ["b"], "'instance_id' must be a string, got a list"),
        ("predictions", "generations", {"text": "x"}, "'generations' must be a list, got an object"),
        ("predictions", "generations", "x", "'generations' must be a list, got a string"),
        ("predictions", "model", 7, "'model' must be a string or null, got a number"),
        ("predictions", "stage", -1, "'stage' must be a positive integer, got a number (-1)"),
    ],
)
def test_a_field_of_the_wrong_type_is_named_at_load(
    tmp_path: Path, which: str, field: str, value: Any, expected: str
) -> None:
    rows = {"requests": [request_row_of(req()), request_row_of(req("b"))], "predictions": [pred(), pred("b")]}
    rows[which][1] = {**rows[which][1], field: value}
    path = run_dir(tmp_path, dump(*rows["requests"]), dump(*rows["predictions"]))
    message = load_error(path)
    assert f"{path / f't-{which}.jsonl'}:2: {expected}" in message, message


@pytest.mark.parametrize(
    ("generation", "expected"),
    [
        ({"text": 7}, "'generations[0].text' must be a string, got a number"),
        ({"text": None}, "'generations[0].text' must be a string, got null"),
        ("just text", "generations[0] must be a JSON object, got a string"),
        (
            {"text": "x", "completion_tokens": "5"},
            "'generations[0].completion_tokens' must be a non-negative integer",
        ),
        (
            {"text": "x", "prompt_tokens": True},
            "'generations[0].prompt_tokens' must be a non-negative integer",
        ),
        (
            {"text": "x", "completion_tokens": -3},
            "'generations[0].completion_tokens' must be a non-negative integer or null, got a number (-3)",
        ),
        (
            {"text": "x", "completion_tokens": 1.5},
            "'generations[0].completion_tokens' must be a non-negative integer or null, got a number (1.5)",
        ),
        ({"text": "x", "original_text": ["y"]}, "'generations[0].original_text' must be a string or null"),
        ({"text": "x", "finish_reason": 0}, "'generations[0].finish_reason' must be a string or null"),
        ({"text": "x", "metadata": "fast"}, "'generations[0].metadata' must be an object or null"),
    ],
)
def test_a_malformed_generation_fails_its_request_naming_line_and_field(
    tmp_path: Path, generation: Any, expected: str
) -> None:
    row = {**pred("b"), "generations": [generation]}
    path = run_dir(
        tmp_path, dump(request_row_of(req()), request_row_of(req("b"))), dump(pred("a", "ok"), row)
    )
    a, b = ReplayProvider.from_path(path).generate([req(), req("b")])
    assert [g.text for g in a] == ["ok"]
    assert isinstance(b, GenerationError) and not b.retryable
    assert f"{path / 't-predictions.jsonl'}:2: {expected}" in b.message, b.message


@pytest.mark.parametrize(
    ("rollouts", "texts"),
    [([0, 0], ("x", "y")), ([0], ("x", "y")), ("0", ("x",)), ([-1], ("x",)), ([True], ("x",))],
)
def test_bad_rollouts_fail_the_request(tmp_path: Path, rollouts: Any, texts: tuple[str, ...]) -> None:
    path = run_dir(
        tmp_path, dump(request_row_of(req(num_samples=2))), dump(pred("a", *texts, rollouts=rollouts))
    )
    message = failure(path, req(num_samples=2))
    assert (
        f"{path / 't-predictions.jsonl'}:1: 'rollouts' must list one distinct sample index per generation"
        in message
    )


def test_an_escaped_or_doubled_key_cannot_mislead_the_fast_read(tmp_path: Path) -> None:
    # The prefix says instance "a"; a second "instance_id" key says "b".
    doubled = orjson.dumps(pred("a"))[:-1] + b',"instance_id":"b"}'
    escaped = orjson.dumps(pred("c"))[:-1] + b',"st\\u0061ge":2}'
    path = run_dir(
        tmp_path, dump(request_row_of(req()), request_row_of(req("c", "C"))), dump(doubled, escaped)
    )
    for request in (req(), req("c", "C")):
        assert "reads differently in full than in its first fields" in failure(path, request)


def test_ids_with_newlines_and_carriage_returns_join(tmp_path: Path) -> None:
    ids = ["a\nb", "c\r", "\r\n"]
    path = run_dir(
        tmp_path,
        dump(*(request_row_of(req(i, f"Q{n}")) for n, i in enumerate(ids))),
        dump(*(pred(i, f"A{n}") for n, i in enumerate(ids))),
    )
    results = ReplayProvider.from_path(path).generate([req(i, f"Q{n}") for n, i in enumerate(ids)])
    assert [[g.text for g in r] for r in results] == [["A0"], ["A1"], ["A2"]]


def test_lone_surrogates_are_refused_with_their_line(tmp_path: Path) -> None:
    bad = orjson.dumps(request_row_of(req("b"))).replace(b'"Q b?"', b'"Q\\ud800?"')
    path = run_dir(tmp_path, dump(request_row_of(req()), bad), dump(pred(), pred("b")))
    message = load_error(path)
    assert f"{path / 't-requests.jsonl'}:2: not valid JSON (" in message and "surrogate" in message


def test_a_request_whose_context_cannot_be_json_fails_alone(tmp_path: Path) -> None:
    path = run_dir(tmp_path, dump(request_row_of(req())), dump(pred()))
    message = failure(path, req("a", [{"role": "user", "content": "\ud800"}]))
    assert message.startswith("replay: this request's context cannot be written as JSON")


# -- our run dir: paths -------------------------------------------------------


def test_a_missing_requests_file_says_to_copy_it(tmp_path: Path) -> None:
    (tmp_path / "t-predictions.jsonl").write_bytes(dump(pred()))
    assert "no t-requests.jsonl beside it" in load_error(tmp_path)
    assert "no t-requests.jsonl beside it" in load_error(tmp_path / "t-predictions.jsonl")


@pytest.mark.parametrize("which", ["requests", "predictions", "manifest.json"])
def test_a_directory_where_a_file_belongs_is_named(tmp_path: Path, which: str) -> None:
    run_dir(tmp_path, dump(request_row_of(req())), dump(pred()))
    name = which if which.endswith(".json") else f"t-{which}.jsonl"
    target = tmp_path / name
    target.unlink(missing_ok=True)
    target.mkdir()
    message = load_error(tmp_path)
    assert message.startswith(str(target)), message
    assert "directory" in message


@pytest.mark.parametrize("which", ["requests", "predictions", "manifest.json", "run dir"])
def test_an_unreadable_file_or_directory_is_named(tmp_path: Path, unreadable: Unreadable, which: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    run_dir(run, dump(request_row_of(req())), dump(pred()))
    (run / "manifest.json").write_bytes(b'{"format": "evalreplay/1", "model": "m"}')
    target = {"run dir": run, "manifest.json": run / "manifest.json"}.get(which, run / f"t-{which}.jsonl")
    unreadable(target)
    message = load_error(run)
    assert message.startswith(f"{target}: cannot "), message
    assert "Permission denied (check its permissions)" in message, message


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        (b"{oops", "manifest.json: not valid JSON"),
        (b"[]", "manifest.json: a run dir manifest must be a JSON object, got a list"),
        (b'{"format": "evalreplay/2"}', "manifest.json: run dir format 'evalreplay/2', and this version"),
        (b'{"format": "evalreplay/1", "model": ["m"]}', "manifest.json: 'model' must be a string or null"),
    ],
)
def test_a_bad_manifest_is_named(tmp_path: Path, manifest: bytes, expected: str) -> None:
    run_dir(tmp_path, dump(request_row_of(req())), dump(pred()))
    (tmp_path / "manifest.json").write_bytes(manifest)
    assert expected in load_error(tmp_path)


@pytest.mark.slow  # 200 MB written and read three times
def test_a_200_mb_single_line_is_read_or_refused_quickly(tmp_path: Path) -> None:
    big = "x" * (200 << 20)
    path = run_dir(
        tmp_path,
        dump(request_row_of(req()), request_row_of(req("b"))),
        dump(pred("a", big), pred("b", "small")),
    )
    start = time.monotonic()
    provider = ReplayProvider.from_path(path)
    a, b = provider.generate([req(), req("b")])
    assert len(a[0].text) == 200 << 20 and b[0].text == "small"
    del a, provider
    # the same line torn in the middle: one message naming it, not a crash
    data = (path / "t-predictions.jsonl").read_bytes()
    (path / "t-predictions.jsonl").write_bytes(data[: 100 << 20] + b"\n" + dump(pred("b", "small")))
    assert "not valid JSON" in failure(path, req()) or "not valid JSON" in load_error(path)
    (path / "t-requests.jsonl").write_bytes(b'{"instance_id": "a", "context": "' + b"y" * (200 << 20) + b"\n")
    assert f"{path / 't-requests.jsonl'}:1: not valid JSON" in load_error(path)
    assert time.monotonic() - start < 600  # a guard against a hang, not a timing test


# -- olmo-eval ------------------------------------------------------------------


def olmo_request(doc_id: Any, context: Any = "Q?", **request: Any) -> dict[str, Any]:
    return {"request_type": "generate_until", "doc_id": doc_id, "request": {"context": context, **request}}


def olmo_prediction(doc_id: Any, *texts: str) -> dict[str, Any]:
    return {
        "doc_id": doc_id,
        "native_id": f"n{doc_id}",
        "model_output": [{"text": t} for t in texts or ("x",)],
    }


def olmo_tree(root: Path, requests: bytes | None, predictions: bytes) -> Path:
    (root / "predictions" / "m").mkdir(parents=True)
    file = root / "predictions" / "m" / "t-predictions.jsonl"
    file.write_bytes(predictions)
    if requests is not None:
        (root / "requests" / "m").mkdir(parents=True)
        (root / "requests" / "m" / "t-requests.jsonl").write_bytes(requests)
    return file


def test_olmo_eval_predictions_without_requests_dir(tmp_path: Path) -> None:
    file = olmo_tree(tmp_path, None, dump(olmo_prediction(0)))
    assert "an olmo-eval results dir with predictions/ but no requests/ beside it" in load_error(tmp_path)
    message = load_error(file)
    assert message.startswith(f"{file}: no ") and "requests file" in message
    assert "requests file" in load_error(file.parent)


def test_olmo_eval_empty_predictions_load_as_no_saves(tmp_path: Path) -> None:
    olmo_tree(tmp_path, dump(olmo_request(0)), b"")
    assert len(load(tmp_path)) == 0


@pytest.mark.parametrize(
    ("which", "row", "expected"),
    [
        ("requests", 7, "an olmo-eval requests row must be a JSON object, got a number"),
        ("requests", {"doc_id": 1}, "an olmo-eval requests row needs 'doc_id', 'request_type' and 'request'"),
        ("requests", olmo_request([1]), "'doc_id' must be an integer or a string, got a list"),
        ("requests", olmo_request(1.5), "'doc_id' must be an integer or a string, got a number"),
        ("requests", {**olmo_request(1), "request": "Q?"}, "'request' must be a JSON object, got a string"),
        ("requests", olmo_request(1, 5), "'request.context' must be a string or a list of chat messages"),
        (
            "requests",
            olmo_request(1, system_prompt=["s"]),
            "'request.system_prompt' must be a string or null",
        ),
        ("requests", {**olmo_request(1), "request_type": None}, "'request_type' must be a string"),
        ("predictions", [1], "an olmo-eval predictions row must be a JSON object, got a list"),
        ("predictions", {"doc_id": 1}, "an olmo-eval predictions row needs 'doc_id' and 'model_output'"),
        (
            "predictions",
            {"doc_id": 1, "model_output": "x"},
            "'model_output' must be a list (one entry per sample)",
        ),
        (
            "predictions",
            {**olmo_prediction(1), "doc_id": {"a": 1}},
            "'doc_id' must be an integer or a string",
        ),
        ("predictions", olmo_prediction(9), "doc_id 9 has no generate row in"),
    ],
)
def test_olmo_eval_bad_rows_name_line_and_field(tmp_path: Path, which: str, row: Any, expected: str) -> None:
    rows = {
        "requests": [olmo_request(0), olmo_request(1)],
        "predictions": [olmo_prediction(0), olmo_prediction(1)],
    }
    rows[which][1] = row
    file = olmo_tree(tmp_path, dump(*rows["requests"]), dump(*rows["predictions"]))
    where = file if which == "predictions" else tmp_path / "requests" / "m" / "t-requests.jsonl"
    message = load_error(tmp_path)
    assert f"{where}:2: {expected}" in message, message


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (
            {"sum_logits": -1.0},
            "'model_output[0].text' must be a string (or 'continuation', oe-eval's name), got null",
        ),
        ("x", "model_output[0] must be a JSON object, got a string"),
        (
            {"text": "x", "num_tokens": "7"},
            "'model_output[0].num_tokens' must be a non-negative integer or null",
        ),
        ({"text": "x", "original_text": 1}, "'model_output[0].original_text' must be a string or null"),
    ],
)
def test_olmo_eval_bad_outputs_fail_their_request(tmp_path: Path, output: Any, expected: str) -> None:
    row = {**olmo_prediction(0), "model_output": [output]}
    file = olmo_tree(tmp_path, dump(olmo_request(0)), dump(row))
    assert f"{file}:1: {expected}" in failure(tmp_path, req("a", "Q?"))


# -- lm-evaluation-harness ------------------------------------------------------


def lm_row(doc_id: Any = 0, context: Any = "Q?", resps: Any = None) -> dict[str, Any]:
    return {
        "doc_id": doc_id,
        "arguments": {"gen_args_0": {"arg_0": context, "arg_1": {"until": ["\n"]}}},
        "resps": [["x"]] if resps is None else resps,
        "filter": "none",
    }


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"doc_id": 0, "resps": [["x"]]}, "an lm-eval samples row needs 'arguments', and this one has none"),
        (
            {k: v for k, v in lm_row().items() if k != "resps"},
            "an lm-eval samples row needs 'resps' (the generations), and this one has none",
        ),
        ({"arguments": {}, "resps": []}, "an lm-eval samples row needs 'doc_id'"),
        (lm_row([0]), "'doc_id' must be an integer or a string, got a list"),
        (lm_row(resps="x"), "'resps' must be a non-empty list ([[text, ...]]), got a string"),
        (lm_row(resps=[]), "'resps' must be a non-empty list"),
        (lm_row(resps=[[1, 2]]), "'resps[0]' must be a list of generated texts, got a list"),
        (lm_row(context=5), "'arguments.gen_args_0.arg_0' must be the prompt (a string), got a number"),
        (
            {**lm_row(), "arguments": "Q?"},
            "'arguments' must be an object of gen_args_N (or a list), got a string",
        ),
        (
            {**lm_row(), "arguments": {"gen_args_0": ["Q?"]}},
            "'arguments.gen_args_0' must be an object of arg_N",
        ),
        ({**lm_row(), "arguments": {"first": {"arg_0": "Q?"}}}, "arguments has a key 'first'"),
        ({**lm_row(), "arguments": ["Q?"]}, "'arguments' must be a list of argument lists"),
        ("row", "an lm-eval samples row must be a JSON object, got a string"),
    ],
)
def test_lm_eval_bad_rows_name_line_and_field(tmp_path: Path, row: Any, expected: str) -> None:
    path = tmp_path / "samples_t_2025-01-31T10-20-30.123456.jsonl"
    path.write_bytes(dump(lm_row(1, "P"), row))
    message = load_error(path)
    assert f"{path}:2: {expected}" in message, message


def test_lm_eval_filters_that_disagree_on_the_texts_fail_naming_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "samples_t.jsonl"
    path.write_bytes(
        dump(lm_row(0, "Q?", [["4"]]), {**lm_row(0, "Q?", [["5"]]), "filter": "flexible-extract"})
    )
    message = failure(path, req("a", "Q?"))
    assert "conflicting saves" in message and f"{path}:1" in message and f"{path}:2" in message
    path.write_bytes(
        dump(lm_row(0, "Q?", [["4"]]), {**lm_row(0, "Q?", [["4"]]), "filter": "flexible-extract"})
    )
    assert [g.text for g in served(path, req("a", "Q?"))] == ["4"]


@pytest.mark.parametrize("layout", ["olmo-eval", "lm-eval"])
def test_foreign_files_with_a_byte_order_mark_are_read(tmp_path: Path, layout: str) -> None:
    bom = b"\xef\xbb\xbf"
    if layout == "lm-eval":
        path = tmp_path / "samples_t.jsonl"
        path.write_bytes(bom + dump(lm_row(0, "Q?", [["yes"]])))
    else:
        olmo_tree(tmp_path, bom + dump(olmo_request(0)), bom + dump(olmo_prediction(0, "yes")))
        path = tmp_path
    assert [g.text for g in served(path, req("a", "Q?"))] == ["yes"]


def test_lm_eval_gzipped_samples_are_read(tmp_path: Path) -> None:
    (tmp_path / "org__m").mkdir()
    path = tmp_path / "org__m" / "samples_t_2025-01-31T10-20-30.123456.jsonl.gz"
    path.write_bytes(gzip.compress(dump(lm_row(0, "Q?", [["yes"]]))))
    for where in (path, path.parent, tmp_path):
        provider = ReplayProvider.from_path(where)
        assert provider.model == "org__m"
        assert [g.text for g in provider.generate([req("a", "Q?")])[0]] == ["yes"]
    path.write_bytes(path.read_bytes()[:20])
    assert f"{path}: not a readable gzip file" in load_error(path)


def test_lm_eval_empty_samples_load_as_no_saves(tmp_path: Path) -> None:
    (tmp_path / "samples_t.jsonl").write_bytes(b"")
    assert len(load(tmp_path / "samples_t.jsonl")) == 0


# -- baselines ------------------------------------------------------------------


def baseline(tmp_path: Path, content: bytes) -> str:
    path = tmp_path / "baseline.json"
    path.write_bytes(content)
    with pytest.raises(EvalReplayError) as info:
        read_baseline(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "Traceback" not in message
    return message


def tasks(entry: Any) -> bytes:
    return orjson.dumps({"format": "evalreplay-baseline/1", "tasks": {"qa": entry}})


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "malformed JSON"),
        (b"{oops", "malformed JSON"),
        (b'"\xff"', "malformed JSON (str is not valid UTF-8"),
        (b"[]", "not an evalreplay-baseline/1 baseline"),
        (b"{}", 'not an evalreplay-baseline/1 baseline ("format" is null'),
        (
            b'{"format": "evalreplay-baseline/2", "tasks": {}}',
            "baseline format 'evalreplay-baseline/2', and this",
        ),
        (b'{"format": "evalreplay-baseline/1"}', "tasks: expected an object of task name -> entry, got null"),
        (
            b'{"format": "evalreplay-baseline/1", "tasks": []}',
            "tasks: expected an object of task name -> entry",
        ),
        (tasks([1]), 'tasks.qa: expected an object with "metrics", got a list'),
        (tasks({}), 'tasks.qa.metrics: a task entry needs a "metrics" object'),
        (tasks({"metrics": [0.5]}), 'tasks.qa.metrics: a task entry needs a "metrics" object'),
        (
            tasks({"metrics": {"exact_match": "0.5"}}),
            "tasks.qa.metrics.exact_match: expected a number, got a string",
        ),
        (
            tasks({"metrics": {"exact_match": True}}),
            "tasks.qa.metrics.exact_match: expected a number, got a boolean",
        ),
        (
            tasks({"metrics": {"exact_match": None}}),
            "tasks.qa.metrics.exact_match: expected a number, got null",
        ),
        (
            tasks({"metrics": {}, "scores": [1]}),
            "tasks.qa.scores: expected an object of instance id -> score",
        ),
        (
            tasks({"metrics": {}, "scores": {"q1": "1"}}),
            "tasks.qa.scores.q1: expected a number, got a string",
        ),
        (
            tasks({"metrics": {}, "metric": ["em"]}),
            "tasks.qa.metric: expected a metric name or null, got a list",
        ),
    ],
)
def test_a_malformed_baseline_names_file_and_field(tmp_path: Path, content: bytes, expected: str) -> None:
    message = baseline(tmp_path, content)
    assert expected in message, message
    assert "--evalreplay-update-baseline" in message


def test_a_baseline_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    path.write_bytes(b"\xef\xbb\xbf" + tasks({"metrics": {"em": 0.5}, "scores": {"q": 1}, "metric": "em"}))
    assert read_baseline(path)["qa"].scores == {"q": 1.0}


def test_a_baseline_directory_or_unreadable_file_is_named(tmp_path: Path, unreadable: Unreadable) -> None:
    path = tmp_path / "baseline.json"
    path.mkdir()
    assert "cannot read the baseline: Is a directory" in baseline_error(path)
    path.rmdir()
    path.write_bytes(tasks({"metrics": {}}))
    unreadable(path)
    assert "Permission denied (check its permissions)" in baseline_error(path)


def baseline_error(path: Path) -> str:
    with pytest.raises(EvalReplayError) as info:
        read_baseline(path)
    assert str(info.value).startswith(str(path))
    return str(info.value)


@pytest.mark.slow  # 200 MB written and read
def test_a_200_mb_baseline_line_is_refused_quickly(tmp_path: Path) -> None:
    message = baseline(tmp_path, b'{"format": "evalreplay-baseline/1", "tasks": {"' + b"q" * (200 << 20))
    assert "malformed JSON" in message and len(message) < 1000


# -- the one message of a miss ------------------------------------------------


def test_a_directory_named_like_a_predictions_file_is_not_skipped(tmp_path: Path) -> None:
    run_dir(tmp_path, dump(request_row_of(req())), dump(pred()))
    (tmp_path / "u-predictions.jsonl").mkdir()
    assert re.search(
        r"u-predictions\.jsonl: expected a predictions file here, found a directory", load_error(tmp_path)
    )
