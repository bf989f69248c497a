"""The example suite: it runs on its rule-based model, and replaying its
saved run gives the metrics that run produced."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TASKS = ("arithmetic", "capitals", "quiz_elo")


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
    result.assert_outcomes(passed=60)
    for task in TASKS:
        assert metrics(examples / "fresh", task) == metrics(EXAMPLES / "saved_run", task)


def test_resuming_the_suite_says_which_reused_items_were_deselected_and_which_reported(pytester, examples):
    pytester.runpytest("--evalreplay-output=fresh").assert_outcomes(passed=60)
    result = pytester.runpytest("--evalreplay-output=fresh", "--resume")
    # The tasks' reused items are deselected; the EloEval's run, reported skipped with their verdicts.
    result.assert_outcomes(passed=2, skipped=24, deselected=34)
    result.stdout.fnmatch_lines(
        ["evalreplay: 3 tasks, 0 to run, 58 reused from the journal (34 deselected, 24 reported skipped)"]
    )


def test_replaying_the_saved_run_gives_the_same_metrics(pytester, examples):
    result = pytester.runpytest(
        "--evalreplay-predictions=saved_run", "--evalreplay-output=replayed", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=60)
    result.stdout.fnmatch_lines(["*arithmetic: 12 instances, 24 items, 0 failed*numeric_match=0.6667*"])
    for task in TASKS:
        assert metrics(examples / "replayed", task) == metrics(EXAMPLES / "saved_run", task)
    saved = (EXAMPLES / "saved_run" / "capitals-predictions.jsonl").read_bytes()
    replayed = (examples / "replayed" / "capitals-predictions.jsonl").read_bytes()
    strip = lambda blob: [{**orjson.loads(x), "model": None} for x in blob.splitlines()]  # noqa: E731
    assert strip(replayed) == strip(saved)
