"""The journal as data: rows written, read back incrementally, validated."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import orjson
import pytest

from pytest_evalreplay.journal import rows as journal
from pytest_evalreplay.journal.index import JournalIndex
from pytest_evalreplay.journal.rows import Failure
from pytest_evalreplay.model import EvalReplayError, Generation, digest
from pytest_evalreplay.storage.files import AppendFile, atomic_write


def append_as_another_process(path: Path, blob: bytes) -> None:
    """Rows a peer appends: its own open, write, fsync and close (this process's
    journal writer keeps its file open, so appending through it would not do)."""
    file = AppendFile(path)
    try:
        file.write(blob)
        file.sync()
    finally:
        file.close()


def write(tmp_path, rows, task="t", header=True):
    rows = ([journal.header_row(task, "r1")] if header else []) + rows
    path = journal.journal_path(tmp_path, task)
    path.write_bytes(journal.encode(rows))
    return path


def gen(iid="q0", rollout=0, rq="rq1", pv="pv1", run="r1", text="hi", stage=1):
    return journal.gen_row((stage, iid, rollout), rq, pv, run, Generation(text, completion_tokens=2))


def fail(iid="q0", rollouts=(0,), attempt=1, cls="retryable", final=False, rq="rq1", pv="pv1", run="r1"):
    failure = Failure(1, iid, tuple(rollouts), attempt, cls, "boom", final)
    return journal.fail_row(failure, rq, pv, run)


def test_rows_round_trip(tmp_path):
    write(
        tmp_path,
        [
            journal.provider_row("pv1", {"kind": "k", "model": "m"}),
            journal.request_row("rq1", {"context": "Q?"}),
            gen(),
            journal.score_row((1, "q0", 0), "r1", "r1", {"acc": 1.0}, None),
            fail(iid="q1"),
        ],
    )
    index = JournalIndex.read(tmp_path, "t")
    ref = index.latest_gen((1, "q0", 0), "rq1", "pv1")
    assert ref is not None and ref.completion_tokens == 2
    assert index.generation(ref).text == "hi"
    assert index.score_of((1, "q0", 0), ref).scores == {"acc": 1.0}
    assert index.request("rq1") == {"context": "Q?"}
    assert index.providers["pv1"] == {"kind": "k", "model": "m"}
    assert index.latest_fail((1, "q1", 0), "rq1", "pv1").failure.attempt == 1


def test_reuse_needs_the_same_request_and_provider(tmp_path):
    write(tmp_path, [gen(rq="old"), gen(pv="other")])
    index = JournalIndex.read(tmp_path, "t")
    assert index.latest_gen((1, "q0", 0), "rq1", "pv1") is None
    assert index.latest_gen((1, "q0", 0), "old", "pv1") is not None


def test_the_newest_matching_generation_wins(tmp_path):
    write(tmp_path, [gen(text="first"), gen(rq="other", text="x"), gen(text="second", run="r2")])
    index = JournalIndex.read(tmp_path, "t")
    assert index.generation(index.latest_gen((1, "q0", 0), "rq1", "pv1")).text == "second"


def test_a_missing_journal_reads_as_empty(tmp_path):
    index = JournalIndex.read(tmp_path, "t")
    assert index.header is None and not index.gens


def test_refresh_reads_only_what_was_appended(tmp_path):
    path = write(tmp_path, [gen("q0")])
    index = JournalIndex.read(tmp_path, "t")
    append_as_another_process(path, journal.encode([gen("q1")]))
    index.refresh()
    assert set(index.gens) == {(1, "q0", 0), (1, "q1", 0)}
    assert index.rows == 3


def test_a_snapshot_limit_stops_reading(tmp_path):
    path = write(tmp_path, [gen("q0")])
    size = path.stat().st_size
    append_as_another_process(path, journal.encode([gen("q1")]))
    index = JournalIndex.read(tmp_path, "t", limit=size)
    assert set(index.gens) == {(1, "q0", 0)}


def test_a_replaced_journal_is_read_afresh(tmp_path):
    write(tmp_path, [gen("q0"), gen("q1"), gen("q2")])
    index = JournalIndex.read(tmp_path, "t")
    journal.start_fresh(tmp_path, "t", "r9")
    index.refresh()
    assert index.header["run"] == "r9" and not index.gens


def test_a_torn_last_line_is_skipped_reported_and_cut_before_the_next_append(tmp_path):
    path = write(tmp_path, [gen("q0")])
    with path.open("ab") as fh:
        fh.write(orjson.dumps(gen("q1"))[:30])
    index = JournalIndex.read(tmp_path, "t")
    assert index.torn == 3 and set(index.gens) == {(1, "q0", 0)}
    append_as_another_process(path, journal.encode([gen("q2")]))
    index = JournalIndex.read(tmp_path, "t")
    assert index.torn is None and set(index.gens) == {(1, "q0", 0), (1, "q2", 0)}


def test_reading_a_torn_journal_warns_nothing_even_when_warnings_are_errors(tmp_path, recwarn):
    path = write(tmp_path, [gen("q0")])
    with path.open("ab") as fh:
        fh.write(b'{"type": "ge')
    JournalIndex.read(tmp_path, "t")
    assert not recwarn.list


def test_a_malformed_line_that_was_finished_is_an_error_naming_file_and_line(tmp_path):
    path = write(tmp_path, [gen("q0")])
    with path.open("ab") as fh:
        fh.write(b"{not json}\n")
    with pytest.raises(
        EvalReplayError, match=r"t-journal\.jsonl:3: malformed journal line.*--evalreplay-reset"
    ):
        JournalIndex.read(tmp_path, "t")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ([1, 2], "must be a JSON object"),
        ({"type": "mystery"}, "unknown journal row type"),
        ({"type": "gen", "stage": "1", "instance_id": "q0", "rollout": 0}, "integer 'stage'"),
        ({**gen(), "generation": {"text": 3}}, "'generation' object with a 'text'"),
        ({**gen(), "run": None}, "string 'run'"),
        (
            {
                "type": "score",
                "stage": 1,
                "instance_id": "q0",
                "rollout": 0,
                "of": "r1",
                "run": "r1",
                "scores": {"acc": float("nan")},
            },
            "finite numbers",
        ),
        ({**fail(), "attempt": -1}, "not a valid failure row"),
        ({**fail(), "failure_class": "mystery"}, "not a valid failure row"),
        (journal.header_row("t", "r2"), "a second journal header"),
    ],
)
def test_rows_are_validated_naming_file_and_line(tmp_path, row, message):
    path = write(tmp_path, [gen("q0")])
    with path.open("ab") as fh:
        fh.write(orjson.dumps(row) + b"\n")
    with pytest.raises(EvalReplayError, match=message) as info:
        JournalIndex.read(tmp_path, "t")
    assert f"{path}:3" in str(info.value)


def test_a_journal_of_another_format_is_refused_with_the_fix(tmp_path):
    path = journal.journal_path(tmp_path, "t")
    path.write_bytes(b'{"type": "header", "format": "evalreplay-journal/1", "fingerprint": "x"}\n')
    with pytest.raises(EvalReplayError, match=r"another format.*evalreplay-journal/1.*--evalreplay-reset"):
        JournalIndex.read(tmp_path, "t")


def test_rows_before_a_header_are_refused(tmp_path):
    write(tmp_path, [gen("q0")], header=False)
    with pytest.raises(EvalReplayError, match="before its header"):
        JournalIndex.read(tmp_path, "t")


def test_a_journal_path_that_is_a_directory_is_a_clear_error(tmp_path):
    journal.journal_path(tmp_path, "t").mkdir()
    with pytest.raises(EvalReplayError, match=r"t-journal\.jsonl: cannot read the journal"):
        JournalIndex.read(tmp_path, "t")


def test_appends_refuse_a_symlinked_file(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_bytes(b"precious\n")
    link = journal.journal_path(tmp_path, "t")
    link.symlink_to(target)
    with pytest.raises(EvalReplayError, match="symlink"):
        journal.append(tmp_path, "t", [gen()])
    assert target.read_bytes() == b"precious\n"


def test_atomic_writes_replace_a_planted_symlink_and_never_follow_one(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_bytes(b"precious\n")
    out = tmp_path / "run"
    out.mkdir()
    (out / "t-metrics.json").symlink_to(target)
    atomic_write(out / "t-metrics.json", b"{}")
    assert target.read_bytes() == b"precious\n"
    assert not (out / "t-metrics.json").is_symlink()
    assert (out / "t-metrics.json").read_bytes() == b"{}"


def test_digest_is_canonical_over_key_order():
    assert digest({"a": 1, "b": [1, 2]}) == digest({"b": [1, 2], "a": 1})
    assert digest({"a": 1}) != digest({"a": 1.0})


def _writer(args):
    directory, n = args
    for k in range(50):
        with journal.task_lock(directory, "t"):
            journal.append(directory, "t", [gen(f"w{n}-{k}", text="x" * 2000)])


def test_concurrent_writers_never_interleave_rows(tmp_path):
    write(tmp_path, [])
    ctx = multiprocessing.get_context("spawn" if os.name != "posix" else "fork")
    with ctx.Pool(4) as pool:
        pool.map(_writer, [(tmp_path, n) for n in range(4)])
    index = JournalIndex.read(tmp_path, "t")
    assert len(index.gens) == 200


def _state(index: JournalIndex) -> tuple:
    fails = {k: [(f.failure, f.request, f.lineno) for f in v] for k, v in index.fails.items()}
    return (
        index.offset,
        index.lineno,
        index.rows,
        index.gens,
        index.scores,
        fails,
        index.requests,
        index.providers,
        index.stage_rows,
    )


def _mixed_rows(n: int) -> list[list[dict]]:
    return [
        [journal.provider_row(f"pv{n}", {"kind": "k", "model": "m", "args": ("a", 1)})],
        [
            journal.request_row(f"rq{n}", {"context": [{"role": "user", "content": "Q"}], "tools": ()}),
            gen(rq=f"rq{n}"),
        ],
        [journal.score_row((1, "q0", 0), "r1", "r1", {"acc": 1}, None), fail(rollouts=(0, 1), rq=f"rq{n}")],
        [{"type": "stage", "stage": 1, "plan": ("a",)}, gen(iid="q1", rq=f"rq{n}")],
    ]


def test_rows_a_recorder_writes_index_as_a_fresh_read_of_the_file_would(tmp_path):
    from pytest_evalreplay.journal.recorder import TaskRecorder

    recorder = TaskRecorder(tmp_path, "t", "r1", reset=False)
    for rows in _mixed_rows(1):
        recorder.add(rows)
    recorder._write()
    fresh = JournalIndex.read(tmp_path, "t")
    assert recorder.index.offset == journal.journal_path(tmp_path, "t").stat().st_size  # none read back
    assert _state(recorder.index) == _state(fresh)


def test_rows_another_process_wrote_in_between_are_read_before_this_ones(tmp_path):
    from pytest_evalreplay.journal.recorder import TaskRecorder

    recorder = TaskRecorder(tmp_path, "t", "r1", reset=False)
    recorder.add(_mixed_rows(1)[1])
    append_as_another_process(
        journal.journal_path(tmp_path, "t"), journal.encode(_mixed_rows(2)[1])
    )  # a peer's rows
    recorder.add(_mixed_rows(3)[1])
    assert "rq3" not in recorder.index.requests  # not indexed past the peer's rows unread
    recorder.refresh()
    assert _state(recorder.index) == _state(JournalIndex.read(tmp_path, "t"))
    assert {"rq1", "rq2", "rq3"} <= set(recorder.index.requests)


def test_a_torn_line_another_writer_left_after_this_process_wrote_is_cut(tmp_path):
    path = write(tmp_path, [])
    journal.append_durably(path, journal.encode([gen()]))
    with open(path, "ab") as peer:  # a peer killed mid-write, after this process's last write
        peer.write(b'{"type": "gen", "stage": 1, "inst')
    journal.append_durably(path, journal.encode([gen(iid="q1")]))
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [r.get("instance_id") for r in rows] == [None, "q0", "q1"]
