"""Each fact a run records lives in one place, the journal: a run's `done`
facts (a stage a process of the run drove) are journal rows, so a copy of
the journal, a compaction and a merge keep them; an ELO item's verdicts are
recorded once in its score row (`judgments`), the per-reference scores read
from them, while the LLM judge's own journal holds only its raw replies."""

from __future__ import annotations

import shutil

import orjson
import pytest

from pytest_evalreplay.journal import rows as journal
from pytest_evalreplay.journal.compaction import compact_journal
from pytest_evalreplay.journal.index import JournalIndex
from pytest_evalreplay.journal.recorder import TaskRecorder
from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.rundir.merge import ShardDir, merge
from pytest_evalreplay.storage.runschema import LOCKS_DIR

KEY = (1, "t001", 0)


def rows_in(path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


# -- run-scoped done facts --------------------------------------------------------------


def test_a_done_fact_is_a_journal_row_so_a_copy_of_the_journal_alone_keeps_it(tmp_path):
    (tmp_path / "a").mkdir()
    recorder = TaskRecorder(tmp_path / "a", "memo", "r1", reset=False)
    recorder.mark_done("stage-1")
    assert {"type": "done", "unit": "stage-1", "run": "r1"} in rows_in(recorder.path)
    assert not list((tmp_path / "a").glob(f"{LOCKS_DIR}/*.done"))  # nothing outside the journal
    (tmp_path / "b").mkdir()
    shutil.copy(recorder.path, tmp_path / "b")  # the journal alone, as `cp dir/*.jsonl` copies it
    same_run = TaskRecorder(tmp_path / "b", "memo", "r1", reset=False)
    same_run.refresh()
    assert same_run.done_in_this_run("stage-1")
    assert not same_run.done_in_this_run("stage-2")
    other_run = TaskRecorder(tmp_path / "b", "memo", "r2", reset=False)
    other_run.refresh()
    assert not other_run.done_in_this_run("stage-1")  # run-scoped: another run drives it again


def test_a_peers_done_fact_is_seen_once_the_journal_is_caught_up(tmp_path):
    mine = TaskRecorder(tmp_path, "memo", "r1", reset=False)
    mine.add([journal.done_row("stage-2", "r0")])
    peer = TaskRecorder(tmp_path, "memo", "r1", reset=False)
    peer.mark_done("stage-1")
    assert not mine.done_in_this_run("stage-1")
    mine.flush()
    assert mine.done_in_this_run("stage-1") and not mine.done_in_this_run("stage-2")


def test_a_compaction_keeps_the_compacting_runs_done_facts_and_drops_older_runs(tmp_path):
    path = journal.journal_path(tmp_path, "memo")
    path.write_bytes(
        journal.encode(
            [
                journal.header_row("memo", "r0"),
                journal.done_row("stage-1", "r0"),
                journal.done_row("stage-1", "r1"),
            ]
        )
    )
    compact_journal(path, "memo", "r1")
    assert [r for r in rows_in(path) if r["type"] == "done"] == [journal.done_row("stage-1", "r1")]
    assert JournalIndex.read(tmp_path, "memo").done == {("stage-1", "r1")}


def test_a_merge_keeps_each_shards_done_facts_and_its_journal_reads(tmp_path):
    config = {"requests": "r", "items": 4, "provider": "p", "kind": "echo", "model": "m1", "stages": []}

    def shard(k: str, run: str) -> ShardDir:
        data = journal.encode([journal.header_row("memo", run), journal.done_row("stage-1", run)])
        marker = {"format": "evalreplay-shard/1", "shard": k, "tasks": {"memo": config}}
        return ShardDir(run, marker, {"memo-journal.jsonl": data})

    merged = merge([shard("1/2", "ra"), shard("2/2", "rb")]).journals["memo-journal.jsonl"]
    journal.journal_path(tmp_path, "memo").write_bytes(merged)
    assert JournalIndex.read(tmp_path, "memo").done == {("stage-1", "ra"), ("stage-1", "rb")}


@pytest.mark.parametrize(
    "row", [{"type": "done", "unit": 1, "run": "r1"}, {"type": "done", "unit": "stage-1"}]
)
def test_a_malformed_done_row_names_file_and_line(tmp_path, row):
    path = journal.journal_path(tmp_path, "memo")
    path.write_bytes(journal.encode([journal.header_row("memo", "r1"), row]))
    with pytest.raises(EvalReplayError, match="string") as info:
        JournalIndex.read(tmp_path, "memo")
    assert f"{path}:2" in str(info.value)


# -- an ELO item's verdicts, recorded once -----------------------------------------------


def test_an_elo_score_row_records_each_verdict_once_and_its_scores_are_read_from_them(tmp_path):
    judgments = {"mid": [1.0, 0.5], "weak": [1.0, 1.0]}
    row = journal.score_row(KEY, "r1", "r1", {"mid": 0.75, "weak": 1.0}, None, judgments)
    assert "scores" not in row and row["judgments"] == judgments
    path = journal.journal_path(tmp_path, "memo")
    path.write_bytes(journal.encode([journal.header_row("memo", "r1"), row]))
    score = JournalIndex.read(tmp_path, "memo").scores[(KEY, "r1")]
    assert score.scores == {"mid": 0.75, "weak": 1.0}
    assert score.judgments == {"mid": (1.0, 0.5), "weak": (1.0, 1.0)}


def test_a_score_row_of_the_previous_version_with_scores_beside_its_judgments_still_reads(tmp_path):
    old = {
        "type": "score",
        "stage": 1,
        "instance_id": "t001",
        "rollout": 0,
        "of": "r0",
        "run": "r0",
        "scores": {"mid": 0.5},
        "judgments": {"mid": [0.0, 1.0]},
        "no_answer": ["weak"],
    }
    path = journal.journal_path(tmp_path, "memo")
    path.write_bytes(journal.encode([journal.header_row("memo", "r0"), old]))
    recorder = TaskRecorder(tmp_path, "memo", "r1", reset=False)
    recorder.refresh()
    score = recorder.index.scores[(KEY, "r0")]
    assert score.scores == {"mid": 0.5} and score.judgments == {"mid": (0.0, 1.0)}
    assert score.no_answer == ("weak",)
    # The same verdicts judged again are not written again.
    assert recorder.score(KEY, "r0", {"mid": 0.5}, None, {"mid": [0.0, 1.0]}, ["weak"]) == []


def test_a_judgment_list_must_hold_a_verdict(tmp_path):
    row = {**journal.score_row(KEY, "r1", "r1", {}, None, {"mid": [1.0]}), "judgments": {"mid": []}}
    path = journal.journal_path(tmp_path, "memo")
    path.write_bytes(journal.encode([journal.header_row("memo", "r1"), row]))
    with pytest.raises(EvalReplayError, match="'judgments'") as info:
        JournalIndex.read(tmp_path, "memo")
    assert f"{path}:2" in str(info.value)
