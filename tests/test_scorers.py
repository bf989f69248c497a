"""Built-in scorers and the reasoning strip, called directly."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalreplay import EvalTask, Generation, scorers
from pytest_evalreplay.run.execution import score_generation


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>hmm</think>Paris", "Paris"),
        ("<think>a</think> x <think>b</think> y", "x  y"),
        ("<think>never closed, out of tokens", ""),
        ("no reasoning", "no reasoning"),
        ("", ""),
    ],
)
def test_strip_reasoning(text, expected):
    assert scorers.strip_reasoning(text) == expected


@given(st.text())
def test_strip_reasoning_never_leaves_a_think_block(text):
    stripped = scorers.strip_reasoning(f"<think>{text}</think>answer")
    assert stripped.endswith("answer") or "</think>" in text


def test_exact_match_normalises_and_extracts_the_last_match():
    em = scorers.exact_match(extract=r"Answer:\s*(.+)")
    assert em.score("Answer: no\nAnswer: The Paris.", "paris") == 1.0
    assert em.score("Answer: Lyon", "Paris") == 0.0
    assert em.score("nothing to extract", "Paris") == 0.0
    assert em.score("Answer: Rome", ["Paris", "Rome"]) == 1.0
    assert scorers.exact_match(normalize=False).score("Paris", "paris") == 0.0


@pytest.mark.parametrize(
    ("text", "target", "expected"),
    [
        ("The answer is 42.", 42, 1.0),
        ("so 1,234 apples", "1234", 1.0),
        ("first 3 then 4", 3, 0.0),
        ("-7", -7, 1.0),
        ("3.0000001", 3, 1.0),
        ("no number", 3, 0.0),
        ("1e3", 1000, 1.0),
    ],
)
def test_numeric_match(text, target, expected):
    assert scorers.numeric_match(tolerance=1e-6).score(text, target) == expected


def test_numeric_match_relative_tolerance_and_extractor():
    assert scorers.numeric_match(tolerance=0.01, relative=True).score("101", 100) == 1.0
    assert scorers.numeric_match(tolerance=0.001, relative=True).score("101", 100) == 0.0
    assert scorers.numeric_match(extract=r"#### (.*)").score("12 steps #### 7", 7) == 1.0


def test_contains():
    assert scorers.contains().score("It is the Eiffel Tower!", "eiffel tower") == 1.0
    assert scorers.contains(normalize=False).score("It is the Eiffel Tower!", "eiffel") == 0.0


@given(st.floats(allow_nan=False, allow_infinity=False, width=32), st.floats(0, 1))
def test_numeric_match_of_its_own_rendering(value, tol):
    assert (
        scorers.numeric_match(tolerance=max(tol, 1e-3) * (abs(value) + 1)).score(f"result: {value!r}", value)
        == 1.0
    )


def _scored_by(scorer):
    task = EvalTask("t", [{"id": "a"}], prompt="Q", scorer=scorer)
    return score_generation(task, task.instance("a"), Generation(text="x"))


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (SystemExit(3), "scorer raised SystemExit: 3"),
        (asyncio.CancelledError("gone"), "scorer raised CancelledError: gone"),
        (GeneratorExit(), "scorer raised GeneratorExit: "),
    ],
)
def test_a_scorer_raising_a_base_exception_fails_that_rollout(exc, message):
    def scorer(text, instance):
        raise exc

    assert _scored_by(scorer) == (None, message)


def test_ctrl_c_in_a_scorer_still_stops():
    def scorer(text, instance):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _scored_by(scorer)
