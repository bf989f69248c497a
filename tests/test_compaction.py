"""A compaction (issue #30, case 13) keeps exactly what a later `--resume`
can use, read off the index and streamed line by line: per item the newest
generation and failure of each request and provider, their newest scores,
the request and provider rows they name, the stage records in force and the
compacting run's `done` rows."""

from __future__ import annotations

import orjson
import pytest

from pytest_evalreplay.journal import rows as journal
from pytest_evalreplay.journal.compaction import compact, compact_journal, superseded
from pytest_evalreplay.journal.index import JournalIndex
from pytest_evalreplay.journal.recorder import TaskRecorder
from pytest_evalreplay.journal.rows import Failure
from pytest_evalreplay.model import EvalReplayError, Generation

K0, K1 = (1, "q0", 0), (1, "q1", 0)


def fail(key: tuple[int, str, int], attempt: int) -> Failure:
    return Failure(key[0], key[1], (key[2],), attempt, "retryable", f"boom {attempt}", False)


def stage(kind: str, stage: int, fingerprint: str) -> dict:
    return {"type": "stage", "kind": kind, "stage": stage, "fingerprint": fingerprint, "run": "r0"}


ROWS = [
    journal.header_row("t", "r0"),  # the comments number rows from 0, the header
    journal.provider_row("pv", {"kind": "p"}),
    journal.provider_row("old", {"kind": "o"}),
    journal.request_row("rqA", {"context": "a"}),
    journal.gen_row(K0, "rqA", "old", "r0", Generation("old provider")),  # 4: kept (another provider's)
    journal.gen_row(K0, "rqA", "pv", "r0", Generation("first")),  # 5: superseded by row 10
    journal.score_row(K0, "r0", "r0", {"m": 0.0}, None),  # 6: kept (row 4's: scores go by item and run)
    journal.score_row(K1, "r0", "r0", {"m": 0.0}, None),  # 7: of no generation kept
    journal.fail_row(fail(K1, 1), "rqA", "pv", "r0"),  # 8: superseded by row 13
    stage("planned", 1, "f1"),  # 9: superseded by row 15
    journal.gen_row(K0, "rqA", "pv", "r1", Generation("second")),  # 10: kept
    journal.score_row(K0, "r1", "r1", {"m": 0.5}, None),  # 11: superseded by row 12
    journal.score_row(K0, "r1", "r1", {"m": 1.0}, None),  # 12: kept
    journal.fail_row(fail(K1, 2), "rqA", "pv", "r1"),  # 13: kept
    journal.done_row("stage-1", "r1"),  # 14: another run's fact
    stage("planned", 1, "f2"),  # 15: kept
    stage("complete", 1, "f2"),  # 16: kept
    journal.done_row("stage-1", "r2"),  # 17: the compacting run's
    journal.request_row("rqB", {"context": "b"}),  # 18: named by nothing kept
]


def write(tmp_path, rows, tail: bytes = b"") -> JournalIndex:
    path = journal.journal_path(tmp_path, "t")
    path.write_bytes(journal.encode(rows) + tail)
    index = JournalIndex(path, "t")
    index.refresh()
    return index


def lines_of(tmp_path) -> list[dict]:
    return [orjson.loads(line) for line in journal.journal_path(tmp_path, "t").read_bytes().splitlines()]


def test_a_compaction_keeps_what_resume_can_use_in_the_order_of_the_file(tmp_path):
    index = write(tmp_path, ROWS, tail=b'{"type": "gen", "sta')  # a torn last line goes too
    assert superseded(index) == 2 and superseded(index, "r1") == 0
    compact(index, "r2")
    assert index.offset == 0 and not index.gens  # reset: its positions were the old file's
    kept = [1, 2, 3, 4, 6, 10, 12, 13, 15, 16, 17]
    assert lines_of(tmp_path) == [journal.header_row("t", "r2"), *(ROWS[i] for i in kept)]


def standing(index: JournalIndex) -> list:
    """What each item stands on, by request and provider: generation, its scores, failure."""
    out = []
    for key in (K0, K1):
        for pv in ("pv", "old"):
            gen, failed = index.standing(key, "rqA", pv)
            score = None if gen is None else index.score_of(key, gen)
            out.append(
                (
                    None if gen is None else index.generation(gen),
                    None if score is None else score.scores,
                    None if failed is None else failed.failure,
                )
            )
    return out


def test_what_the_index_stands_on_reads_the_same_after_a_compaction(tmp_path):
    before = standing(write(tmp_path, ROWS))
    compact_journal(journal.journal_path(tmp_path, "t"), "t", "r2")
    after = JournalIndex.read(tmp_path, "t")
    assert standing(after) == before
    assert before[0][0] == Generation("second") and before[0][1] == {"m": 1.0}
    assert after.done == {("stage-1", "r2")}


def test_a_journal_cut_short_under_a_compaction_is_refused_naming_it(tmp_path):
    index = write(tmp_path, ROWS)
    index.path.write_bytes(journal.encode(ROWS[:5]))  # another process rewrote it without the lock
    with pytest.raises(
        EvalReplayError, match=r"t-journal\.jsonl: the journal changed while it was compacted"
    ):
        compact(index, "r2")
    assert lines_of(tmp_path) == ROWS[:5]  # left as it was


def test_a_recorder_compacts_at_its_end_only_what_its_run_wrote_over(tmp_path):
    write(tmp_path, ROWS[:6])
    idle = TaskRecorder(tmp_path, "t", "r1", reset=False, compact=True)
    idle.read_snapshot()
    assert not idle.compact_superseded()  # wrote nothing this session: left to a run that does
    recorder = TaskRecorder(tmp_path, "t", "r1", reset=False, compact=True)
    recorder.read_snapshot()
    recorder.add([recorder.gen(K0, "rqA", "pv", Generation("again"))])
    assert recorder.compact_superseded()
    texts = [r["generation"]["text"] for r in lines_of(tmp_path) if r["type"] == "gen"]
    assert texts == ["old provider", "again"]
    assert not recorder.compact_superseded()  # nothing left to drop
    (tmp_path / "new").mkdir()
    first = TaskRecorder(tmp_path / "new", "t", "r1", reset=False, compact=True)
    first.read_snapshot()
    first.add([first.gen(K0, "rqA", "pv", Generation("a")), first.gen(K0, "rqA", "pv", Generation("b"))])
    assert not first.compact_superseded()  # a journal of this run alone: no older run to supersede


def test_the_compacting_runs_own_attempts_all_stay_and_older_runs_superseded_ones_go(tmp_path):
    attempts = [
        journal.fail_row(fail(K1, 1), "rqA", "pv", "r0"),
        journal.fail_row(fail(K1, 1), "rqA", "pv", "r1"),
        journal.fail_row(fail(K1, 2), "rqA", "pv", "r1"),
    ]
    index = write(tmp_path, [*ROWS[:4], *attempts])
    compact(index, "r1")
    assert [r for r in lines_of(tmp_path) if r["type"] == "fail"] == attempts[1:]
