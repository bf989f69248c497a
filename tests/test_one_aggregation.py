"""The session's metrics, `EvalTask.evaluate` and a snapshot of the run dir
agree exactly (==, not approx) on "mean over instances of the mean over
rollouts", on scores where `math.fsum` and a plain sum differ in the last
bit: all three compute it with `metrics.instance_means` / `task_means`."""

from __future__ import annotations

import math
import sys

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalreplay import EvalTask
from pytest_evalreplay.numbers.metrics import instance_means, task_means
from pytest_evalreplay.rundir.snapshot import load_run_dir

pytestmark = pytest.mark.filterwarnings("error")

# instance -> each rollout's score (the provider answers the number, the scorer reads it)
# (chosen so that fsum and a plain sum differ for q0 and for the task, and
# q0's plain sum differs in the order 1, 2, 0)
SCORES = {"q0": [0.5, 0.2, 0.6], "q1": [0.9, 0.7, 0.9], "q2": [0.4, 0.5, 0.5]}

PROVIDER = """
from pytest_evalreplay import Generation

SCORES = {scores!r}


class Numbers:
    kind = "numbers"
    model = "numbers-1"

    def generate(self, requests):
        return [[Generation(text=repr(SCORES[r.instance_id][n])) for n in r.rollouts] for r in requests]
"""

CONFTEST = """
from numbers_provider import Numbers

def pytest_evalreplay_make_provider(config, kind):
    return Numbers() if kind == "numbers" else None
"""

EVALS = """
from pytest_evalreplay import EvalTask

def read(text, instance):
    return float(text)

t = EvalTask("t", [{"id": i} for i in ("q0", "q1", "q2")], prompt="{id}", scorer=read, num_samples=3)
"""


def fsum_means(scores: dict[str, list[float]]) -> tuple[dict[str, float], float]:
    per_instance = {iid: math.fsum(v) / len(v) for iid, v in scores.items()}
    return per_instance, math.fsum(per_instance.values()) / len(per_instance)


# From Python 3.12 sum() of floats is compensated and gives fsum's result here.
COMPENSATED_SUM = sys.version_info >= (3, 12)


@pytest.mark.skipif(COMPENSATED_SUM, reason="sum() of floats is compensated from Python 3.12, as fsum is")
def test_the_case_tells_fsum_from_a_plain_sum():
    per_instance, overall = fsum_means(SCORES)
    means = instance_means((iid, {"read": v}) for iid, vals in SCORES.items() for v in vals)
    assert means["q0"]["read"] != per_instance["q0"]
    assert task_means(means)["read"] != overall


def test_session_evaluate_and_snapshot_agree_exactly(pytester: pytest.Pytester):
    provider = PROVIDER.format(scores=SCORES)
    pytester.makepyfile(numbers_provider=provider)
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nevalreplay_provider = numbers\n")
    pytester.makepyfile(test_evals=EVALS)
    pytester.runpytest("--evalreplay-output=run").assert_outcomes(passed=9)
    run = pytester.path / "run"
    session = orjson.loads((run / "t-metrics.json").read_bytes())["metrics"]

    namespace: dict[str, object] = {}
    exec(provider, namespace)
    exec(EVALS, namespace)
    task = namespace["t"]
    assert isinstance(task, EvalTask)
    evaluated = task.evaluate(namespace["Numbers"]())  # type: ignore[operator]
    assert evaluated.metrics == session
    assert evaluated.metrics["read"] != fsum_means(SCORES)[1] or COMPENSATED_SUM

    snapshot = load_run_dir(run).tasks["t"]
    assert snapshot.metrics == session
    assert snapshot.scores == evaluated.scores

    # q0's samples in two rows, as a run that crashed between batches saves them:
    # the snapshot pools them, and must still give the session's mean.
    path = run / "t-predictions.jsonl"
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    q0 = next(row for row in rows if row["instance_id"] == "q0")
    rest = [row for row in rows if row is not q0]
    gens, samples = q0["generations"], q0["sample_scores"]
    halves = [
        {**q0, "generations": gens[a:b], "sample_scores": samples[a:b], "rollouts": list(range(a, b))}
        for a, b in ((1, 3), (0, 1))
    ]
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in [*halves, *rest]))
    pooled = load_run_dir(run).tasks["t"].scores
    assert pooled == evaluated.scores
    assert pooled["q0"]["read"] != fsum_means(SCORES)[0]["q0"] or COMPENSATED_SUM


def means_all_at_once(samples: list[tuple[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """instance_means as it was written before it summed one instance at a time."""
    sums: dict[str, dict[str, list[float]]] = {}
    for iid, scores in samples:
        slot = sums.setdefault(iid, {})
        for name, value in scores.items():
            slot.setdefault(name, []).append(value)
    return {iid: {n: sum(v) / len(v) for n, v in m.items()} for iid, m in sums.items()}


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["q0", "q1", "q2"]),
            st.dictionaries(st.sampled_from(["a", "b"]), st.floats(-1e3, 1e3), max_size=2),
        ),
        max_size=12,
    ),
    st.booleans(),
)
def test_instance_means_sum_in_the_order_given_whether_or_not_instances_come_together(
    samples: list[tuple[str, dict[str, float]]], grouped: bool
) -> None:
    if grouped:  # as a run's items come: instance by instance, in order within each
        samples.sort(key=lambda pair: pair[0])
    means = instance_means(iter(samples))
    assert means == means_all_at_once(samples)
    assert list(means) == list(means_all_at_once(samples))
    assert [list(m) for m in means.values()] == [list(m) for m in means_all_at_once(samples).values()]
