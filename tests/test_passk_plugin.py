"""pass@k and maj@k through the plugin: the summary, metrics.json, the
predictions rows, a gate naming pass@k, the baseline and compare."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import orjson
import pytest

from pytest_evalreplay import EvalTask, Generation

pytestmark = pytest.mark.filterwarnings("error")

# instance -> each rollout's answer; the target is "4" everywhere
ANSWERS = {
    "q0": ["4", "4", "5", "5"],  # 2 right; maj@4 a 2-2 tie: 1/2
    "q1": ["5", "5", "5", "4"],  # 1 right
    "q2": ["4", "4", "4", "4"],  # 4 right
    "q3": ["6", "5", "6", "7"],  # none right
}
WORSE = {**ANSWERS, "q2": ["5", "5", "5", "5"]}


def pass2(right: int) -> float:
    return float(1 - Fraction(comb(4 - right, 2), comb(4, 2)))


PASS2 = {"q0": pass2(2), "q1": pass2(1), "q2": 1.0, "q3": 0.0}
MAJ4 = {"q0": 0.5, "q1": 0.0, "q2": 1.0, "q3": 0.0}

CONFTEST = """
import os
from pytest_evalreplay import Generation

ANSWERS = {answers}
WORSE = {worse}

class Sampler:
    kind = "sampler"
    model = "sampler-1"

    def generate(self, requests):
        table = WORSE if os.environ.get("WORSE") else ANSWERS
        return [
            [Generation(text=f"Answer: {{table[r.instance_id][n]}}") for n in r.rollouts] for r in requests
        ]

def pytest_evalreplay_make_provider(config, kind):
    return Sampler() if kind == "sampler" else None
"""

EVALS = """
from pytest_evalreplay import EvalTask, Gate, scorers

math = EvalTask("math", [{{"id": i, "target": "4"}} for i in ("q0", "q1", "q2", "q3")], prompt="{{id}}",
                scorer=scorers.exact_match(extract=r"Answer: (.*)"), num_samples=4, {args})
"""


@pytest.fixture
def suite(pytester: pytest.Pytester):
    pytester.makeconftest(CONFTEST.format(answers=ANSWERS, worse=WORSE))
    pytester.makeini("[pytest]\nevalreplay_provider = sampler\n")

    def make(args: str) -> None:
        pytester.makepyfile(test_evals=EVALS.format(args=args))

    return make


def metrics_doc(pytester: pytest.Pytester, run: str = "run") -> dict:
    return orjson.loads((pytester.path / run / "math-metrics.json").read_bytes())


def test_metrics_in_the_summary_metrics_json_and_predictions(pytester, suite):
    suite('metrics=["pass@2", "maj@4"]')
    result = pytester.runpytest("--evalreplay-output=run")
    result.assert_outcomes(passed=16)
    doc = metrics_doc(pytester)
    want_pass = sum(PASS2.values()) / 4
    assert doc["metrics"]["pass@2"] == pytest.approx(want_pass)
    assert doc["metrics"]["maj@4"] == pytest.approx(sum(MAJ4.values()) / 4)
    assert doc["metrics"]["exact_match"] == pytest.approx(7 / 16)
    lo, hi = doc["ci95"]["pass@2"]
    assert 0.0 <= lo < want_pass < hi <= 1.0
    result.stdout.fnmatch_lines([f"*pass@2*{want_pass:.3f}*"])
    rows = [
        orjson.loads(line)
        for line in (pytester.path / "run" / "math-predictions.jsonl").read_bytes().splitlines()
    ]
    for row in rows:
        assert row["scores"]["pass@2"] == pytest.approx(PASS2[row["instance_id"]])
        assert row["scores"]["maj@4"] == pytest.approx(MAJ4[row["instance_id"]])


def test_a_gate_naming_pass_at_k_computes_it_and_judges_it(pytester, suite):
    suite('gate=Gate("pass@2", min=0.6)')
    result = pytester.runpytest("--evalreplay-output=run")
    result.assert_outcomes(passed=16, failed=1)
    result.stdout.fnmatch_lines(["*gate math: FAIL pass@2=0.5833; min 0.6*"])
    assert set(metrics_doc(pytester)["metrics"]) == {"exact_match", "pass@2"}


def test_baseline_and_compare_pair_pass_at_k_over_instances(pytester, suite, monkeypatch):
    suite('gate=Gate("pass@2", max_drop=0.01)')
    base = pytester.runpytest(
        "--evalreplay-output=base", "--evalreplay-baseline=b.json", "--evalreplay-update-baseline"
    )
    base.assert_outcomes(passed=17)
    saved = orjson.loads((pytester.path / "b.json").read_bytes())["tasks"]["math"]
    assert saved["scores"] == pytest.approx(PASS2)
    monkeypatch.setenv("WORSE", "1")
    result = pytester.runpytest(
        "--evalreplay-output=new", "--evalreplay-baseline=b.json", "--evalreplay-compare=base"
    )
    result.assert_outcomes(passed=17)  # four instances cannot make a drop of 0.25 significant
    result.stdout.fnmatch_lines(
        [
            "*gate math: PASS pass@2=0.3333; baseline 0.5833 *paired t-test over 4 instances: change -0.25*",
            "*pass@2: 0.5833 *-> 0.3333 * diff -0.2500*",
            "*q2 ?pass@2 1 -> 0?*",
        ]
    )


def test_evaluate_outside_pytest_has_the_metrics():
    class Sampler:
        kind = "sampler"
        model = "sampler-1"

        def generate(self, requests):
            return [
                [Generation(text=f"Answer: {ANSWERS[r.instance_id][n]}") for n in range(r.num_samples)]
                for r in requests
            ]

    from pytest_evalreplay import scorers

    task = EvalTask(
        "math",
        [{"id": i, "target": "4"} for i in ANSWERS],
        prompt="{id}",
        scorer=scorers.exact_match(extract=r"Answer: (.*)"),
        num_samples=4,
        metrics=["pass@2", "maj@4"],
    )
    result = task.evaluate(Sampler())
    assert result.metrics["pass@2"] == pytest.approx(sum(PASS2.values()) / 4)
    assert result.metrics["maj@4"] == pytest.approx(sum(MAJ4.values()) / 4)
    assert result.scores["q0"]["pass@2"] == pytest.approx(PASS2["q0"])


def test_a_scorer_with_several_scores_needs_the_score_named(pytester, suite):
    pytester.makepyfile(
        test_evals="""
from pytest_evalreplay import EvalTask

def two(text, instance):
    return {"right": text.endswith("4"), "length": float(len(text))}

math = EvalTask("math", [{"id": i} for i in ("q0", "q1")], prompt="{id}", scorer=two, num_samples=4,
                metrics=["pass@2", "maj@2:right"])
"""
    )
    result = pytester.runpytest("--evalreplay-output=run")
    result.assert_outcomes(failed=8)
    result.stdout.fnmatch_lines(["*pass@2 judges a sample by its one score*'pass@2:length'*"])
    pytester.makepyfile(
        test_evals="""
from pytest_evalreplay import EvalTask

def two(text, instance):
    return {"right": text.endswith("4"), "length": float(len(text))}

math = EvalTask("math", [{"id": i} for i in ("q0", "q1")], prompt="{id}", scorer=two, num_samples=4,
                metrics=["pass@2:right", "maj@2:right"])
"""
    )
    result = pytester.runpytest("--evalreplay-output=run")
    result.assert_outcomes(passed=8)
    doc = metrics_doc(pytester)
    assert doc["metrics"]["pass@2:right"] == pytest.approx((pass2(2) + pass2(1)) / 2)


def test_answers_group_as_the_scorer_compares_them(pytester, suite):
    # numeric_match compares numbers: "4", "4.0" and "4,000"-free spellings vote together
    pytester.makepyfile(
        test_evals="""
from pytest_evalreplay import EvalTask, scorers

math = EvalTask("math", [{"id": i, "target": 5} for i in ("q0", "q1", "q2", "q3")], prompt="{id}",
                scorer=scorers.numeric_match(), num_samples=4, metrics=["maj@4"])
"""
    )
    result = pytester.runpytest("--evalreplay-output=run")
    result.assert_outcomes(passed=16)
    # target 5: q0 2-2 tie (1/2), q1 3 of 4 say 5 (1), q2 0, q3 1 of 4 says 5 and 6 wins (0)
    assert metrics_doc(pytester)["metrics"]["maj@4"] == pytest.approx(1.5 / 4)


def test_a_scorer_object_says_what_its_answer_is():
    class Parity:
        """Right on even numbers; the answer maj@k counts is the number's parity."""

        __name__ = "even"

        def __call__(self, text, instance):
            return int(text) % 2 == 0

        def answer(self, text, instance):
            return int(text) % 2

    class Counter:
        kind = "counter"
        model = "counter-1"

        def generate(self, requests):
            # q0: 2, 4, 5 -> two even answers (one answer: parity 0) against one odd: maj right
            return [[Generation(text=t) for t in ("2", "4", "5")] for _ in requests]

    task = EvalTask("p", [{"id": "q0"}], prompt="{id}", scorer=Parity(), num_samples=3, metrics=["maj@3"])
    assert task.evaluate(Counter()).metrics["maj@3"] == 1.0


def test_a_significant_pass_at_k_drop_fails_the_gate(pytester, monkeypatch):
    pytester.makeconftest(
        """
import os
from pytest_evalreplay import Generation

class Sampler:
    kind, model = "sampler", "sampler-1"

    def generate(self, requests):
        right = 0 if os.environ.get("WORSE") else 2  # of each instance's 4 samples
        return [[Generation(text="4" if n < right else "5") for n in r.rollouts] for r in requests]

def pytest_evalreplay_make_provider(config, kind):
    return Sampler() if kind == "sampler" else None
"""
    )
    pytester.makeini("[pytest]\nevalreplay_provider = sampler\n")
    pytester.makepyfile(
        test_evals="""
from pytest_evalreplay import EvalTask, Gate

math = EvalTask("math", [{"id": f"q{n}", "target": "4"} for n in range(30)], prompt="{id}",
                scorer="exact_match", num_samples=4, gate=Gate("pass@2", max_drop=0.1))
"""
    )
    args = ("--evalreplay-output=run", "--evalreplay-baseline=b.json")
    pytester.runpytest(*args, "--evalreplay-update-baseline").assert_outcomes(passed=121)
    monkeypatch.setenv("WORSE", "1")
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=120, failed=1)
    result.stdout.fnmatch_lines(["*pass@2 dropped 0.8333 below the baseline over 30 paired instances*"])


def test_a_replay_of_the_run_dir_gives_the_same_metrics(pytester, suite):
    suite('metrics=["pass@2", "maj@4"]')
    pytester.runpytest("--evalreplay-output=run").assert_outcomes(passed=16)
    result = pytester.runpytest("--evalreplay-output=again", "--evalreplay-predictions=run")
    result.assert_outcomes(deselected=16)
    assert metrics_doc(pytester, "again")["metrics"] == metrics_doc(pytester)["metrics"]
