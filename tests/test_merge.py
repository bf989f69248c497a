"""The merge's own logic, on hand-made shard dirs: rows kept once in shard
order, and each refusal naming the dirs."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from pytest_evalreplay.journal import rows as journal
from pytest_evalreplay.journal.stagelog import complete_row, planned_row
from pytest_evalreplay.model import EvalReplayError, Generation
from pytest_evalreplay.rundir.merge import ShardDir, merge
from pytest_evalreplay.rundir.sharddir import suite_args

CONFIG = {"requests": "r", "items": 4, "provider": "p", "kind": "echo", "model": "m1", "stages": []}


def shard(label: str, k: str, rows: list[dict[str, Any]], config: dict[str, Any] = CONFIG) -> ShardDir:
    data = journal.encode([journal.header_row("t", "run-" + label), *rows])
    return ShardDir(
        label, {"format": "evalreplay-shard/1", "shard": k, "tasks": {"t": config}}, {"t-journal.jsonl": data}
    )


def gen(iid: str, text: str, run: str) -> dict[str, Any]:
    return journal.gen_row((1, iid, 0), "rq", "pv", run, Generation(text=text))


def rows_of(data: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in data.splitlines()]


REQUEST = journal.request_row("rq", {"context": "x"})


def test_rows_are_kept_once_in_shard_order() -> None:
    a = shard("a", "1/2", [REQUEST, gen("q1", "one", "ra")])
    b = shard("b", "2/2", [REQUEST, gen("q2", "two", "rb")])
    merged = merge([b, a])
    rows = rows_of(merged.journals["t-journal.jsonl"])
    assert [r["type"] for r in rows] == ["header", "request", "gen", "gen"]
    assert [r.get("instance_id") for r in rows[2:]] == ["q1", "q2"]
    assert rows[0]["run"].startswith("merged-")
    assert merged.shards == ["1/2", "2/2"] and merged.missing == []


def test_rows_a_shard_copied_from_an_earlier_merge_are_kept_once() -> None:
    old = gen("q1", "one", "ra")
    plan = planned_row(1, ["q1"], ["ref"], None, "fp", {}, "ra")
    a = shard("a", "1/2", [REQUEST, old, plan, gen("q3", "three", "r2a")])
    b = shard("b", "2/2", [REQUEST, old, {**plan, "run": "r2b"}, gen("q2", "two", "r2b")])
    rows = rows_of(merge([a, b]).journals["t-journal.jsonl"])
    assert [r["type"] for r in rows].count("stage") == 1
    assert [r.get("instance_id") for r in rows if r["type"] == "gen"] == ["q1", "q3", "q2"]


def test_conflicting_results_for_one_rollout_are_refused() -> None:
    a = shard("dir-a", "1/2", [REQUEST, gen("q1", "one", "ra")])
    b = shard("dir-b", "2/2", [REQUEST, gen("q1", "another", "rb")])
    with pytest.raises(EvalReplayError, match=r"dir-a and dir-b hold conflicting results .* q1\[s1-r0\]"):
        merge([a, b])


def test_different_plans_of_one_stage_are_refused() -> None:
    a = shard("dir-a", "1/2", [planned_row(2, ["q1"], ["x"], 1000.0, "fp", {}, "ra")])
    b = shard("dir-b", "2/2", [planned_row(2, ["q1"], ["y"], 1000.0, "fp", {}, "rb")])
    with pytest.raises(EvalReplayError, match=r"dir-a and dir-b .* the planned record of stage 2"):
        merge([a, b])


def score(iid: str, rollout: int, value: float, run: str) -> dict[str, Any]:
    return journal.score_row((1, iid, rollout), "g1", run, {"score": value}, None)


def test_conflicting_scores_for_one_rollout_are_refused() -> None:
    a = shard("dir-a", "1/2", [REQUEST, score("q1", 0, 1.0, "ra")])
    b = shard("dir-b", "2/2", [REQUEST, score("q1", 0, 0.0, "rb")])
    with pytest.raises(EvalReplayError, match=r"dir-a and dir-b .* the scores of q1\[s1-r0\]"):
        merge([a, b])


def test_scores_of_other_rollouts_of_one_instance_are_both_kept() -> None:
    a = shard("dir-a", "1/2", [REQUEST, score("q1", 0, 1.0, "ra")])
    b = shard("dir-b", "2/2", [REQUEST, score("q1", 1, 0.0, "rb")])
    rows = rows_of(merge([a, b]).journals["t-journal.jsonl"])
    assert [(r["rollout"], r["scores"]) for r in rows if r["type"] == "score"] == [
        (0, {"score": 1.0}),
        (1, {"score": 0.0}),
    ]


def test_different_complete_records_of_one_stage_are_refused() -> None:
    a = shard("dir-a", "1/2", [complete_row(2, 1010.0, 30.0, "fp", "ra")])
    b = shard("dir-b", "2/2", [complete_row(2, 990.0, 30.0, "fp", "rb")])
    with pytest.raises(EvalReplayError, match=r"dir-a and dir-b .* the complete record of stage 2"):
        merge([a, b])


def test_one_complete_record_written_by_two_runs_is_kept_once() -> None:
    a = shard("dir-a", "1/2", [complete_row(2, 1010.0, 30.0, "fp", "ra")])
    b = shard("dir-b", "2/2", [complete_row(2, 1010.0, 30.0, "fp", "rb")])
    rows = rows_of(merge([a, b]).journals["t-journal.jsonl"])
    assert [(r["kind"], r["rating"]) for r in rows if r["type"] == "stage"] == [("complete", 1010.0)]


def test_a_shard_given_twice_is_refused() -> None:
    with pytest.raises(EvalReplayError, match=r"shard 1/2 is given twice: dir-a and dir-b"):
        merge([shard("dir-a", "1/2", []), shard("dir-b", "1/2", [])])


def test_shards_of_different_splits_are_refused() -> None:
    with pytest.raises(EvalReplayError, match=r"different splits: dir-a \(1/2\), dir-b \(2/3\)"):
        merge([shard("dir-a", "1/2", []), shard("dir-b", "2/3", [])])


@pytest.mark.parametrize(
    "field, shown",
    [("model", "model ('m1' vs 'm2')"), ("provider", "provider configuration"), ("stages", "ELO stage")],
)
def test_shards_of_different_configurations_are_refused(field: str, shown: str) -> None:
    other = {**CONFIG, field: "m2" if field == "model" else ["other"]}
    with pytest.raises(
        EvalReplayError, match=rf"dir-a and dir-b .*configurations: task 't'.s {re.escape(shown)}"
    ):
        merge([shard("dir-a", "1/2", []), shard("dir-b", "2/2", [], other)])


def test_a_merged_dir_is_not_a_shard() -> None:
    merged = ShardDir("m", {"format": "evalreplay-shard/1", "merged": ["1/2"], "of": 2, "tasks": {}}, {})
    with pytest.raises(EvalReplayError, match="m is a merged dir, not a shard"):
        merge([merged])


def test_missing_shards_are_reported_and_a_torn_last_line_left_out() -> None:
    a = shard("a", "2/3", [REQUEST, gen("q1", "one", "ra")])
    torn = ShardDir(a.label, a.marker, {"t-journal.jsonl": a.journals["t-journal.jsonl"] + b'{"type": "ge'})
    merged = merge([torn])
    assert merged.missing == [1, 3]
    assert any("torn last line" in note for note in merged.notes)
    assert len(rows_of(merged.journals["t-journal.jsonl"])) == 3


class Rewritten(dict):
    """A shard's journals that read differently the second time (a shard still running)."""

    def __init__(self, first: bytes, then: bytes) -> None:
        super().__init__({"t-journal.jsonl": first})
        self.reads, self.then = 0, then

    def __getitem__(self, name: str) -> bytes:
        self.reads += 1
        return super().__getitem__(name) if self.reads == 1 else self.then


def test_a_merged_journal_is_made_from_the_shards_journals_when_written(tmp_path) -> None:
    a = shard("a", "1/2", [REQUEST, gen("q1", "one", "ra")])
    b = shard("b", "2/2", [REQUEST, gen("q2", "two", "rb")])
    merged = merge([a, b])
    journal_ = merged.journals.of["t-journal.jsonl"]
    assert [label for label, _, _ in journal_.parts] == ["a", "b"]
    written = b"".join(journal_.chunks())
    assert written == merged.journals["t-journal.jsonl"]
    assert orjson.loads(written.split(b"\n", 1)[0])["run"] == "merged-" + journal_.digest.hex()


def test_a_shard_journal_that_changed_since_it_was_merged_is_refused_when_written() -> None:
    a = shard("a", "1/2", [REQUEST, gen("q1", "one", "ra")])
    grown = a.journals["t-journal.jsonl"].replace(b'"one"', b'"uno"')
    merged = merge([ShardDir(a.label, a.marker, Rewritten(a.journals["t-journal.jsonl"], grown))])
    with pytest.raises(EvalReplayError, match=r"changed while it was merged \(one of a/t-journal.jsonl\)"):
        merged.journals["t-journal.jsonl"]


def test_a_malformed_row_names_the_file_and_line() -> None:
    bad = ShardDir("a", shard("a", "1/1", []).marker, {"t-journal.jsonl": b"not json\n"})
    with pytest.raises(EvalReplayError, match=r"a/t-journal.jsonl:1: not a journal row"):
        merge([bad])


@pytest.mark.parametrize(
    "args, kept",
    [
        (
            ["evals/", "--evalreplay-shard=2/4", "--evalreplay-output", "out/2", "-k", "gsm"],
            ["evals/", "-k", "gsm"],
        ),
        (["--resume", "-n", "4", "evals/", "--resume-stage=2", "-n3"], ["evals/"]),
        (
            ["--evalreplay-provider=openai", "--numprocesses=auto", "--dist", "load", "-q"],
            [],
        ),
        (
            ["-vv", "-rfE", "--tb", "short", "--basetemp=/t", "--evalreplay-report", "r.md", "-k", "x"],
            ["-k", "x"],
        ),
        (
            ["--evalreplay-base-url=u", "--evalreplay-reuse-scores", "-p", "no:randomly", "-r", "s", "-x"],
            ["-p", "no:randomly", "-x"],
        ),
        (["--evalreplay-reset", "--evalreplay-no-generate", "--evalreplay-output=x", "t.py"], ["t.py"]),
        (["--evalreplay-baseline", "b.json", "--evalreplay-failure-budget=0.1", "t.py"], ["t.py"]),
    ],
)
def test_the_suite_args_a_shard_records_leave_out_what_the_merge_sets(
    args: list[str], kept: list[str]
) -> None:
    assert suite_args(args) == kept
