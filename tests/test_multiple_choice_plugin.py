"""Multiple-choice tasks end to end under pytest: a conftest provider's
log-likelihoods journaled and scored (acc, acc_norm, bpb), the run dir they
leave replayed to the same numbers, --resume reusing every item, an edited
choice regenerating only its instance, and a Gate on acc."""

from __future__ import annotations

import orjson
import pytest

CONFTEST = """
from pytest_evalreplay import Generation

class Scorer:
    kind, model, batch_size = "ll", "ll-1", None

    def generate(self, requests):
        raise AssertionError("a choices task never generates")

    def loglikelihood(self, requests):
        with open("calls.log", "a") as fh:
            fh.write(" ".join(r.instance_id for r in requests) + "\\n")
        # The right answer is the continuation that ends the prompt's word ("...=4" -> " 4").
        return [
            [(-1.0 if c.strip() == r.context.split("=")[-1] else -2.0 - len(c), c.strip() == "4")
             for c in r.continuations]
            for r in requests
        ]

def pytest_evalreplay_make_provider(config, kind):
    return Scorer() if kind == "ll" else None
"""

EVALS = """
from pytest_evalreplay import EvalTask, Gate, scorers

ITEMS = [
    {"id": "a", "q": "2+2=4", "choices": ["3", "4", "five"], "gold": 1},
    {"id": "b", "q": "1+2=3", "choices": ["3", "4"], "gold": "3"},
    {"id": "c", "q": "2+3=5", "choices": ["5", "six"], "gold": 1},
]

mc = EvalTask("mc", ITEMS, prompt="{q}", choices="choices", target="gold",
              scorer=scorers.multiple_choice(metrics=("acc", "acc_norm", "bpb")),
              gate=Gate("acc", min=0.5))
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", *args)


def metrics(pytester: pytest.Pytester, out: str) -> dict[str, float]:
    return orjson.loads((pytester.path / out / "mc-metrics.json").read_bytes())["metrics"]


def calls(pytester: pytest.Pytester) -> list[str]:
    log = pytester.path / "calls.log"
    return log.read_text().split("\n")[:-1] if log.exists() else []


def test_a_choices_task_runs_replays_and_resumes(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_evals=EVALS)
    made = run(pytester, "--evalreplay-provider=ll", "--evalreplay-output=run")
    made.assert_outcomes(passed=4)  # three items and the gate (acc 2/3 >= 0.5)
    assert calls(pytester) == ["a b c"]  # one batch, one call
    got = metrics(pytester, "run")
    assert got["acc"] == pytest.approx(2 / 3) and got["acc_norm"] == pytest.approx(2 / 3)
    requests = [
        orjson.loads(line) for line in (pytester.path / "run" / "mc-requests.jsonl").read_bytes().splitlines()
    ]
    assert requests[0]["request_type"] == "loglikelihood"
    assert requests[0]["continuations"] == [" 3", " 4", " five"]
    rows = [
        orjson.loads(line)
        for line in (pytester.path / "run" / "mc-predictions.jsonl").read_bytes().splitlines()
    ]
    assert rows[0]["generations"][0]["loglikelihoods"] == [[-4.0, False], [-1.0, True], [-7.0, False]]

    replayed = run(pytester, "--evalreplay-predictions=run", "--evalreplay-output=again")
    replayed.assert_outcomes(passed=1, deselected=3)
    assert metrics(pytester, "again") == got
    assert calls(pytester) == ["a b c"]  # replay asked the conftest provider nothing

    resumed = run(pytester, "--evalreplay-provider=ll", "--evalreplay-output=run", "--resume")
    resumed.assert_outcomes(passed=1, deselected=3)  # every item reused (deselected); the gate judged
    resumed.stdout.fnmatch_lines(["*0 generated, 3 reused*"])
    assert calls(pytester) == ["a b c"]

    pytester.makepyfile(test_evals=EVALS.replace('"six"', '"6"'))
    edited = run(pytester, "--evalreplay-provider=ll", "--evalreplay-output=run", "--resume")
    edited.assert_outcomes(passed=2, deselected=2)
    edited.stdout.fnmatch_lines(["*1 generated, 2 reused*"])
    assert calls(pytester) == ["a b c", "c"]  # only the edited instance asked again


def test_a_provider_without_loglikelihood_is_a_usage_error_naming_the_task(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.replace("def loglikelihood", "def not_loglikelihood"))
    pytester.makepyfile(test_evals=EVALS)
    result = run(pytester, "--evalreplay-provider=ll", "--evalreplay-output=run")
    text = result.stdout.str()
    assert (
        "task 'mc' scores answer choices by log-likelihood, and the 'll' provider has no loglikelihood"
        in text
    )
    assert "INTERNALERROR" not in text
    assert calls(pytester) == []


def test_replaying_with_an_edited_choice_fails_that_instance_naming_the_difference(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_evals=EVALS)
    run(pytester, "--evalreplay-provider=ll", "--evalreplay-output=run").assert_outcomes(passed=4)
    pytester.makepyfile(test_evals=EVALS.replace('"five"', '"5"'))
    result = run(pytester, "--evalreplay-predictions=run", "--evalreplay-output=again")
    result.assert_outcomes(deselected=2, failed=2)  # instance a, and the gate over the failure budget
    result.stdout.fnmatch_lines(
        ["*run/mc-predictions.jsonl:1 differs, continuation 2 is ' five' there and ' 5' here*"]
    )


def test_acc_flows_through_gates_baselines_and_compare(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_evals=EVALS.replace("min=0.5", "min=0.9"))
    failed = run(pytester, "--evalreplay-provider=ll", "--evalreplay-output=run")
    failed.assert_outcomes(passed=3, failed=1)
    failed.stdout.fnmatch_lines(["*gate mc: FAIL acc=0.6667; min 0.9*"])
    pytester.makepyfile(test_evals=EVALS.replace("min=0.5", "max_drop=0.1"))
    base = ("--evalreplay-baseline=base.json",)
    run(
        pytester, "--evalreplay-provider=ll", "--evalreplay-output=run", *base, "--evalreplay-update-baseline"
    )
    doc = orjson.loads((pytester.path / "base.json").read_bytes())
    assert doc["tasks"]["mc"]["metrics"]["acc"] == pytest.approx(2 / 3)
    compared = run(
        pytester,
        "--evalreplay-predictions=run",
        "--evalreplay-output=again",
        *base,
        "--evalreplay-compare=run",
    )
    compared.assert_outcomes(passed=1, deselected=3)
    text = compared.stdout.str()
    assert "acc" in text and "compare" in text.lower()


def test_compare_shows_the_choice_each_run_picked_for_a_flipped_instance(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_evals=EVALS)
    run(pytester, "--evalreplay-provider=ll", "--evalreplay-output=base").assert_outcomes(passed=4)
    # A model that likes long answers: "c" flips to its gold ("six"), "a" to "five".
    pytester.makeconftest(
        CONFTEST.replace("-2.0 - len(c)", "-2.0 + len(c) / 10").replace("-1.0 if", "-1.9 if")
    )
    compared = run(
        pytester, "--evalreplay-provider=ll", "--evalreplay-output=new", "--evalreplay-compare=base"
    )
    compared.stdout.fnmatch_lines(['*base: "5"*new: "six"*'])
    compared.stdout.fnmatch_lines(['*base: "4"*new: "five"*'])
