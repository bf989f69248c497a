"""The example suite: it runs on its rule-based model, and replaying its
saved run gives the metrics that run produced."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TASKS = ("arithmetic", "calculator", "capitals", "capitals_bpb", "capitals_mc", "quiz_elo")


@pytest.fixture
def examples(pytester: pytest.Pytester) -> Path:
    shutil.copytree(EXAMPLES, pytester.path, dirs_exist_ok=True)
    return pytester.path


def metrics(run_dir: Path, task: str) -> dict:
    doc = orjson.loads((run_dir / f"{task}-metrics.json").read_bytes())
    return rounded({k: doc.get(k) for k in ("metrics", "num_instances", "num_items", "num_failed", "elo")})


def rounded(value: object) -> object:
    """Floats to 9 significant digits: numpy versions differ in the last bits of a bootstrap interval."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


def test_example_suite_runs_on_the_rule_based_model(pytester, examples):
    result = pytester.runpytest("--evalreplay-output=fresh")
    result.assert_outcomes(passed=85)
    for task in TASKS:
        assert metrics(examples / "fresh", task) == metrics(EXAMPLES / "saved_run", task)


def test_resuming_the_suite_says_which_reused_items_were_deselected_and_which_reported(pytester, examples):
    pytester.runpytest("--evalreplay-output=fresh").assert_outcomes(passed=85)
    result = pytester.runpytest("--evalreplay-output=fresh", "--resume")
    # The tasks' reused items are deselected; the EloEval's run, reported skipped with their verdicts;
    # the agent's episodes run again, every turn and tool result answered from the journal.
    result.assert_outcomes(passed=9, skipped=24, deselected=52)
    result.stdout.fnmatch_lines(
        ["evalreplay: 6 tasks, 6 to run, 76 reused from the journal (52 deselected, 24 reported skipped)"]
    )


def test_replaying_the_saved_run_gives_the_same_metrics(pytester, examples):
    result = pytester.runpytest(
        "--evalreplay-predictions=saved_run", "--evalreplay-output=replayed", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=33, deselected=52)
    result.stdout.fnmatch_lines(["*arithmetic: 12 instances, 24 items, 0 failed*numeric_match=0.6667*"])
    for task in TASKS:
        assert metrics(examples / "replayed", task) == metrics(EXAMPLES / "saved_run", task)
    strip = lambda blob: [{**orjson.loads(x), "model": None} for x in blob.splitlines()]  # noqa: E731
    for task in ("capitals", "capitals_mc", "capitals_bpb"):  # the log-likelihoods served as saved
        saved = (EXAMPLES / "saved_run" / f"{task}-predictions.jsonl").read_bytes()
        replayed = (examples / "replayed" / f"{task}-predictions.jsonl").read_bytes()
        assert strip(replayed) == strip(saved)
    for name in ("calculator-predictions.jsonl", "calculator-transcripts.jsonl"):
        assert strip((examples / "replayed" / name).read_bytes()) == strip(
            (EXAMPLES / "saved_run" / name).read_bytes()
        )


def test_the_agent_example_calls_its_calculator_and_keeps_every_episode(pytester, examples):
    pytester.runpytest("--evalreplay-output=fresh", "-k", "calculator").assert_outcomes(
        passed=6, deselected=79
    )
    rows = [
        orjson.loads(x)
        for x in (examples / "fresh" / "calculator-transcripts.jsonl").read_bytes().splitlines()
    ]
    assert len(rows) == 6
    by_id = {row["instance_id"]: row for row in rows}
    assert [r["result"] for r in by_id["calc-00"]["tool_results"]] == [391]
    assert by_id["calc-00"]["answer"] == "The answer is 391."
    assert by_id["calc-04"]["tool_results"] == []  # the model cannot read "to the power of"
