"""A provider written to the contract's `Request.num_samples`: it answers
every sample of the prompt, whichever rollouts the request asks for. A split
request (`-k r1`, a shard holding one rollout, a partial resume) takes the
wanted ones by index; an answer of neither length names both (issue 30, case 8)."""

from __future__ import annotations

import orjson
import pytest

from pytest_evalreplay import Generation, GenerationError, Request
from pytest_evalreplay.run.execution import check_result

pytestmark = pytest.mark.filterwarnings("error")

CONFTEST = """
from pytest_evalreplay import Generation

class EverySample:
    kind, model = "every-sample", "every-1"

    def generate(self, requests):
        return [[Generation(text=f"{r.instance_id} sample {k}") for k in range(r.num_samples)]
                for r in requests]

def pytest_evalreplay_make_provider(config, kind):
    return EverySample() if kind == "every-sample" else None
"""

EVALS = """
from pytest_evalreplay import EvalTask
qa = EvalTask("qa", [{"id": "q0"}, {"id": "q1"}], prompt="Question {id}",
              scorer=lambda text, instance: text.startswith(instance["id"]), num_samples=3)
"""


def generations(pytester: pytest.Pytester, out: str = "run") -> dict[str, list[str]]:
    saved = (pytester.path / out / "qa-predictions.jsonl").read_bytes()
    rows = [orjson.loads(line) for line in saved.splitlines()]
    return {row["instance_id"]: [g["text"] for g in row["generations"]] for row in rows}


def test_a_provider_answering_num_samples_serves_k_shard_and_partial_resume(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nevalreplay_provider = every-sample\n")
    pytester.makepyfile(test_evals=EVALS)
    args = ("--evalreplay-output=run",)
    pytester.runpytest(*args, "-k", "q1 and r1").assert_outcomes(passed=1, deselected=5)
    assert generations(pytester) == {"q1": ["q1 sample 1"]}
    pytester.runpytest(*args, "--resume", "-k", "r0 or r1").assert_outcomes(passed=3, deselected=3)
    pytester.runpytest(*args, "--resume").assert_outcomes(passed=2)
    assert generations(pytester) == {
        "q0": ["q0 sample 0", "q0 sample 1", "q0 sample 2"],
        "q1": ["q1 sample 0", "q1 sample 1", "q1 sample 2"],
    }
    shard = ("--evalreplay-output=shard", "--evalreplay-shard=2/3")
    pytester.runpytest(*shard).assert_outcomes(passed=1, deselected=5)  # q0's r1 alone (shard_of)
    assert generations(pytester, "shard") == {"q0": ["q0 sample 1"]}


def request(rollouts: tuple[int, ...]) -> Request:
    return Request(task="t", instance_id="i", context="p", num_samples=4, rollouts=rollouts)


def test_an_answer_per_sample_is_cut_to_the_wanted_rollouts_by_index():
    answer = [Generation(text=f"s{k}") for k in range(4)]
    assert [g.text for g in check_result(request((1, 3)), answer)] == ["s1", "s3"]
    assert [g.text for g in check_result(request((1, 3)), answer[:2])] == ["s0", "s1"]
    assert [g.text for g in check_result(request((0, 1, 2, 3)), answer)] == ["s0", "s1", "s2", "s3"]


def test_an_answer_of_neither_length_names_both():
    err = check_result(request((1, 3)), [Generation(text="x")] * 3)
    assert isinstance(err, GenerationError) and not err.retryable
    assert "3 generations for rollouts (1, 3) of num_samples=4" in err.message
    assert "expected 2 (one per rollout, in that order) or 4 (one per sample)" in err.message
    err = check_result(request((1,)), "text")
    assert isinstance(err, GenerationError) and "'text'" in err.message and "expected 1" in err.message
