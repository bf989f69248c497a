"""The journal and its failures sidecar, written and read directly."""

from __future__ import annotations

import multiprocessing
import warnings
from pathlib import Path

import orjson
import pytest

from pytest_evalreplay import journal
from pytest_evalreplay.fingerprint import fingerprint
from pytest_evalreplay.journal import Failure, JournalState, JournalWriter, TornLineWarning
from pytest_evalreplay.model import EvalReplayError, Generation, RolloutResult

CONFIG = {"prompt": "Q {id}", "sampling": {"temperature": 0.0}, "provider": {"kind": "k", "model": "m"}}
FP = fingerprint(CONFIG)


def writer(directory: Path, run_id: str = "run1", resume: bool = False, config=CONFIG) -> JournalWriter:
    return JournalWriter(directory, "t", fingerprint(config), config, run_id, resume)


def result(iid: str, rollout: int = 0, score: float = 1.0) -> RolloutResult:
    gen = Generation(text=f"{iid}-{rollout}", finish_reason="stop", prompt_tokens=3, completion_tokens=2)
    return RolloutResult(
        task="t", stage=1, instance_id=iid, rollout=rollout, generation=gen, scores={"acc": score}
    )


def done(iid: str, rollout: int = 0, score: float = 1.0) -> list[dict]:
    return [
        journal.request_row(1, iid, {"instance_id": iid, "context": f"Q {iid}"}),
        journal.done_row(result(iid, rollout, score), "m"),
    ]


def fail(iid: str, attempt: int, cls: str = "retryable", final: bool = False, rollouts=(0,)) -> dict:
    return journal.failure_row(1, iid, rollouts, attempt, cls, f"try {attempt}", final, "run1")


def lines(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_rows_round_trip_through_the_files(tmp_path):
    w = writer(tmp_path)
    w.write(done=done("a") + done("b", score=0.0), failures=[fail("c", 1), fail("c", 2)])
    state = journal.read(tmp_path, "t")
    assert state.header is not None and state.fingerprint == FP
    assert state.header["config"] == CONFIG and state.header["run_id"] == "run1"
    assert state.done == {(1, "a", 0): result("a"), (1, "b", 0): result("b", score=0.0)}
    assert state.models == {(1, "a", 0): "m", (1, "b", 0): "m"}
    assert state.requests[(1, "a")] == {"instance_id": "a", "context": "Q a"}
    assert state.failures == {(1, "c", 0): Failure(2, "try 2", "retryable", final=False)}
    assert state.attempts() == {(1, "c"): 2}
    assert journal.journal_path(tmp_path, "t").read_bytes().endswith(b"}\n")


def test_a_missing_journal_reads_as_empty(tmp_path):
    state = journal.read(tmp_path, "t")
    assert state == JournalState()
    assert journal.staleness(state, FP, CONFIG) == "no journal yet"


def test_nothing_is_written_before_the_writer_opens(tmp_path):
    w = writer(tmp_path / "out")
    assert not (tmp_path / "out").exists()
    w.open()
    assert w.fresh
    assert lines(w.path) == [journal.read(tmp_path / "out", "t").header]


def test_a_fresh_run_replaces_the_old_journal_and_sidecar(tmp_path):
    writer(tmp_path, "run1").write(done=done("a"), failures=[fail("c", 1)])
    w = writer(tmp_path, "run2", resume=False)
    w.open()
    assert w.fresh
    state = journal.read(tmp_path, "t")
    assert state.header["run_id"] == "run2"
    assert state.done == {} and state.failures == {}
    assert not journal.failures_path(tmp_path, "t").exists()


def test_resume_with_an_equal_fingerprint_keeps_the_rows(tmp_path):
    writer(tmp_path, "run1").write(done=done("a"), failures=[fail("c", 1)])
    w = writer(tmp_path, "run2", resume=True)
    w.write(done=done("b"))
    assert not w.fresh
    state = journal.read(tmp_path, "t")
    assert state.header["run_id"] == "run1"
    assert set(state.done) == {(1, "a", 0), (1, "b", 0)}
    assert set(state.failures) == {(1, "c", 0)}


def test_resume_with_another_fingerprint_starts_fresh(tmp_path):
    writer(tmp_path, "run1").write(done=done("a"))
    changed = {**CONFIG, "sampling": {"temperature": 0.7}}
    state = journal.read(tmp_path, "t")
    assert journal.staleness(state, fingerprint(changed), changed) == "config changed: sampling.temperature"
    assert journal.staleness(state, FP, CONFIG) is None
    w = writer(tmp_path, "run2", resume=True, config=changed)
    w.open()
    assert w.fresh and journal.read(tmp_path, "t").done == {}


def test_a_second_writer_of_the_same_run_keeps_the_rows(tmp_path):
    # pytest-xdist workers share the controller's run id.
    writer(tmp_path, "run1").write(done=done("a"))
    writer(tmp_path, "run1").write(done=done("b"))
    assert set(journal.read(tmp_path, "t").done) == {(1, "a", 0), (1, "b", 0)}


@pytest.mark.parametrize("sidecar", [False, True])
def test_a_torn_last_line_is_ignored_with_a_warning_and_cut_before_the_next_append(tmp_path, sidecar):
    writer(tmp_path).write(done=done("a"), failures=[fail("c", 1)])
    path = journal.failures_path(tmp_path, "t") if sidecar else journal.journal_path(tmp_path, "t")
    whole = orjson.dumps(fail("c", 2) if sidecar else journal.done_row(result("b"), "m"))
    with path.open("ab") as fh:
        fh.write(whole[: len(whole) // 2])
    n = len(path.read_bytes().splitlines())
    with pytest.warns(TornLineWarning, match=rf"{path.name}:{n}: ignoring a torn last line"):
        state = journal.read(tmp_path, "t")
    assert set(state.done) == {(1, "a", 0)}
    assert state.failures[(1, "c", 0)].attempts == 1
    writer(tmp_path, resume=True).write(done=done("d"), failures=[fail("c", 2)])
    assert all(isinstance(row, dict) for row in lines(path))  # the torn bytes are gone
    with warnings.catch_warnings():
        warnings.simplefilter("error", TornLineWarning)
        state = journal.read(tmp_path, "t")
    assert set(state.done) == {(1, "a", 0), (1, "d", 0)}
    assert state.failures[(1, "c", 0)].attempts == 2


def test_reading_a_clean_journal_warns_nothing(tmp_path, recwarn):
    writer(tmp_path).write(done=done("a"))
    journal.read(tmp_path, "t")
    assert not [w for w in recwarn if issubclass(w.category, TornLineWarning)]


@pytest.mark.parametrize("sidecar", [False, True])
def test_a_malformed_line_before_the_last_is_an_error_naming_file_and_line(tmp_path, sidecar):
    writer(tmp_path).write(done=done("a"), failures=[fail("c", 1)])
    path = journal.failures_path(tmp_path, "t") if sidecar else journal.journal_path(tmp_path, "t")
    rows = path.read_bytes().splitlines()
    rows.insert(1, b'{"type": "done", "stage": ')
    path.write_bytes(b"\n".join(rows) + b"\n")
    with pytest.raises(EvalReplayError, match=rf"{path.name}:2: malformed journal line"):
        journal.read(tmp_path, "t")


def test_a_malformed_last_line_that_was_finished_is_an_error_not_a_torn_line(tmp_path):
    writer(tmp_path).write(done=done("a"))
    path = journal.journal_path(tmp_path, "t")
    with path.open("ab") as fh:
        fh.write(b"not json\n")
    with pytest.raises(EvalReplayError, match=r"t-journal.jsonl:4: malformed journal line"):
        journal.read(tmp_path, "t")


HEADER = {"type": "header", "format": journal.FORMAT, "fingerprint": FP, "config": CONFIG, "run_id": "r"}
DONE = journal.done_row(result("a"), "m")


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([HEADER, [1, 2]], r":2: a journal row must be a JSON object"),
        ([HEADER, {"stage": 1}], r":2: journal row lacks a valid 'type'"),
        ([HEADER, {"type": "exec", "code": "print(1)"}], r":2: unknown journal row type 'exec'"),
        ([HEADER, {**DONE, "stage": "1"}], r":2: journal row lacks a valid 'stage'"),
        ([HEADER, {**DONE, "rollout": True}], r":2: journal row lacks a valid 'rollout'"),
        ([HEADER, {**DONE, "scores": {"acc": "1.0"}}], r":2: 'scores' must map names to numbers"),
        ([HEADER, {**DONE, "scores": {"acc": None}}], r":2: 'scores' must map names to numbers"),
        ([HEADER, {**DONE, "generation": {"txt": "x"}}], r":2: a generation must be an object"),
        ([HEADER, {**DONE, "generation": {"text": "x", "prompt_tokens": "3"}}], r":2: 'prompt_tokens'"),
        ([HEADER, {"type": "request", "stage": 1, "instance_id": "a"}], r":2: .*valid 'request'"),
        ([DONE, HEADER], r":1: journal rows before its header"),
        ([HEADER, HEADER], r":2: a second header"),
        ([{**HEADER, "format": "other/9"}], r":1: not an evalreplay-journal/1 journal"),
        ([{**HEADER, "fingerprint": None}], r":1: journal row lacks a valid 'fingerprint'"),
    ],
)
def test_rows_are_validated_with_file_and_line(tmp_path, rows, message):
    path = journal.journal_path(tmp_path, "t")
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    with pytest.raises(EvalReplayError, match="t-journal.jsonl" + message):
        journal.read(tmp_path, "t")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"stage": 1, "instance_id": "a", "rollouts": [0], "attempt": "1"}, "valid 'attempt'"),
        ({**fail("a", 1), "rollouts": ["0"]}, "'rollouts' must be a list of integers"),
        ({**fail("a", 1), "failure_class": 3}, "valid 'failure_class'"),
    ],
)
def test_failure_rows_are_validated_with_file_and_line(tmp_path, row, message):
    writer(tmp_path).write(failures=[fail("a", 1)])
    path = journal.failures_path(tmp_path, "t")
    with path.open("ab") as fh:
        fh.write(orjson.dumps(row) + b"\n")
    with pytest.raises(EvalReplayError, match=rf"t-failures.jsonl:2: .*{message}"):
        journal.read(tmp_path, "t")


def test_final_failures_follow_the_cap_of_this_run_for_retryable_ones(tmp_path):
    writer(tmp_path).write(
        done=done("done", 0),
        failures=[
            fail("r2", 1),
            fail("r2", 2),  # retryable, 2 attempts, not final
            fail("r3", 3, final=True),  # retryable, capped at 3
            fail("term", 1, "terminal", final=True),
            fail("scored", 1, "scoring", final=True),
            fail("done", 1),  # retried and saved since
        ],
    )
    state = journal.read(tmp_path, "t")
    assert set(state.final_failures()) == {(1, "r3", 0), (1, "term", 0), (1, "scored", 0)}
    assert set(state.final_failures(3)) == {(1, "r3", 0), (1, "term", 0), (1, "scored", 0)}
    # A raised cap tries the capped one again; a lowered one makes the open one final.
    assert set(state.final_failures(5)) == {(1, "term", 0), (1, "scored", 0)}
    assert set(state.final_failures(2)) == {(1, "r2", 0), (1, "r3", 0), (1, "term", 0), (1, "scored", 0)}
    assert state.attempts() == {(1, "r2"): 2, (1, "r3"): 3, (1, "term"): 1, (1, "done"): 1}


def test_a_failure_row_covers_each_of_its_rollouts(tmp_path):
    writer(tmp_path).write(failures=[fail("a", 1, "terminal", True, rollouts=(0, 2))])
    assert set(journal.read(tmp_path, "t").failures) == {(1, "a", 0), (1, "a", 2)}


def _append_many(directory: str, worker: int) -> None:
    w = writer(Path(directory), "shared")
    pad = "x" * 20_000  # rows far larger than a pipe buffer, so unlocked writes would interleave
    for n in range(15):
        rows = done(f"w{worker}-{n}")
        rows[1]["generation"]["metadata"] = {"pad": pad}
        w.write(done=rows)


def test_concurrent_writers_never_interleave_rows(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0] * 4
    state = journal.read(tmp_path, "t")
    assert len(state.done) == 4 * 15
    assert len(lines(journal.journal_path(tmp_path, "t"))) == 1 + 2 * 4 * 15
