"""The chain of answer sources one request walks, a plain rollout's and an
agent turn's alike: the journal's rows that count (this run's; any run's
under --resume), the newest standing, then the saved run under replay, else
the provider. Pure logic: `sources.answer_source` over hand-built refs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalreplay.journal.index import FailRef, GenRef
from pytest_evalreplay.journal.rows import Failure
from pytest_evalreplay.numbers.sources import Mode, Source, answer_source, is_final

NOW, BEFORE = "run-now", "run-before"


def gen(run: str, seq: int) -> GenRef:
    return GenRef("rq", "pv", run, 0, 1, seq, seq)


def fail(run: str, seq: int, attempt: int = 1, failure_class: str = "retryable") -> FailRef:
    return FailRef(Failure(1, "q0", (0,), attempt, failure_class, "boom", False), "rq", "pv", run, seq, seq)


def mode(resume: bool = False, replay: bool = False, run: str | None = NOW) -> Mode:
    return Mode(run=run, resume=resume, replay=replay, max_attempts=3)


def test_without_resume_an_earlier_runs_answer_does_not_count():
    assert answer_source(mode(), gen(BEFORE, 1), None).source is Source.LIVE
    assert answer_source(mode(replay=True), gen(BEFORE, 1), None).source is Source.SAVED


def test_without_resume_an_earlier_runs_failure_is_forgotten():
    answer = answer_source(mode(), None, fail(BEFORE, 1, attempt=3, failure_class="terminal"))
    assert (answer.source, answer.fail) == (Source.LIVE, None)


def test_this_runs_own_answer_counts_without_resume():
    own = gen(NOW, 2)
    assert answer_source(mode(), own, None).gen is own
    assert answer_source(mode(), own, None).source is Source.JOURNAL


def test_the_journal_as_the_session_found_it_holds_no_row_of_this_run():
    assert answer_source(mode(run=None), gen(NOW, 2), None).source is Source.LIVE


def test_under_resume_an_earlier_runs_answer_is_reused():
    earlier = gen(BEFORE, 1)
    answer = answer_source(mode(resume=True), earlier, None)
    assert (answer.source, answer.gen) == (Source.JOURNAL, earlier)


def test_the_journal_answers_before_the_saved_run():
    assert answer_source(mode(resume=True, replay=True), gen(BEFORE, 1), None).source is Source.JOURNAL


@pytest.mark.parametrize(("attempt", "failure_class"), [(3, "retryable"), (1, "terminal"), (1, "scoring")])
def test_a_newer_final_failure_stands_over_an_older_answer(attempt, failure_class):
    final = fail(BEFORE, 2, attempt, failure_class)
    answer = answer_source(mode(resume=True), gen(BEFORE, 1), final)
    assert (answer.source, answer.gen, answer.fail) == (Source.FAILED, None, final)


def test_a_newer_retryable_failure_sends_the_request_again_continuing_its_attempts():
    newer = fail(BEFORE, 2, attempt=2)
    answer = answer_source(mode(resume=True), gen(BEFORE, 1), newer)
    assert (answer.source, answer.fail) == (Source.LIVE, newer)
    assert answer_source(mode(resume=True, replay=True), gen(BEFORE, 1), newer).source is Source.SAVED


def test_an_older_failure_never_hides_a_newer_answer():
    newer = gen(NOW, 5)
    assert answer_source(mode(), newer, fail(NOW, 4, failure_class="terminal")).gen is newer


def test_is_final_counts_attempts_only_for_retryable_failures():
    assert not is_final(fail(NOW, 1, attempt=2).failure, 3)
    assert is_final(fail(NOW, 1, attempt=3).failure, 3)
    assert is_final(fail(NOW, 1, attempt=1, failure_class="terminal").failure, 3)


row_runs = st.sampled_from([NOW, BEFORE])


@given(
    resume=st.booleans(),
    replay=st.booleans(),
    gen_at=st.none() | st.tuples(row_runs, st.integers(1, 9)),
    fail_at=st.none()
    | st.tuples(row_runs, st.integers(1, 9), st.integers(1, 4), st.sampled_from(["retryable", "terminal"])),
)
def test_the_newest_row_that_counts_stands(resume, replay, gen_at, fail_at):
    g = None if gen_at is None else gen(*gen_at)
    f = None if fail_at is None or (gen_at and fail_at[1] == gen_at[1]) else fail(*fail_at)
    answer = answer_source(mode(resume, replay), g, f)
    counted_gen = g if g is not None and (resume or g.run == NOW) else None
    counted_fail = f if f is not None and (resume or f.run == NOW) else None
    if counted_gen is not None and (counted_fail is None or counted_fail.seq < counted_gen.seq):
        assert (answer.source, answer.gen) == (Source.JOURNAL, g)
    elif counted_fail is not None and is_final(counted_fail.failure, 3):
        assert (answer.source, answer.fail) == (Source.FAILED, f)
    else:
        assert answer.source is (Source.SAVED if replay else Source.LIVE)
        assert (answer.gen, answer.fail) == (None, counted_fail)
