"""Fuzzing every reader of saved data: arbitrary bytes, arbitrary JSON values
(as lines and as whole files), and valid files with random edits. Each reader
must give a valid result or an EvalReplayError naming a file under the path it
was given; serving what was loaded must give generations or GenerationErrors.
Nothing else may escape: no TypeError, KeyError, UnicodeError, RecursionError."""

from __future__ import annotations

import copy
import gzip
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_evalreplay import EvalReplayError, Generation, GenerationError, Request
from pytest_evalreplay.formats import lm_eval, olmo_eval
from pytest_evalreplay.formats.instances import load_instances
from pytest_evalreplay.providers.replay import ReplayProvider
from pytest_evalreplay.rundir.baseline import read as read_baseline

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_scalar = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text
)
json_values = st.recursive(
    _scalar,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)
# A value for a field the readers look at: usually of a plausible shape, often not.
_id = st.sampled_from(["a", "b", "0", "q\nr", "\r"]) | st.integers(0, 2)


# Values of every JSON type, the usual suspects when a field has the wrong one.
_WRONG = st.sampled_from([None, True, 0, -1, 1.5, "", "x", [], ["x"], {}, {"x": 1}, [[1]]])


def perturbed(row: Any) -> st.SearchStrategy[Any]:
    """`row`, or (one time in five) `row` with one or two edits: a value
    (top-level fields most often) replaced by one of another type, a field
    deleted, or a stray key added."""
    paths = list(_paths(row, ()))
    top = [p for p in paths if len(p) == 1] or paths
    edit = st.tuples(
        st.sampled_from(top) | st.sampled_from(paths),
        st.sampled_from(["replace", "replace", "delete", "add"]),
        _WRONG | json_values,
        _text,
    )
    edits = st.lists(edit, min_size=1, max_size=2)
    # Most rows stay valid, so that one broken row is met among good ones.
    return (st.just([]) | st.just([]) | st.just([]) | st.just([]) | edits).map(lambda e: _apply(row, e))


def _paths(value: Any, at: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*at, i))


def _apply(row: Any, edits: list[tuple[tuple[Any, ...], str, Any, str]]) -> Any:
    row = orjson.loads(orjson.dumps(row))  # a deep copy
    for path, how, shared, key in edits:
        # A copy: hypothesis hands the same `_WRONG` object to many draws, and a
        # later edit writing into it made cycles (orjson: "Recursion limit").
        value = copy.deepcopy(shared)
        if not path:
            row = value if how == "replace" else row
            continue
        parent = row
        try:
            for step in path[:-1]:
                parent = parent[step]
            last = path[-1]
            if type(last) is not (str if isinstance(parent, dict) else int) or not isinstance(
                parent, (dict, list)
            ):
                continue  # an earlier edit changed the shape
            if how == "replace":
                parent[last] = value
            elif how == "delete":
                del parent[last]
            elif isinstance(parent, dict):
                parent[key] = value
        except (KeyError, IndexError, TypeError):
            pass  # an earlier edit changed the shape
    return row


def _lm_prompt(context: Any) -> Any:
    """lm-eval logs a chat prompt as [json of the messages]."""
    return context if isinstance(context, str) else [orjson.dumps(context).decode()]


def jsonl(rows: list[Any]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


@st.composite
def file_bytes(draw: st.DrawFn, rows: st.SearchStrategy[Any]) -> bytes:
    """A file: arbitrary bytes, JSON values one per line or as a whole, or
    plausible rows, each maybe edited at random positions."""
    kind = draw(st.sampled_from(["bytes", "values", "whole", "rows", "rows", "rows"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "values":
        data = jsonl(draw(st.lists(json_values, max_size=4)))
    elif kind == "whole":
        data = orjson.dumps(draw(json_values))
    else:
        data = jsonl(draw(st.lists(rows, max_size=5)))
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(data)))
        cut = draw(st.integers(0, 3))
        data = (
            data[:at]
            + draw(st.sampled_from([b"", b"\n", b"\xef\xbb\xbf", b"\xff", b'"', b"\\u", b"{", b"]"]))
            + data[at + cut :]
        )
    if draw(st.booleans()) and draw(st.booleans()):
        data = b"\xef\xbb\xbf" + data
    return data


def rows(fields: dict[str, Any], optional: dict[str, Any] | None = None) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(fields, optional=optional or {}).flatmap(perturbed)


_context = _text | st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": _text}), max_size=2)
_generation = st.fixed_dictionaries(
    {"text": _text},
    optional={
        "original_text": _text,
        "finish_reason": st.just("stop"),
        "prompt_tokens": st.integers(0, 5),
        "completion_tokens": st.integers(0, 5),
        "metadata": st.just({"k": 1}),
    },
)
REQUEST_ROWS = rows(
    {
        "instance_id": _id.map(str),
        "request_type": st.sampled_from(["generate", "generate", "loglikelihood"]),
        "context": _context,
        "system_prompt": st.none() | _text,
        "num_samples": st.integers(1, 2),
        "sampling": st.just({}),
    },
    {"stage": st.integers(1, 2), "images": st.just(["i.png"]), "tools": st.just([])},
)
PREDICTION_ROWS = rows(
    {
        "instance_id": _id.map(str),
        "model": st.sampled_from(["m", "m", None, "other"]),
        "generations": st.lists(_generation, min_size=1, max_size=2),
        "scores": st.just({}),
    },
    {"rollouts": st.lists(st.integers(0, 2), max_size=2), "stage": st.integers(1, 2)},
)
_continuations = st.lists(st.sampled_from([" a", " b", " c"]), min_size=1, max_size=3)
OLMO_REQUEST_ROWS = rows(
    {
        "doc_id": _id,
        "request_type": st.sampled_from(["generate_until", "generate_until", "loglikelihood"]),
        "request": st.fixed_dictionaries(
            {"context": _context},
            optional={
                "system_prompt": st.none() | _text,
                # olmo-eval: all of them (and for acc_uncond, the prompt of each); oe-eval: one per row
                "continuations": _continuations,
                "continuation_prompts": st.lists(st.sampled_from(["Answer:", "Q"]), max_size=3),
                "continuation": st.sampled_from([" a", " b"]),
            },
        ),
        "idx": st.integers(0, 2),
        "native_id": _id,
        "label": _text,
    }
)
_ll = st.floats(-50, 0) | st.integers(-3, 0) | st.just(-999)
OLMO_PREDICTION_ROWS = rows(
    {
        "doc_id": _id,
        "model_output": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "text": _text,
                    "continuation": _text,
                    "num_tokens": st.integers(0, 3),
                    "sum_logits": _ll,
                    "is_greedy": st.booleans(),
                },
            ),
            max_size=3,
        ),
    },
    {"native_id": _id},
)
LM_ROWS = rows(
    {
        "doc_id": _id,
        "arguments": st.fixed_dictionaries(
            {
                "gen_args_0": st.fixed_dictionaries(
                    {"arg_0": _context.map(_lm_prompt), "arg_1": st.just({"until": []})}
                )
            }
        )
        | st.lists(st.tuples(_text, _text).map(list), min_size=1, max_size=2),
        "resps": st.lists(st.lists(_text, max_size=2), min_size=1, max_size=2),
        "filter": st.sampled_from(["none", "strict-match"]),
        "target": _text,
    }
)


@st.composite
def _lm_choice_row(draw: st.DrawFn) -> dict[str, Any]:
    """A multiple-choice document: one (context, " " + choice) pair per choice,
    `resps` one [[loglikelihood, is_greedy]] per choice, as numbers or (lm-eval
    0.4.13) their strings."""
    context = draw(_text)
    choices = draw(_continuations)
    lls = draw(st.lists(_ll, min_size=len(choices), max_size=len(choices)))
    greedy = draw(st.lists(st.booleans(), min_size=len(choices), max_size=len(choices)))
    as_text = draw(st.booleans())
    resps = [[[str(ll), str(g)] if as_text else [ll, g]] for ll, g in zip(lls, greedy, strict=True)]
    return {
        "doc_id": draw(_id),
        "arguments": {f"gen_args_{i}": {"arg_0": context, "arg_1": c} for i, c in enumerate(choices)},
        "resps": resps,
        "filtered_resps": [r[0] for r in resps],
        "filter": "none",
        "target": draw(_text),
    }


LM_ROWS = LM_ROWS | _lm_choice_row().flatmap(perturbed)


@contextmanager
def directory() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="evalreplay-fuzz-") as tmp:
        yield Path(tmp)


def check_replay(path: Path, root: Path) -> None:
    """Load `path`, then serve every saved prompt (and one miss) every way a task asks."""
    try:
        provider = ReplayProvider.from_path(path)
    except EvalReplayError as exc:
        assert str(root) in str(exc), str(exc)
        return
    requests = [Request(task="t", instance_id="zz", context="never saved")]
    for n, (context, system) in enumerate(provider.index.prompts()):
        for num_samples, stage in ((1, 1), (2, 1), (1, 2)):
            requests.append(
                Request(
                    task="t",
                    instance_id=f"i{n}",
                    context=context,
                    system_prompt=system,
                    num_samples=num_samples,
                    stage=stage,
                )
            )
    for result in provider.generate(requests):
        if isinstance(result, GenerationError):
            assert isinstance(result.message, str) and result.message.startswith("replay: ")
        else:
            assert isinstance(result, list) and all(isinstance(g, Generation) for g in result)
            assert all(isinstance(g.text, str) for g in result)
    if hasattr(provider, "loglikelihood"):  # multiple choice: each save's continuations, and others
        asks = [
            Request(
                task="t",
                instance_id=f"i{n}",
                context=r.context,
                system_prompt=r.system_prompt,
                request_type="loglikelihood",
                continuations=conts,
            )
            for n, r in enumerate(requests[1::3])
            for conts in ((" x",), *saved_continuations(provider, r))
        ]
        for answer in provider.loglikelihood(asks):
            if isinstance(answer, GenerationError):
                assert answer.message.startswith("replay: ")
            else:
                assert all(isinstance(ll, float) and isinstance(g, bool) for ll, g in answer)


def saved_continuations(provider: ReplayProvider, request: Request) -> list[tuple[str, ...]]:
    """The continuations the saves of a prompt answer (none where a save is malformed)."""
    try:
        return [row.continuations for row in provider.index.rows(request.prompt_key) if row.continuations]
    except EvalReplayError:
        return []


def check_call(fn: Callable[[], Any], root: Path) -> Any:
    try:
        return fn()
    except EvalReplayError as exc:
        assert str(root) in str(exc), str(exc)
        return None


@FUZZ
@given(
    requests=file_bytes(REQUEST_ROWS),
    predictions=file_bytes(PREDICTION_ROWS),
    manifest=st.none() | file_bytes(rows({"format": st.just("evalreplay/1"), "model": st.just("m")})),
)
def test_our_run_dir(requests: bytes, predictions: bytes, manifest: bytes | None) -> None:
    with directory() as root:
        (root / "t-requests.jsonl").write_bytes(requests)
        (root / "t-predictions.jsonl").write_bytes(predictions)
        if manifest is not None:
            (root / "manifest.json").write_bytes(manifest)
        check_replay(root, root)
        check_replay(root / "t-predictions.jsonl", root)


def joined(request: Any, prediction: Any) -> Any:
    """`prediction` answering `request` (its instance and stage), where both are rows."""
    if not isinstance(request, dict) or not isinstance(prediction, dict) or "instance_id" not in request:
        return prediction
    row = {k: v for k, v in prediction.items() if k != "stage"}
    return {
        **row,
        "instance_id": request["instance_id"],
        **({"stage": request["stage"]} if "stage" in request else {}),
    }


@FUZZ
@given(pairs=st.lists(st.tuples(REQUEST_ROWS, PREDICTION_ROWS), max_size=6), edit=st.integers(0, 10**6))
def test_our_run_dir_in_step(pairs: list[tuple[Any, Any]], edit: int) -> None:
    """Rows in step, as the plugin writes them (the in-step way's input), one
    byte of the predictions maybe broken."""
    with directory() as root:
        (root / "t-requests.jsonl").write_bytes(jsonl([r for r, _ in pairs]))
        data = jsonl([joined(r, p) for r, p in pairs])
        if data and edit % 4 == 0:
            at = edit % len(data)
            data = data[:at] + b"\x00" + data[at + 1 :]
        (root / "t-predictions.jsonl").write_bytes(data)
        check_replay(root, root)


@FUZZ
@given(
    requests=file_bytes(OLMO_REQUEST_ROWS), predictions=file_bytes(OLMO_PREDICTION_ROWS), tree=st.booleans()
)
def test_olmo_eval_layouts(requests: bytes, predictions: bytes, tree: bool) -> None:
    with directory() as root:
        if tree:
            (root / "predictions" / "m").mkdir(parents=True)
            (root / "requests" / "m").mkdir(parents=True)
            file = root / "predictions" / "m" / "t-predictions.jsonl"
            (root / "requests" / "m" / "t-requests.jsonl").write_bytes(requests)
        else:
            file = root / "task-000-t-predictions.jsonl"
            (root / "task-000-t-requests.jsonl").write_bytes(requests)
        file.write_bytes(predictions)
        for path in (root, file.parent, file):
            check_replay(path, root)
        check_call(
            lambda: olmo_eval.instances(file.with_name(file.name.replace("predictions", "requests"))), root
        )


@FUZZ
@given(samples=file_bytes(LM_ROWS), gz=st.booleans())
def test_lm_eval_samples(samples: bytes, gz: bool) -> None:
    with directory() as root:
        name = "samples_t_2025-01-31T10-20-30.123456.jsonl"
        path = root / (name + ".gz" if gz else name)
        path.write_bytes(gzip.compress(samples) if gz else samples)
        (root / "results_2025-01-31T10-20-30.123456.json").write_bytes(samples[:50])
        check_replay(path, root)
        check_replay(root, root)
        check_call(lambda: lm_eval.instances(path), root)


_number = st.floats(allow_nan=False, allow_infinity=False) | st.integers(-5, 5)
BASELINES = rows(
    {
        "format": st.sampled_from(
            ["evalreplay-baseline/1", "evalreplay-baseline/1", "evalreplay-baseline/2"]
        ),
        "tasks": st.dictionaries(
            _text,
            st.fixed_dictionaries(
                {"metrics": st.dictionaries(_text, _number, max_size=3)},
                optional={"scores": st.dictionaries(_text, _number, max_size=3), "metric": st.none() | _text},
            ),
            max_size=3,
        ),
    }
)


@FUZZ
@given(content=file_bytes(BASELINES) | BASELINES.map(orjson.dumps))
def test_baseline(content: bytes) -> None:
    with directory() as root:
        path = root / "baseline.json"
        path.write_bytes(content)
        tasks = check_call(lambda: read_baseline(path), root)
        if tasks is not None:
            assert all(
                isinstance(v, float)
                for t in tasks.values()
                for v in (*t.metrics.values(), *t.scores.values())
            )


INSTANCE_ROWS = rows({"id": _id, "question": _text, "answer": json_values})


@FUZZ
@given(content=file_bytes(INSTANCE_ROWS))
def test_instances(content: bytes) -> None:
    with directory() as root:
        path = root / "instances.jsonl"
        path.write_bytes(content)
        found = check_call(lambda: load_instances(path, root), root)
        if found is not None:
            assert found and all(isinstance(i["id"], str) and i["id"].strip() for i in found)
            assert len({i["id"] for i in found}) == len(found)


# -- one field of one valid row, of any value -----------------------------------

_REQUEST = {"instance_id": "a", "request_type": "generate", "context": "Q a?", "system_prompt": None}
_GENERATION = {
    "text": "x",
    "finish_reason": "stop",
    "prompt_tokens": 3,
    "completion_tokens": 1,
    "metadata": {},
}
_PREDICTION = {"instance_id": "a", "model": "m", "generations": [_GENERATION], "scores": {}}
_FIELDS = {
    "requests": [
        ("instance_id",),
        ("request_type",),
        ("context",),
        ("system_prompt",),
        ("stage",),
        ("images",),
        ("tools",),
        ("num_samples",),
    ],
    "predictions": [
        ("instance_id",),
        ("model",),
        ("generations",),
        ("rollouts",),
        ("stage",),
        ("generations", 0),
        *(("generations", 0, k) for k in (*_GENERATION, "original_text")),
    ],
}


def _set(row: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    row = orjson.loads(orjson.dumps(row))
    parent = row
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return row


@FUZZ
@given(
    which=st.sampled_from(["requests", "predictions"]),
    data=st.data(),
    value=_WRONG | json_values,
    row=st.integers(0, 2),
)
def test_our_run_dir_one_field(which: str, data: st.DataObject, value: Any, row: int) -> None:
    path = data.draw(st.sampled_from(_FIELDS[which]))
    ids = ["a", "b", "c"]
    requests = [{**_REQUEST, "instance_id": i, "context": f"Q {i}?"} for i in ids]
    predictions = [{**_PREDICTION, "instance_id": i} for i in ids]
    rows = requests if which == "requests" else predictions
    rows[row] = _set(rows[row], path, value)
    with directory() as root:
        (root / "t-requests.jsonl").write_bytes(jsonl(requests))
        (root / "t-predictions.jsonl").write_bytes(jsonl(predictions))
        check_replay(root, root)


_OLMO_FIELDS = {
    "requests": [
        ("doc_id",),
        ("request_type",),
        ("request",),
        ("request", "context"),
        ("request", "system_prompt"),
    ],
    "predictions": [
        ("doc_id",),
        ("native_id",),
        ("model_output",),
        ("model_output", 0),
        ("model_output", 0, "text"),
        ("model_output", 0, "num_tokens"),
        ("model_output", 0, "original_text"),
        ("model_output", 0, "finish_reason"),
    ],
}
_LM_FIELDS = [
    ("doc_id",),
    ("arguments",),
    ("arguments", "gen_args_0"),
    ("arguments", "gen_args_0", "arg_0"),
    ("arguments", "gen_args_0", "arg_1"),
    ("resps",),
    ("resps", 0),
    ("resps", 0, 0),
]


@FUZZ
@given(
    which=st.sampled_from(["requests", "predictions", "samples"]),
    data=st.data(),
    value=_WRONG | json_values,
    row=st.integers(0, 1),
)
def test_foreign_layouts_one_field(which: str, data: st.DataObject, value: Any, row: int) -> None:
    with directory() as root:
        if which == "samples":
            path = data.draw(st.sampled_from(_LM_FIELDS))
            samples = [
                {
                    "doc_id": n,
                    "arguments": {"gen_args_0": {"arg_0": f"Q {n}?", "arg_1": {"until": []}}},
                    "resps": [["x"]],
                }
                for n in range(2)
            ]
            samples[row] = _set(samples[row], path, value)
            (root / "samples_t.jsonl").write_bytes(jsonl(samples))
            check_replay(root, root)
            check_call(lambda: lm_eval.instances(root / "samples_t.jsonl"), root)
            return
        path = data.draw(st.sampled_from(_OLMO_FIELDS[which]))
        requests = [
            {
                "request_type": "generate_until",
                "doc_id": n,
                "request": {"context": f"Q {n}?", "system_prompt": None},
            }
            for n in range(2)
        ]
        predictions = [{"doc_id": n, "native_id": f"n{n}", "model_output": [{"text": "x"}]} for n in range(2)]
        rows = requests if which == "requests" else predictions
        rows[row] = _set(rows[row], path, value)
        (root / "t-requests.jsonl").write_bytes(jsonl(requests))
        (root / "t-predictions.jsonl").write_bytes(jsonl(predictions))
        check_replay(root, root)
        check_call(lambda: olmo_eval.instances(root / "t-requests.jsonl"), root)
