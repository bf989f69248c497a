"""Issue #20's first done-when, end to end: a multiple-choice EvalTask run
through the plugin on the real vLLM engine (tiny model), then replayed from
its run dir with vLLM unimportable, giving identical acc and acc_norm.

The per-choice log-likelihoods themselves are checked against transformers
in test_vllm_loglikelihood.py; here the acc and acc_norm of the run are also
recomputed from its predictions rows, as lm-evaluation-harness computes them
(acc_norm divides by the choice's length in characters). Skips where vLLM is
not installed."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

INSTANCES: list[dict[str, Any]] = [
    {"id": "q0", "question": "Name a prime number.", "choices": ["seven", "four", "nine"], "gold": 0},
    {"id": "q1", "question": "What is two plus two?", "choices": ["four", "five"], "gold": 0},
    {"id": "q2", "question": "What jumps?", "choices": ["the cat", "the quick brown fox"], "gold": 1},
    {
        "id": "q3",
        "question": "What does pytest do?",
        "choices": ["collects", "eats", "runs tests"],
        "gold": 2,
    },
    {"id": "q4", "question": "Count: 0 1 2 3", "choices": ["4", "7"], "gold": 0},
    {"id": "q5", "question": "Which is a role?", "choices": ["assistant", "dog"], "gold": "assistant"},
]

# The fixed multiple-choice API: `choices` names the field, `target` the
# gold index or the gold choice's text; the default scorer gives acc and acc_norm.
MC_EVALS = f"""
from pytest_evalreplay import EvalTask

mc = EvalTask(
    "mc",
    {INSTANCES!r},
    prompt="Question: {{question}}\\nAnswer:",
    choices="choices",
    target="gold",
)
"""

COMMON = ("-p", "no:cacheprovider", "-q")


def rows(path: Any) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def lm_eval_accuracies(predictions: list[dict[str, Any]], instances: dict[str, Any]) -> dict[str, float]:
    """acc and acc_norm from the saved log-likelihoods, as lm-eval's process_results."""
    acc = norm = 0.0
    for row in predictions:
        inst = instances[row["instance_id"]]
        (generation,) = row["generations"]
        lls = [ll for ll, _ in generation["loglikelihoods"]]
        choices = inst["choices"]
        gold = inst["gold"] if isinstance(inst["gold"], int) else choices.index(inst["gold"])
        acc += float(max(range(len(lls)), key=lambda i: lls[i]) == gold)
        norm += float(max(range(len(lls)), key=lambda i: lls[i] / len(choices[i])) == gold)
    return {"acc": acc / len(predictions), "acc_norm": norm / len(predictions)}


def test_mc_with_vllm_then_replay_without_it(pytester: pytest.Pytester, vllm_options: list[str]) -> None:
    pytester.makepyfile(test_evals=MC_EVALS)
    generated = pytester.runpytest_subprocess(*vllm_options, "--evalreplay-output=run1", *COMMON, timeout=300)
    generated.assert_outcomes(passed=6)
    pytester.makeconftest("import sys\nsys.modules['vllm'] = None\n")  # the replay must not touch vLLM
    replayed = pytester.runpytest_subprocess(
        "--evalreplay-predictions=run1", "--evalreplay-output=run2", *COMMON
    )
    replayed.assert_outcomes(deselected=6)  # every item answered by the saved run, as by --resume

    run1, run2 = pytester.path / "run1", pytester.path / "run2"
    rows1, rows2 = rows(run1 / "mc-predictions.jsonl"), rows(run2 / "mc-predictions.jsonl")
    assert len(rows1) == 6
    for a, b in zip(rows1, rows2, strict=True):
        assert a["generations"] == b["generations"]
        assert a["scores"] == b["scores"]
    metrics1 = orjson.loads((run1 / "mc-metrics.json").read_bytes())
    metrics2 = orjson.loads((run2 / "mc-metrics.json").read_bytes())
    assert {"acc", "acc_norm"} <= metrics1["metrics"].keys()
    assert metrics1["metrics"] == metrics2["metrics"]
    assert metrics1["num_failed"] == metrics2["num_failed"] == 0

    instances = {inst["id"]: inst for inst in INSTANCES}
    for row in rows1:
        n_choices = len(instances[row["instance_id"]]["choices"])
        assert len(row["generations"][0]["loglikelihoods"]) == n_choices
    want = lm_eval_accuracies(rows1, instances)
    assert metrics1["metrics"]["acc"] == pytest.approx(want["acc"], abs=1e-12)
    assert metrics1["metrics"]["acc_norm"] == pytest.approx(want["acc_norm"], abs=1e-12)
    manifest = orjson.loads((run1 / "manifest.json").read_bytes())
    assert manifest["provider"]["kind"] == "vllm"
