"""Reuse decisions when a key's journal holds both a generation and a failure:
the newer one stands. A newer final failure overrides an older generation
(reported failed, not reused); a newer retryable one sends the key to run
again, continuing its attempt count; an older failure never hides a newer
generation. Pure logic: planning.decide and JournalIndex.standing on a
journal written row by row."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_evalreplay.journal import rows as journal
from pytest_evalreplay.journal.index import JournalIndex
from pytest_evalreplay.journal.rows import Failure
from pytest_evalreplay.model import Generation
from pytest_evalreplay.numbers import planning

KEY = (1, "q0", 0)
RQ, PV = "rq1", "pv1"
PLAN = planning.TaskPlan("t", (KEY,), {(1, "q0"): RQ}, PV)


def gen_row(text: str = "hi", rq: str = RQ, pv: str = PV) -> dict[str, object]:
    return journal.gen_row(KEY, rq, pv, "r1", Generation(text))


def fail_row(attempt: int, failure_class: str = "retryable", final: bool = False) -> dict[str, object]:
    failure = Failure(1, "q0", (0,), attempt, failure_class, "boom", final)
    return journal.fail_row(failure, RQ, PV, "r1")


def index_of(tmp_path: Path, rows: list[dict[str, object]]) -> JournalIndex:
    path = journal.journal_path(tmp_path, "t")
    path.write_bytes(journal.encode([journal.header_row("t", "r1"), *rows]))
    return JournalIndex.read(tmp_path, "t")


def decide(index: JournalIndex, max_attempts: int = 3) -> planning.Decisions:
    return planning.decide(PLAN, [KEY], index, resume=True, max_attempts=max_attempts)


@pytest.mark.parametrize(("failure_class", "attempt"), [("terminal", 1), ("scoring", 1), ("retryable", 3)])
def test_a_newer_final_failure_overrides_an_older_generation(
    tmp_path: Path, failure_class: str, attempt: int
) -> None:
    index = index_of(tmp_path, [gen_row(), fail_row(attempt, failure_class, final=True)])
    out = decide(index)
    assert KEY not in out.reuse and out.run == []
    assert out.failed[KEY].failure.failure_class == failure_class
    gen, fail = index.standing(KEY, RQ, PV)
    assert gen is None and fail is not None and fail.failure.attempt == attempt


def test_a_newer_retryable_failure_runs_the_key_again_continuing_its_attempts(tmp_path: Path) -> None:
    index = index_of(tmp_path, [gen_row(), fail_row(1)])
    out = decide(index)
    assert out.run == [KEY] and KEY not in out.reuse and KEY not in out.failed
    assert out.prior_attempts == {(1, "q0"): 1}
    assert index.standing(KEY, RQ, PV)[0] is None


def test_an_older_failure_never_hides_a_newer_generation(tmp_path: Path) -> None:
    index = index_of(tmp_path, [fail_row(1, "terminal", final=True), gen_row("later")])
    out = decide(index)
    assert index.generation(out.reuse[KEY]).text == "later"
    assert out.run == [] and out.failed == {}
    gen, fail = index.standing(KEY, RQ, PV)
    assert gen == out.reuse[KEY] and fail is not None


def test_raising_the_attempt_cap_runs_a_used_up_retryable_failure_again(tmp_path: Path) -> None:
    index = index_of(tmp_path, [gen_row(), fail_row(3, final=True)])
    assert KEY in decide(index, max_attempts=3).failed
    out = decide(index, max_attempts=4)
    assert out.run == [KEY] and out.prior_attempts == {(1, "q0"): 3}


def test_a_failure_of_another_request_does_not_override_this_generation(tmp_path: Path) -> None:
    other = journal.fail_row(Failure(1, "q0", (0,), 1, "terminal", "boom", True), "old", PV, "r1")
    index = index_of(tmp_path, [gen_row(), other])
    assert KEY in decide(index).reuse
    assert index.standing(KEY, RQ, PV)[0] is not None


def _written_one_by_one(tmp_path: Path, rows: list[dict[str, object]]) -> JournalIndex:
    """The index as the recorder keeps it: each row learnt as it is appended."""
    journal.start_fresh(tmp_path, "t", "r1")
    index = JournalIndex.read(tmp_path, "t")
    path = journal.journal_path(tmp_path, "t")
    for row in rows:
        lines = journal.encoded_lines([row])
        index.note_written([row], lines, journal.append_durably(path, b"".join(lines)))
    return index


@pytest.mark.parametrize("learnt", ["read", "written"])
@pytest.mark.parametrize("last", ["gen", "fail"])
def test_of_a_gen_and_a_later_fail_row_or_the_reverse_the_newer_stands(
    tmp_path: Path, learnt: str, last: str
) -> None:
    rows = [gen_row("first"), fail_row(1)] if last == "fail" else [fail_row(1), gen_row("later")]
    index = (index_of if learnt == "read" else _written_one_by_one)(tmp_path, rows)
    gen, fail = index.standing(KEY, RQ, PV)
    assert fail is not None and fail.failure.attempt == 1
    if last == "fail":
        assert gen is None
    else:
        assert gen is not None and index.generation(gen).text == "later"


@given(events=st.lists(st.sampled_from(["gen", "fail"]), min_size=1, max_size=8))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_whatever_the_order_of_gen_and_fail_rows_the_newest_stands(tmp_path: Path, events: list[str]) -> None:
    rows = [gen_row(f"gen {n}") if kind == "gen" else fail_row(n + 1) for n, kind in enumerate(events)]
    index = index_of(tmp_path, rows)
    gen, fail = index.standing(KEY, RQ, PV)
    gens = [n for n, kind in enumerate(events) if kind == "gen"]
    fails = [n for n, kind in enumerate(events) if kind == "fail"]
    assert (fail.failure.attempt if fail is not None else None) == (fails[-1] + 1 if fails else None)
    if events[-1] == "gen":
        assert gen is not None and index.generation(gen).text == f"gen {gens[-1]}"
    else:
        assert gen is None
