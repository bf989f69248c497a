"""Rows that come back together from one provider call go out in one write
under one task lock (issue #34); a streamed result's rows at once, so what
a kill can lose stays what is in flight at the provider."""

from __future__ import annotations

import pytest

from pytest_evalreplay import EvalTask, Generation, GenerationError
from pytest_evalreplay.journal import rows as journal
from pytest_evalreplay.journal.recorder import TaskRecorder
from pytest_evalreplay.run.generation import stream_into_journal
from pytest_evalreplay.settings import Settings


def requests():
    # Built in a function: a module-level EvalTask in a test module is collected as eval items.
    task = EvalTask("t", [{"id": f"i{n}"} for n in range(4)], prompt="{id}", scorer=lambda t, i: 1.0)
    return [task.request(inst) for inst in task.instances]


@pytest.fixture
def writes(monkeypatch) -> list[list[str]]:
    """The row types of each write(2) to a journal, in order."""
    seen: list[list[str]] = []
    real = journal.append_durably

    def counted(path, blob):
        seen.append([line.split(b'"type":"', 1)[1].split(b'"', 1)[0].decode() for line in blob.splitlines()])
        return real(path, blob)

    monkeypatch.setattr(journal, "append_durably", counted)
    return seen


def run(tmp_path, provider, log: list[str] | None = None) -> TaskRecorder:
    recorder = TaskRecorder(tmp_path, "t", "r1", reset=False)

    def on_answer(key, gen):  # each answer is told once its row is in the journal
        assert recorder.index.latest_gen(key, rq, "pv") is not None
        if log is not None:
            log.append(key[1])

    rq = "rq"
    stream_into_journal(
        recorder,
        provider,
        ("pv", {"kind": "k"}),
        requests(),
        Settings(max_attempts=2),
        digest_of=lambda r: rq,
        on_answer=on_answer,
    )
    return recorder


class Whole:
    """Returns a list: every result of a call at once; the first answer fails once."""

    def __init__(self) -> None:
        self.calls = 0

    def generate(self, requests):
        self.calls += 1
        return [
            GenerationError("busy", retryable=True)
            if r.instance_id == "i0" and self.calls == 1
            else [Generation(r.instance_id)]
            for r in requests
        ]


class Streams:
    def generate_stream(self, requests):
        for i, r in enumerate(requests):
            yield i, [Generation(r.instance_id)]


def test_a_calls_results_go_out_in_one_write_and_failures_before_the_retry(tmp_path, writes):
    told: list[str] = []
    run(tmp_path, Whole(), told)
    assert writes == [
        ["provider"],
        ["request", "fail", "gen", "gen", "gen"],  # the first call: its four results in one write
        ["gen"],  # the retry's
    ]
    assert told == ["i1", "i2", "i3", "i0"]


def test_a_streamed_result_is_written_the_moment_it_arrives(tmp_path, writes):
    told: list[str] = []
    run(tmp_path, Streams(), told)
    assert writes == [["provider"], ["request", "gen"], ["gen"], ["gen"], ["gen"]]
    assert told == ["i0", "i1", "i2", "i3"]


def test_a_large_calls_rows_go_out_in_groups_so_memory_stays_flat(tmp_path, writes, monkeypatch):
    from pytest_evalreplay.run import generation

    monkeypatch.setattr(generation, "GROUP_ROWS", 3)
    run(tmp_path, Whole())
    assert writes == [["provider"], ["request", "fail", "gen"], ["gen", "gen"], ["gen"]]
