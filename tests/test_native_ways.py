"""The two ways `formats.native` reads a run dir's file pair agree (its
docstring: "Two ways through a file pair, with the same result"): on
generated pairs, mostly as the plugin writes them and often edited (escaped,
repeated or stray keys, rows out of order or missing, other models, stages,
sampling, system prompts, prompts saved twice), the in-step way either gives
up with nothing left in the index, or indexes the same prompts to rows that
decode the same as the row-by-row way's (a row it vouched for by its first
fields and the general way refuses at load fails when decoded)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_evalreplay.formats import native
from pytest_evalreplay.formats.saved import IndexBuilder, SavedIndex, split_lines
from pytest_evalreplay.model import EvalReplayError

_ids = st.sampled_from(["a", "b", "q-1", "é", 'q"1', "x\\y", "t\tab", "0"])
_contexts = st.sampled_from(["What is 1 + 1?", "Say hi.", "é?", 'a "quoted" prompt'])
_systems = st.sampled_from([None, None, "Be brief.", "Be kind."])
_samplings = st.sampled_from([{}, {"temperature": 0.0}, {"temperature": 0.7, "max_tokens": 8}])
_models = st.sampled_from(["m", "m", "m", None, "other"])
_texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)

# Edits of one predictions row, as bytes after orjson wrote it: each is one
# the in-step way must refuse or see through.
_EDITS = ["none", "none", "none", "id twice", "model twice", "escaped id", "rollouts", "stray key", "spaces"]


@st.composite
def instance(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "id": draw(_ids),
        "stage": draw(st.sampled_from([1, 1, 1, 2])),
        "context": draw(_contexts),
        "system": draw(_systems),
        "sampling": draw(_samplings),
        "model": draw(_models),
        "texts": draw(st.lists(_texts, min_size=1, max_size=2)),
        "kind": draw(st.sampled_from(["generate", "generate", "generate", "loglikelihood"])),
        "edit": draw(st.sampled_from(_EDITS)),
    }


def request_line(i: dict[str, Any]) -> bytes:
    row: dict[str, Any] = {
        "instance_id": i["id"],
        "request_type": i["kind"],
        "context": i["context"],
        "system_prompt": i["system"],
        "num_samples": len(i["texts"]),
        "sampling": i["sampling"],
    }
    if i["kind"] == "loglikelihood":
        row["continuations"] = [" yes", " no"]
    if i["stage"] != 1:
        row["stage"] = i["stage"]
    return orjson.dumps(row)


def prediction_line(i: dict[str, Any]) -> bytes:
    generations = [{"text": t, "finish_reason": "stop", "prompt_tokens": None} for t in i["texts"]]
    if i["kind"] == "loglikelihood":
        generations = [{"text": "", "loglikelihoods": [[-0.5, True], [-2.0, False]]} for _ in i["texts"]]
    row: dict[str, Any] = {"instance_id": i["id"], "model": i["model"], "generations": generations}
    if i["stage"] != 1:
        row["stage"] = i["stage"]
    line = orjson.dumps(row)
    edit = i["edit"]
    if edit == "id twice":
        return line[:-1] + b',"instance_id":"zz"}'
    if edit == "model twice":
        return line[:-1] + b',"model":"zz"}'
    if edit == "escaped id" and i["id"] == "a":
        return line.replace(b'"instance_id":"a"', b'"instance_id":"\\u0061"', 1)
    if edit == "rollouts":
        return line[:-1] + b',"rollouts":' + orjson.dumps(list(range(1, len(i["texts"]) + 1))) + b"}"
    if edit == "stray key":
        return line[:-1] + b',"scores":{"acc":1.0}}'
    if edit == "spaces":
        return line.replace(b'":', b'": ')
    return line


def read_both(root: Path, requests: bytes, predictions: bytes) -> tuple[SavedIndex | None, Any]:
    """The in-step way's index (None where it gave up, checked to leave
    nothing), and the general way's (or the EvalReplayError it raised)."""
    path, requests_path = root / "t-predictions.jsonl", root / "t-requests.jsonl"
    path.write_bytes(predictions)
    requests_path.write_bytes(requests)
    in_step = IndexBuilder(source=path)
    with requests_path.open("rb") as file:
        took = native._load_in_step(in_step, path, "t", file, predictions)
    if not took:
        assert in_step.keys == {} and in_step.files == [] and in_step.models == {}
    general = IndexBuilder(source=path)
    try:
        native._load_general(
            general, path, requests_path, "t", split_lines(requests), split_lines(predictions)
        )
        general_index: Any = general.finish()
    except EvalReplayError as exc:
        general_index = exc
    return (in_step.finish() if took else None), general_index


def decoded(index: SavedIndex) -> dict[Any, list[Any]]:
    """Each indexed prompt's rows as decoded (an error as its message)."""
    out: dict[Any, list[Any]] = {}
    for key, slot in index.keys.items():
        rows = []
        for pos in [slot] if type(slot) is int else slot:
            try:
                rows.append(index.decode(pos))
            except EvalReplayError as exc:
                rows.append(("refused", str(exc)))
        out[key] = rows
    return out


DIFFERS = "reads differently in full than in its first fields"


def compare(in_step: SavedIndex | None, general: Any) -> None:
    """Same prompts, same rows; where they differ, only a row the in-step way
    vouched for by its first fields and refuses in full (as documented)."""
    if in_step is None:
        return  # the general way's result is the only one
    mine = decoded(in_step)
    vouched = [row for rows in mine.values() for row in rows if isinstance(row, tuple) and DIFFERS in row[1]]
    if isinstance(general, EvalReplayError):
        assert vouched, f"the general way refused ({general}) what the in-step way read"
        return
    theirs = decoded(general)
    assert mine.keys() == theirs.keys()
    for key, rows in mine.items():
        assert len(rows) == len(theirs[key])
        for a, b in zip(rows, theirs[key], strict=True):
            assert a == b or (isinstance(a, tuple) and DIFFERS in a[1]), (a, b)
    if not vouched:
        assert (in_step.model, in_step.skipped) == (general.model, general.skipped)


def pair(instances: list[dict[str, Any]], order: list[int], drop: bool) -> tuple[bytes, bytes]:
    requests = b"".join(request_line(i) + b"\n" for i in instances)
    shown = [instances[n] for n in order if n < len(instances)] or instances
    if drop and shown:
        shown = shown[:-1]
    return requests, b"".join(prediction_line(i) + b"\n" for i in shown)


@st.composite
def file_pair(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """Half the time a plain task's files as the plugin writes them (distinct
    ids and prompts, one model and stage, rows in step), one row maybe
    edited; else instances drawn each on its own, rows maybe out of order
    or one missing."""
    if draw(st.booleans()):
        mixed = draw(st.lists(instance(), min_size=1, max_size=6))
        return pair(mixed, draw(st.permutations(range(len(mixed)))), draw(st.booleans()))
    ids = draw(st.lists(st.text("abq-0é", min_size=1, max_size=3), min_size=1, max_size=6, unique=True))
    model, sampling = draw(_models), draw(_samplings)
    found = [
        {
            "id": iid,
            "stage": 1,
            "context": draw(_contexts) + " " + iid,
            "system": draw(_systems),
            "sampling": sampling if draw(st.integers(0, 9)) else draw(_samplings),
            "model": model,
            "texts": draw(st.lists(_texts, min_size=1, max_size=2)),
            "kind": "generate",
            "edit": "none",
        }
        for iid in ids
    ]
    if draw(st.booleans()):
        n = draw(st.integers(0, len(found) - 1))
        found[n] = {**found[n], "edit": draw(st.sampled_from(_EDITS))}
    return pair(found, list(range(len(found))), False)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=file_pair())
def test_the_in_step_way_and_the_general_way_read_a_file_pair_alike(files: tuple[bytes, bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        compare(*read_both(Path(tmp), *files))


def test_rows_as_the_plugin_writes_them_take_the_in_step_way() -> None:
    """The differential test compares something: plain rows are read in step."""
    plain = {"stage": 1, "system": None, "sampling": {}, "model": "m", "texts": ["hi"], "kind": "generate"}
    instances = [{**plain, "id": f"q{n}", "context": f"Q{n}?", "edit": "none"} for n in range(3)]
    with tempfile.TemporaryDirectory() as tmp:
        in_step, general = read_both(Path(tmp), *pair(instances, [0, 1, 2], False))
    assert in_step is not None and not isinstance(general, EvalReplayError)
    assert decoded(in_step) == decoded(general) and len(in_step.keys) == 3
