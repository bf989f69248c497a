"""Fuzzing the readers of the other harnesses' multiple-choice saves and of
inspect_ai `.eval` logs: one field of a valid lm-eval or olmo-eval
loglikelihood row given any value, and `.eval` archives built from edited
samples, damaged, cut short, or holding members zipfile cannot unpack. Each
must load (and serve) or be an EvalReplayError naming a file under the path
given; nothing else may escape (the helpers are tests/test_fuzz_readers.py's)."""

from __future__ import annotations

import io
import zipfile
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_fuzz_readers import (
    _WRONG,
    FUZZ,
    _id,
    _set,
    _text,
    check_call,
    check_replay,
    directory,
    json_values,
    jsonl,
    rows,
)

from pytest_evalreplay.formats import inspect_ai, lm_eval, olmo_eval
from pytest_evalreplay.model import EvalReplayError

_LM_CHOICE = {
    "doc_id": 0,
    "arguments": {
        "gen_args_0": {"arg_0": "Q?", "arg_1": " a"},
        "gen_args_1": {"arg_0": "Q?", "arg_1": " b"},
    },
    "resps": [[["-1.5", "False"]], [[-2.0, True]]],
    "filtered_resps": [["-1.5", "False"], [-2.0, True]],
}
_LM_CHOICE_FIELDS = [
    ("doc_id",),
    ("arguments", "gen_args_1"),
    ("arguments", "gen_args_1", "arg_0"),
    ("arguments", "gen_args_1", "arg_1"),
    ("resps",),
    ("resps", 1),
    ("resps", 1, 0),
    ("resps", 0, 0, 0),
    ("resps", 0, 0, 1),
    ("resps", 1, 0, 0),
    ("resps", 1, 0, 1),
]


@FUZZ
@given(path=st.sampled_from(_LM_CHOICE_FIELDS), value=_WRONG | json_values, row=st.integers(0, 1))
def test_lm_eval_choice_row_one_field(path: tuple[Any, ...], value: Any, row: int) -> None:
    samples = [{**_LM_CHOICE, "doc_id": n} for n in range(2)]
    samples[1] = _set(samples[1], ("arguments", "gen_args_0", "arg_0"), "R?")
    samples[1] = _set(samples[1], ("arguments", "gen_args_1", "arg_0"), "R?")
    samples[row] = _set(samples[row], path, value)
    with directory() as root:
        (root / "samples_t.jsonl").write_bytes(jsonl(samples))
        check_replay(root, root)
        check_call(lambda: lm_eval.instances(root / "samples_t.jsonl"), root)


_OLMO_LL_FIELDS = {
    "olmo-eval": [
        ("request", "continuations"),
        ("request", "continuations", 1),
        ("request", "continuation_prompts"),
        ("request", "context"),
    ],
    "oe-eval": [("idx",), ("request", "continuation"), ("request_type",), ("doc_id",)],
    "predictions": [
        ("model_output",),
        ("model_output", 0),
        ("model_output", 0, "sum_logits"),
        ("model_output", 0, "is_greedy"),
        ("model_output", 1, "num_tokens"),
        ("native_id",),
    ],
}


def _olmo_ll_rows(layout: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Two documents of two choices each, in olmo-eval's (one row per
    document) or oe-eval's (one row per choice) requests layout."""
    requests = []
    for n in range(2):
        base = {"request_type": "loglikelihood", "doc_id": n, "native_id": f"n{n}", "label": 0}
        if layout == "olmo-eval":
            requests.append(
                {**base, "idx": 0, "request": {"context": f"Q {n}?", "continuations": [" a", " b"]}}
            )
        else:
            requests += [
                {**base, "idx": i, "request": {"context": f"Q {n}?", "continuation": c}}
                for i, c in enumerate((" a", " b"))
            ]
    outputs = [
        {"sum_logits": -1.0, "is_greedy": True, "num_tokens": 1},
        {"sum_logits": -2.0, "num_tokens": 1},
    ]
    predictions = [{"doc_id": n, "native_id": f"n{n}", "model_output": outputs} for n in range(2)]
    return requests, predictions


@FUZZ
@given(
    layout=st.sampled_from(["olmo-eval", "oe-eval"]),
    which=st.sampled_from(["requests", "predictions"]),
    data=st.data(),
    value=_WRONG | json_values,
    row=st.integers(0, 1),
)
def test_olmo_eval_loglikelihood_rows_one_field(
    layout: str, which: str, data: st.DataObject, value: Any, row: int
) -> None:
    requests, predictions = _olmo_ll_rows(layout)
    path = data.draw(st.sampled_from(_OLMO_LL_FIELDS[layout if which == "requests" else which]))
    target = requests if which == "requests" else predictions
    target[row] = _set(target[row], path, value)
    with directory() as root:
        (root / "t-requests.jsonl").write_bytes(jsonl(requests))
        (root / "t-predictions.jsonl").write_bytes(jsonl(predictions))
        check_replay(root, root)
        check_call(lambda: olmo_eval.instances(root / "t-requests.jsonl"), root)


# -- inspect_ai .eval logs -------------------------------------------------------

_content = _text | st.lists(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "text", "image"]), "text": _text}), max_size=2
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "user", "assistant", "tool"]), "content": _content},
    optional={"tool_calls": st.just([{"id": "c", "function": "f"}]), "id": _text},
)
_output = st.fixed_dictionaries(
    {
        "completion": _text | st.just("attachment://h"),
        "choices": st.lists(
            st.fixed_dictionaries({"stop_reason": st.sampled_from(["stop", "max_tokens"])}), max_size=1
        ),
    },
    optional={
        "usage": st.fixed_dictionaries(
            {"input_tokens": st.integers(0, 5), "output_tokens": st.integers(0, 5)}
        )
    },
)
SAMPLES = rows(
    {
        "id": _id,
        "epoch": st.integers(1, 2),
        "input": _text,
        "target": _text,
        "messages": st.lists(_message, max_size=4)
        | st.tuples(st.lists(_message, max_size=2), _message).map(
            lambda m: [*m[0], {"role": "user", "content": "Q"}, {**m[1], "role": "assistant"}]
        ),
        "output": _output,
    },
    {"attachments": st.just({"h": "long text"}), "error": st.none() | _text},
)
HEADERS = rows(
    {"version": st.just(2), "status": st.just("success"), "eval": st.fixed_dictionaries({"model": _text})}
)
STORED, DEFLATED, ZSTD = zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, 93


@st.composite
def eval_logs(draw: st.DrawFn) -> bytes:
    """A `.eval` archive: a header and samples (as JSON, as any bytes),
    members stored or deflated or marked zstd, maybe cut short; or any bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=200))
    members: list[tuple[str, bytes]] = []
    if draw(st.booleans()):
        members.append(
            (draw(st.sampled_from(["header.json", "_journal/start.json"])), orjson.dumps(draw(HEADERS)))
        )
    for n in range(draw(st.integers(0, 3))):
        body = draw(st.sampled_from(["json", "json", "json", "bytes"]))
        blob = orjson.dumps(draw(SAMPLES)) if body == "json" else draw(st.binary(max_size=40))
        members.append((f"samples/{n}_epoch_1.json", blob))
    method = draw(st.sampled_from([STORED, DEFLATED, DEFLATED, ZSTD]))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, blob in members:
            archive.writestr(name, blob, compress_type=STORED if method == ZSTD else method)
    data = buffer.getvalue()
    if method == ZSTD:  # zipfile cannot write zstd before 3.14: mark the stored members as zstd
        data = _marked(data, b"PK\x03\x04", 8)
        data = _marked(data, b"PK\x01\x02", 10)
    if draw(st.integers(0, 5)) == 0:
        data = data[: draw(st.integers(0, len(data)))]
    return data


def _marked(data: bytes, signature: bytes, offset: int) -> bytes:
    out = bytearray(data)
    at = out.find(signature)
    while at >= 0:
        out[at + offset : at + offset + 2] = ZSTD.to_bytes(2, "little")
        at = out.find(signature, at + 4)
    return bytes(out)


@FUZZ
@given(logs=st.lists(eval_logs(), min_size=1, max_size=2))
def test_inspect_eval_logs(logs: list[bytes]) -> None:
    with directory() as root:
        for n, data in enumerate(logs):
            (root / f"log{n}.eval").write_bytes(data)
        check_replay(root / "log0.eval", root)
        check_replay(root, root)
        check_call(lambda: inspect_ai.instances(root / "log0.eval"), root)


def _inspect_log(**output: Any) -> bytes:
    """A one-sample `.eval` log, valid but for what `output` changes."""
    sample: dict[str, Any] = {
        "id": "a",
        "epoch": 1,
        "input": "Q",
        "target": "A",
        "messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
        "output": {"completion": "A", "choices": [{"stop_reason": "stop"}], **output},
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("samples/a_epoch_1.json", orjson.dumps(sample))
    return buffer.getvalue()


def test_a_valid_inspect_sample_survives_the_strategy() -> None:
    """The strategy's shapes are the reader's: an unedited sample loads."""
    with directory() as root:
        (root / "log.eval").write_bytes(_inspect_log())
        assert [i["id"] for i in inspect_ai.instances(root / "log.eval")] == ["a"]


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (
            {"choices": [{"stop_reason": 7}]},
            "'output.choices[0].stop_reason' must be a string or null, got a number (7)",
        ),
        (
            {"usage": {"input_tokens": -1}},
            "'output.usage.input_tokens' must be a non-negative integer or null, got a number (-1)",
        ),
    ],
)
def test_an_inspect_field_of_the_wrong_type_names_the_member(output: dict[str, Any], expected: str) -> None:
    """A sample's bad field reads as `rowfields.bad_field`'s message, with a
    zip member's advice in place of a line's."""
    with directory() as root:
        (root / "log.eval").write_bytes(_inspect_log(**output))
        with pytest.raises(EvalReplayError) as info:
            inspect_ai.instances(root / "log.eval")
    assert str(info.value) == (
        f"{root / 'log.eval'}:samples/a_epoch_1.json: {expected}; this member of the .eval log is "
        "damaged (written by hand?): write the log again with inspect_ai, or delete the member"
    )
