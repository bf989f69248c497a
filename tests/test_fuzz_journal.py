"""Fuzzing the journal reader: arbitrary bytes, arbitrary JSON values and
mutated real rows give a valid index or an EvalReplayError naming the
journal, never another exception (the readers of saved runs are fuzzed in
tests/test_fuzz_readers.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_evalreplay.journal import rows as journal
from pytest_evalreplay.journal.index import JournalIndex
from pytest_evalreplay.journal.rows import Failure
from pytest_evalreplay.journal.stagelog import StageLog
from pytest_evalreplay.model import EvalReplayError, Generation

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)

GOOD_ROWS = [
    journal.header_row("t", "r1"),
    journal.provider_row("pv", {"kind": "k", "model": "m"}),
    journal.request_row("rq", {"context": "Q", "sampling": {}}),
    journal.gen_row((1, "a", 0), "rq", "pv", "r1", Generation("hi", completion_tokens=3)),
    journal.score_row((1, "a", 0), "r1", "r1", {"acc": 1.0}, None),
    journal.fail_row(Failure(1, "b", (0,), 1, "retryable", "503", False), "rq", "pv", "r1"),
    {"type": "stage", "kind": "seed", "seed": 3, "run": "r1"},
]


def read(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = journal.journal_path(Path(tmp), "t")
        path.write_bytes(data)
        try:
            index = JournalIndex.read(Path(tmp), "t")
            StageLog.read(index)
            for key, refs in index.gens.items():
                for ref in refs:
                    index.generation(ref)
                    index.score_of(key, ref)
        except EvalReplayError as exc:
            assert str(path) in str(exc) or "journal" in str(exc)


@SETTINGS
@given(st.binary(max_size=400))
def test_arbitrary_bytes(data: bytes) -> None:
    read(data)


@SETTINGS
@given(st.lists(json_values, max_size=6))
def test_arbitrary_json_rows_after_a_header(rows: list) -> None:
    read(journal.encode([GOOD_ROWS[0]]) + b"".join(orjson.dumps(r) + b"\n" for r in rows))


@SETTINGS
@given(st.integers(min_value=1, max_value=len(GOOD_ROWS) - 1), st.text(max_size=8), json_values)
def test_a_real_row_with_one_field_replaced(which: int, name: str, value: object) -> None:
    row = dict(GOOD_ROWS[which])
    key = name if name in row or not row else sorted(row)[len(name) % len(row)]
    row[key] = value
    read(journal.encode(GOOD_ROWS[:which]) + orjson.dumps(row) + b"\n")


@SETTINGS
@given(st.integers(min_value=0, max_value=2000))
def test_a_real_journal_cut_anywhere(cut: int) -> None:
    data = journal.encode(GOOD_ROWS)
    read(data[: cut % (len(data) + 1)])
