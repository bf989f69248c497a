"""Issue 34: in a fresh run each generation row is decoded once per session
(for its item's score); the run dir's predictions rows take the journal's
bytes of the generations this session wrote, byte for byte what a decode and
re-encode writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_evalreplay import Generation
from pytest_evalreplay.journal import rows as journal
from pytest_evalreplay.journal.index import JournalIndex
from pytest_evalreplay.journal.rows import journal_path
from pytest_evalreplay.numbers.metrics import ItemOutcome, TaskOutcome
from pytest_evalreplay.rundir.writer import write_task
from pytest_evalreplay.storage.runschema import is_plain_generation

CONFTEST = """
from pytest_evalreplay import Generation


class Echo:
    kind, model = "echo", "echo-1"

    def generate(self, requests):
        return [[Generation(f"answer {r.instance_id}", finish_reason="stop") for _ in r.rollouts]
                for r in requests]


class Streaming(Echo):
    kind = "streaming"

    def generate_stream(self, requests):
        yield from enumerate(self.generate(requests))


def pytest_evalreplay_make_provider(config, kind):
    return {"echo": Echo, "streaming": Streaming}[kind]()
"""

TASK = """
from pytest_evalreplay import EvalTask

t = EvalTask("t", [{"id": f"q{i}"} for i in range(20)], prompt="{id}", num_samples=2,
             scorer=lambda text, i: float(text.endswith(i["id"])))
"""


@pytest.mark.parametrize("kind", ["echo", "streaming"])
def test_a_fresh_run_decodes_each_generation_row_once(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    decoded: list[bytes] = []
    loads = orjson.loads

    def counting(data: Any) -> Any:
        if bytes(data[:13]) == b'{"type":"gen"':
            decoded.append(bytes(data))
        return loads(data)

    monkeypatch.setattr(orjson, "loads", counting)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_t=TASK)
    out = pytester.path / "out"
    result = pytester.runpytest_inprocess(f"--evalreplay-provider={kind}", f"--evalreplay-output={out}")
    result.assert_outcomes(passed=40)
    assert len(decoded) == 40, f"{len(decoded)} decodes of 40 gen rows"
    assert len(set(decoded)) == 40
    predictions = [loads(line) for line in (out / "t-predictions.jsonl").read_bytes().splitlines()]
    assert [p["generations"] for p in predictions[:1]] == [
        [{"text": "answer q0", "finish_reason": "stop", "prompt_tokens": None, "completion_tokens": None}] * 2
    ]


GENERATIONS = [
    Generation("plain"),
    Generation(
        'é \u2603 "quoted" \\ ,"generation":{}', finish_reason="stop", prompt_tokens=3, completion_tokens=0
    ),
    Generation(
        "<think>x</think> y", original_text="<think>x</think> y", metadata={"x": [1, 2.5, None], "ü": {}}
    ),
    Generation(
        "",
        tool_calls=({"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},),
    ),
    Generation("", loglikelihoods=((-1.5, True), (-2.0, False))),
]


def journal_of(directory: Path, runs: list[str]) -> JournalIndex:
    """Task t: instance a, one gen row per generation above (rollout n), of run `runs[n]`."""
    items = [
        journal.header_row("t", "r1"),
        journal.provider_row("pv1", {"kind": "k"}),
        journal.request_row("rq1", {"context": "Q a?", "sampling": {}}),
        *(journal.gen_row((1, "a", n), "rq1", "pv1", runs[n], g) for n, g in enumerate(GENERATIONS)),
    ]
    journal_path(directory, "t").write_bytes(journal.encode(items))
    return JournalIndex.read(directory, "t")


def written(directory: Path, index: JournalIndex, **options: Any) -> bytes:
    """The predictions file `write_task` writes for the index's rows."""
    refs = [index.latest_gen((1, "a", n), "rq1", "pv1") for n in range(len(GENERATIONS))]
    items = tuple(
        ItemOutcome(key=(1, "a", n), status="ok", gen=ref, scores={"acc": 1.0}) for n, ref in enumerate(refs)
    )
    outcome = TaskOutcome("t", "m", {"acc": 1.0}, {"acc": None}, {"a": {"acc": 1.0}}, items, 1, len(items), 0)
    directory.mkdir()
    write_task(directory, outcome, "r1", index, ["a"], len(GENERATIONS), **options)
    return (directory / "t-predictions.jsonl").read_bytes()


def test_the_journals_bytes_of_this_runs_generations_are_what_a_decode_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = journal_of(tmp_path, ["r1"] * len(GENERATIONS))
    decoded = written(tmp_path / "decoded", index, postprocess=lambda g: g)  # a postprocess: decoded
    calls: list[Any] = []
    monkeypatch.setattr(JournalIndex, "generation", lambda self, ref: calls.append(ref))
    assert written(tmp_path / "raw", index) == decoded
    assert calls == []
    assert [Generation.from_row(g, "") for g in orjson.loads(decoded)["generations"]] == GENERATIONS


def counted_decodes(directory: Path, index: JournalIndex) -> tuple[list[int], dict[str, Any]]:
    """The predictions row `write_task` writes, and the gen rows it built a
    Generation of (their line numbers)."""
    calls: list[int] = []
    decode = JournalIndex.generation

    def counting(self: JournalIndex, ref: Any) -> Generation:
        calls.append(ref.lineno)
        return decode(self, ref)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(JournalIndex, "generation", counting)
        row = orjson.loads(written(directory, index))
    return calls, row


def test_an_earlier_runs_generations_with_tool_calls_are_built_for_the_run_dir(tmp_path: Path) -> None:
    index = journal_of(tmp_path, ["r0", *["r1"] * (len(GENERATIONS) - 2), "r0"])
    calls, row = counted_decodes(tmp_path / "out", index)
    assert len(calls) == len(
        GENERATIONS
    )  # the loglikelihoods' row is not plain: the instance's is built whole
    assert [Generation.from_row(g, "") for g in row["generations"]] == GENERATIONS


def test_an_earlier_runs_plain_generations_are_copied_as_decoded(tmp_path: Path) -> None:
    """Rows `to_row` writes, of generations without tool calls or
    loglikelihoods, need no Generation built: a merge or `--resume` writes
    every one of an earlier run's rows."""
    index = journal_of(tmp_path, ["r0"] * 3 + ["r1"] * (len(GENERATIONS) - 3))
    decoded = written(tmp_path / "decoded", index, postprocess=lambda g: g)
    calls, row = counted_decodes(tmp_path / "out", index)
    assert calls == []
    assert orjson.dumps(row) == decoded.rstrip(b"\n")
    assert [Generation.from_row(g, "") for g in row["generations"]] == GENERATIONS


OLD_LAYOUTS = [
    {"text": "no finish_reason or token counts"},
    {"text": "a", "original_text": None, "finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": 2},
    {"text": "b", "finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": 2, "metadata": {}},
    {
        "finish_reason": None,
        "text": "keys in another order",
        "prompt_tokens": None,
        "completion_tokens": None,
    },
    {"text": "c", "finish_reason": None, "prompt_tokens": None, "completion_tokens": None, "extra": 1},
]


def test_an_earlier_runs_rows_in_another_layout_are_written_as_a_decode_writes_them(tmp_path: Path) -> None:
    """An older version's row (or one edited by hand) is not copied: the run
    dir holds what `Generation.to_row` writes of it, as before."""
    rows = [journal.header_row("t", "r1"), journal.provider_row("pv1", {"kind": "k"})]
    rows.append(journal.request_row("rq1", {"context": "Q a?", "sampling": {}}))
    for n, generation in enumerate(OLD_LAYOUTS):
        rows.append(
            {**journal.gen_row((1, "a", n), "rq1", "pv1", "r0", Generation("")), "generation": generation}
        )
    journal_path(tmp_path, "t").write_bytes(journal.encode(rows))
    index = JournalIndex.read(tmp_path, "t")
    refs = [index.latest_gen((1, "a", n), "rq1", "pv1") for n in range(len(OLD_LAYOUTS))]
    items = tuple(
        ItemOutcome(key=(1, "a", n), status="ok", gen=ref, scores={"acc": 1.0}) for n, ref in enumerate(refs)
    )
    outcome = TaskOutcome("t", "m", {"acc": 1.0}, {"acc": None}, {"a": {"acc": 1.0}}, items, 1, len(items), 0)
    (tmp_path / "out").mkdir()
    write_task(tmp_path / "out", outcome, "r1", index, ["a"], len(OLD_LAYOUTS))
    (row,) = [
        orjson.loads(line) for line in (tmp_path / "out" / "t-predictions.jsonl").read_bytes().splitlines()
    ]
    expected = [Generation.from_row(g, "").to_row() for g in OLD_LAYOUTS]
    assert orjson.dumps(row["generations"]) == orjson.dumps(expected)
    assert orjson.dumps(row["generations"]) != orjson.dumps(OLD_LAYOUTS)


SUBCLASS = """
import dataclasses

from pytest_evalreplay import EvalTask


class Upper(EvalTask):
    def postprocess(self, generation):
        return dataclasses.replace(generation, text=generation.text.upper())


t = Upper("t", [{"id": "q0"}], prompt="{id}", scorer=lambda text, i: float(text == "ANSWER Q0"))
"""


def test_a_subclass_postprocess_is_what_the_run_dir_saves(pytester: pytest.Pytester) -> None:
    """The journal's bytes are reused only where `postprocess` cannot change a
    generation: a subclass's own postprocess is applied to the saved row too."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_t=SUBCLASS)
    out = pytester.path / "out"
    pytester.runpytest_inprocess("--evalreplay-provider=echo", f"--evalreplay-output={out}").assert_outcomes(
        passed=1
    )
    (prediction,) = [orjson.loads(line) for line in (out / "t-predictions.jsonl").read_bytes().splitlines()]
    assert [g["text"] for g in prediction["generations"]] == ["ANSWER Q0"]


TRANSCRIPTS = [
    {"instance_id": "a", "turns": [], "messages": [], "error": None},
    {
        "instance_id": "b",
        "answer": 'ends ,"generated":true}}',
        "messages": [{"role": "user", "content": "é"}],
    },
]


def episode_journal(directory: Path, metadata: list[dict[str, Any]], run: str = "r1") -> JournalIndex:
    rows = [
        journal.gen_row((1, f"e{n}", 0), "rq1", "pv1", run, Generation("", metadata=m))
        for n, m in enumerate(metadata)
    ]
    items = [journal.header_row("t", "r1"), *rows]
    journal_path(directory, "t").write_bytes(journal.encode(items))
    return JournalIndex.read(directory, "t")


def test_an_episodes_transcript_is_copied_from_the_journal_undecoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_evalreplay.run.episodes import _transcript_of

    metadata = [{"transcript": doc, "generated": n == 0} for n, doc in enumerate(TRANSCRIPTS)]
    index = episode_journal(tmp_path, metadata)
    monkeypatch.setattr(JournalIndex, "generation", lambda self, ref: pytest.fail("decoded"))
    refs = [index.latest_gen((1, f"e{n}", 0), "rq1", "pv1") for n in range(len(TRANSCRIPTS))]
    copied = [_transcript_of(index, ref, "r1") for ref in refs if ref is not None]
    assert [orjson.dumps(c) for c in copied] == [orjson.dumps(doc) for doc in TRANSCRIPTS]


def test_an_earlier_runs_episode_row_is_decoded(tmp_path: Path) -> None:
    """Its shape is not this code's to vouch for (an older version's, edited by hand)."""
    from pytest_evalreplay.run.episodes import _transcript_of

    metadata = [{"transcript": TRANSCRIPTS[1], "note": 1, "generated": True}]
    index = episode_journal(tmp_path, metadata, run="r0")
    ref = index.latest_gen((1, "e0", 0), "rq1", "pv1")
    assert ref is not None
    assert _transcript_of(index, ref, "r1") == TRANSCRIPTS[1]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner, max_size=2),
    max_leaves=4,
)
FIELDS = ["text", "original_text", "finish_reason", "prompt_tokens", "completion_tokens", "metadata"]


LIKELY = {  # values `from_row` takes, and some it refuses or changes
    "text": st.text(max_size=3),
    "original_text": st.none() | st.text(max_size=3),
    "finish_reason": JSON_VALUES,
    "prompt_tokens": st.none() | st.integers(-1, 9) | st.booleans(),
    "completion_tokens": st.none() | st.integers(-1, 9) | st.floats(0, 2),
    "metadata": st.none() | st.dictionaries(st.text(max_size=2), JSON_VALUES, max_size=2),
    "tool_calls": st.just([]),
    "other": JSON_VALUES,
}


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_a_plain_row_is_what_decoding_and_encoding_it_again_writes(data: st.DataObject) -> None:
    keys = [f for f in FIELDS if f not in ("original_text", "metadata") or data.draw(st.booleans())]
    if data.draw(st.integers(0, 7)) == 0:  # a field left out
        keys.pop(data.draw(st.integers(0, len(keys) - 1)))
    if data.draw(st.integers(0, 7)) == 0:  # in another order than to_row's
        keys = list(data.draw(st.permutations(keys)))
    if data.draw(st.integers(0, 3)) == 0:
        keys.insert(data.draw(st.integers(0, len(keys))), data.draw(st.sampled_from(["tool_calls", "other"])))
    odd = data.draw(st.integers(0, 5)) == 0  # any JSON value in one field
    row = {k: data.draw(LIKELY[k] | JSON_VALUES if odd else LIKELY[k]) for k in keys}
    if is_plain_generation(row):
        assert orjson.dumps(Generation.from_row(row, "").to_row()) == orjson.dumps(row)


@settings(max_examples=200, deadline=None)
@given(
    st.builds(
        Generation,
        text=st.text(max_size=3),
        original_text=st.none() | st.text(max_size=3),
        finish_reason=st.none() | st.sampled_from(["stop", "length"]),
        prompt_tokens=st.none() | st.integers(0, 9),
        completion_tokens=st.none() | st.integers(0, 9),
        metadata=st.dictionaries(st.text(max_size=2), JSON_VALUES, max_size=2),
    )
)
def test_every_row_to_row_writes_without_tool_calls_is_plain(generation: Generation) -> None:
    assert is_plain_generation(orjson.loads(orjson.dumps(generation.to_row())))
