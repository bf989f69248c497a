"""Issue 18 cases 19 and 20: what a replayed run dir says is true. A replay
after a change of sampling records the sampling its generations were made
with (and the summary counts the requests that differ); a journal whose
request rows were deleted is refused naming file:line, not written as an
empty requests file that replay then refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from pytest_evalreplay import EvalReplayError, EvalTask, Generation, Request
from pytest_evalreplay.journal.index import JournalIndex
from pytest_evalreplay.journal.rows import journal_path
from pytest_evalreplay.numbers.metrics import ItemOutcome, TaskOutcome
from pytest_evalreplay.providers.replay import ReplayProvider
from pytest_evalreplay.rundir.writer import write_task
from pytest_evalreplay.storage.runschema import SAVED_SAMPLING, request_row_of

SAVED = {"temperature": 0.7, "max_tokens": 32}
NOW = {"temperature": 0.0, "max_tokens": 4}


def rows(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def write_jsonl(path: Path, items: list[dict[str, Any]]) -> None:
    path.write_bytes(b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in items))


def saved_run(directory: Path, stage: int = 1) -> Path:
    """A run dir of task t, instances a and b, generated with SAVED sampling."""
    directory.mkdir()
    requests = [
        Request(task="t", instance_id=i, context=f"Q {i}?", sampling=SAVED, stage=stage) for i in "ab"
    ]
    write_jsonl(directory / "t-requests.jsonl", [request_row_of(r) for r in requests])
    predictions = [
        {"instance_id": i, "model": "m", "generations": [{"text": f"A {i}"}], "scores": {}}
        | ({"stage": stage} if stage != 1 else {})
        for i in "ab"
    ]
    write_jsonl(directory / "t-predictions.jsonl", predictions)
    return directory


@pytest.mark.parametrize("stage", [1, 2], ids=["in-step", "row-by-row"])
def test_a_served_generation_says_the_sampling_it_was_made_with(tmp_path: Path, stage: int) -> None:
    provider = ReplayProvider.from_path(saved_run(tmp_path / "run", stage))
    (changed,) = provider.generate(
        [Request(task="t", instance_id="a", context="Q a?", sampling=NOW, stage=stage)]
    )
    assert isinstance(changed, list)
    assert changed[0].text == "A a"
    assert changed[0].metadata[SAVED_SAMPLING] == SAVED
    (same,) = provider.generate(
        [Request(task="t", instance_id="b", context="Q b?", sampling=SAVED, stage=stage)]
    )
    assert isinstance(same, list) and SAVED_SAMPLING not in same[0].metadata  # nothing to say
    (note,) = provider.notes
    assert "1 of 2 served requests" in note and "task t, instance a" in note
    assert "temperature" in note and "0.7" in note


def test_no_note_when_every_served_request_has_the_saved_sampling(tmp_path: Path) -> None:
    provider = ReplayProvider.from_path(saved_run(tmp_path / "run"))
    provider.generate([Request(task="t", instance_id="a", context="Q a?", sampling=SAVED)])
    assert provider.notes == []


def test_a_save_that_does_not_say_its_sampling_is_not_counted(tmp_path: Path) -> None:
    run = saved_run(tmp_path / "run")
    lines = rows(run / "t-requests.jsonl")
    for row in lines:
        del row["sampling"]
    write_jsonl(run / "t-requests.jsonl", lines)
    provider = ReplayProvider.from_path(run)
    (served,) = provider.generate([Request(task="t", instance_id="a", context="Q a?", sampling=NOW)])
    assert isinstance(served, list) and SAVED_SAMPLING not in served[0].metadata
    assert provider.notes == []


def test_a_sampling_that_is_not_an_object_names_file_and_line(tmp_path: Path) -> None:
    run = saved_run(tmp_path / "run")
    lines = rows(run / "t-requests.jsonl")
    lines[1]["sampling"] = "hot"
    write_jsonl(run / "t-requests.jsonl", lines)
    with pytest.raises(EvalReplayError, match=r"t-requests\.jsonl:2: .*'sampling'"):
        ReplayProvider.from_path(run)


CONFTEST = """
from pytest_evalreplay import Generation

class Echo:
    kind, model, batch_size = "echo", "m-1", None

    def generate(self, requests):
        return [[Generation(text="4") for _ in r.rollouts] for r in requests]

def pytest_evalreplay_make_provider(config, kind):
    return Echo() if kind == "echo" else None
"""

EVALS = """
from pytest_evalreplay import EvalTask

qa = EvalTask("qa", [{"id": "a", "q": "2+2", "answer": "4"}, {"id": "b", "q": "1+3", "answer": "4"}],
              prompt="What is {q}?", scorer="exact_match", target="answer",
              sampling=SAMPLING)
"""


def test_a_replay_after_a_change_of_sampling_records_the_saved_sampling(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_evals=EVALS.replace("SAMPLING", repr(SAVED)))
    pytester.runpytest("--evalreplay-provider=echo", "--evalreplay-output=run", "-p", "no:cacheprovider")
    pytester.makepyfile(test_evals=EVALS.replace("SAMPLING", repr(NOW)))
    result = pytester.runpytest(
        "--evalreplay-predictions=run", "--evalreplay-output=again", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(deselected=2)
    again = pytester.path / "again"
    assert [r["sampling"] for r in rows(again / "qa-requests.jsonl")] == [SAVED, SAVED]
    # The predictions are the saved ones, byte for byte: the saved sampling is in the requests rows.
    assert (again / "qa-predictions.jsonl").read_bytes() == (
        pytester.path / "run" / "qa-predictions.jsonl"
    ).read_bytes()
    result.stdout.fnmatch_lines(["*2 of 2 served requests*sampling*"])
    # The journal keeps the request as sent now (reuse is decided on it).
    journal = rows(again / "qa-journal.jsonl")
    assert [r["request"]["sampling"] for r in journal if r["type"] == "request"] == [NOW, NOW]


# -- case 20: a journal's rows must name rows that exist ------------------------


def test_a_journal_without_its_request_rows_is_refused_naming_the_line(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_evals=EVALS.replace("SAMPLING", "None"))
    pytester.runpytest("--evalreplay-provider=echo", "--evalreplay-output=out", "-p", "no:cacheprovider")
    path = pytester.path / "out" / "qa-journal.jsonl"
    kept = [r for r in rows(path) if r["type"] != "request"]
    write_jsonl(path, kept)
    line = 1 + next(i for i, r in enumerate(kept) if r["type"] == "gen")
    result = pytester.runpytest(
        "--evalreplay-provider=echo", "--evalreplay-output=out", "--resume", "-p", "no:cacheprovider"
    )
    result.stdout.fnmatch_lines([f"*qa-journal.jsonl:{line}: *request*no request row*--evalreplay-reset*"])
    assert rows(pytester.path / "out" / "qa-requests.jsonl") != []  # the old file stays, never emptied


def journal_with(tmp_path: Path, items: list[dict[str, Any]]) -> JournalIndex:
    from pytest_evalreplay.journal import rows as journal

    header = journal.header_row("t", "r1")
    journal_path(tmp_path, "t").write_bytes(journal.encode([header, *items]))
    return JournalIndex.read(tmp_path, "t")


def outcome_of(index: JournalIndex) -> TaskOutcome:
    ref = index.latest_gen((1, "a", 0), "rq1", "pv1")
    assert ref is not None
    item = ItemOutcome(key=(1, "a", 0), status="ok", gen=ref, scores={"acc": 1.0})
    return TaskOutcome("t", "m", {"acc": 1.0}, {"acc": None}, {"a": {"acc": 1.0}}, (item,), 1, 1, 0)


@pytest.mark.parametrize("missing", ["request", "provider"])
def test_writing_the_run_dir_refuses_a_gen_whose_rows_are_gone(tmp_path: Path, missing: str) -> None:
    from pytest_evalreplay.journal import rows as journal

    items = [
        journal.provider_row("pv1", {"kind": "k"}),
        journal.request_row("rq1", {"context": "Q a?", "sampling": {}}),
        journal.gen_row((1, "a", 0), "rq1", "pv1", "r1", Generation("A")),
    ]
    index = journal_with(tmp_path, [r for r in items if r["type"] != missing])
    out = tmp_path / "run"
    out.mkdir()
    with pytest.raises(EvalReplayError, match=rf"t-journal\.jsonl:3: .*no {missing} row.*--evalreplay-reset"):
        write_task(out, outcome_of(index), "r1", index, ["a"], 1)
    assert not list(out.iterdir())  # nothing written, nothing emptied


def test_the_run_dir_writes_the_saved_sampling_of_a_replayed_generation(tmp_path: Path) -> None:
    from pytest_evalreplay.journal import rows as journal

    made = Generation("A", metadata={SAVED_SAMPLING: SAVED, "other": 1})
    index = journal_with(
        tmp_path,
        [
            journal.provider_row("pv1", {"kind": "replay"}),
            journal.request_row("rq1", {"context": "Q a?", "sampling": NOW}),
            journal.gen_row((1, "a", 0), "rq1", "pv1", "r1", made),
        ],
    )
    out = tmp_path / "run"
    out.mkdir()
    write_task(out, outcome_of(index), "r1", index, ["a"], 1)
    assert rows(out / "t-requests.jsonl")[0]["sampling"] == SAVED
    assert rows(out / "t-predictions.jsonl")[0]["generations"][0]["metadata"] == {"other": 1}


def test_an_evaluate_outside_pytest_is_unchanged_by_equal_sampling(tmp_path: Path) -> None:
    task = EvalTask("t", [{"id": "a", "q": "a"}], prompt="Q {q}?", scorer=lambda text, i: 1.0, sampling=SAVED)
    provider = ReplayProvider.from_path(saved_run(tmp_path / "run"))
    result = task.evaluate(provider)
    assert not result.errors and provider.notes == []
