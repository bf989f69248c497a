"""judges.py as pure logic: the LLM judge's prompt (filled in one pass, the
answers' positions swapped on odd trials), its verdict reading (every label,
swapped back; an unreadable reply said so, never a silent tie) and
check_verdict on a function judge's values."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from pytest_evalreplay import judges
from pytest_evalreplay.judges import UNREADABLE, LlmJudge, Verdict, check_verdict
from pytest_evalreplay.model import EvalReplayError

TEMPLATE = "T:{task}|A:{answer_a}|B:{answer_b}"


def judge(**kwargs: object) -> LlmJudge:
    return judges.llm("stub", template=TEMPLATE, **kwargs)  # type: ignore[arg-type]


# -- the prompt -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trial", "a", "b"), [(0, "cand", "ref"), (1, "ref", "cand"), (2, "cand", "ref"), (3, "ref", "cand")]
)
def test_the_candidate_is_answer_a_on_even_trials_and_b_on_odd_ones(trial: int, a: str, b: str) -> None:
    assert judge().prompt("task", "cand", "ref", trial) == f"T:task|A:{a}|B:{b}"


def test_the_default_template_puts_each_text_in_its_own_section() -> None:
    prompt = judges.llm().prompt("2+2?", "four", "five", 1)
    assert "[Task]\n2+2?\n\n[Answer A]\nfive\n\n[Answer B]\nfour\n\n" in prompt


@pytest.mark.parametrize("trial", [0, 1])
def test_a_candidate_answer_cannot_rewrite_the_prompt(trial: int) -> None:
    """Issue #17 case 7: chained str.replace filled {answer_b} inside the candidate's answer."""
    candidate = "ignore {answer_b} and {answer_a} and {task}"
    a, b = (candidate, "REF") if trial == 0 else ("REF", candidate)
    assert judge().prompt("TASK", candidate, "REF", trial) == f"T:TASK|A:{a}|B:{b}"


def test_a_task_text_or_reference_with_placeholders_is_kept_as_written() -> None:
    task, ref = "say {answer_a} or {answer_b}", "{task}{answer_a}"
    assert judge().prompt(task, "c", ref, 0) == f"T:{task}|A:c|B:{ref}"


def test_other_braces_in_the_template_are_left_alone() -> None:
    j = judges.llm(template="{task} {other} {{answer_a}} {answer_a} {answer_b}")
    assert j.prompt("t", "x", "y", 0) == "t {other} {x} x y"


@pytest.mark.parametrize("missing", ["{task}", "{answer_a}", "{answer_b}"])
def test_a_template_missing_a_placeholder_is_refused(missing: str) -> None:
    with pytest.raises(EvalReplayError, match=missing.strip("{}")):
        judges.llm(template=TEMPLATE.replace(missing, ""))


# -- reading a reply --------------------------------------------------------------


@pytest.mark.parametrize(
    ("trial", "label", "score"),
    [
        (0, "A", 1.0),
        (0, "B", 0.0),
        (1, "A", 0.0),
        (1, "B", 1.0),
        (0, "TIE", 0.5),
        (1, "TIE", 0.5),
        (2, "A", 1.0),
        (3, "A", 0.0),
    ],
)
def test_each_label_scores_the_candidate_swapped_back_on_odd_trials(
    trial: int, label: str, score: float
) -> None:
    assert judge().verdict(f"I pick [[{label}]].", trial) == Verdict(score, label)


def test_a_verdict_repeated_in_a_reply_reads_once_and_spacing_is_allowed() -> None:
    assert judge().verdict("[[A]] ... so, to repeat: [[ a ]]", 0) == Verdict(1.0, "A")


@pytest.mark.parametrize(
    ("reply", "named"),
    [
        ("[[A]] and [[B]]", "A, B"),
        ("maybe [[B]] ... on reflection [[ A ]]", "A, B"),
        ("[[TIE]] [[B]]", "B, TIE"),
    ],
)
@pytest.mark.parametrize("unreadable", ["fail", "tie"])
def test_conflicting_verdicts_in_one_reply_are_unreadable(reply: str, named: str, unreadable: str) -> None:
    """Issue #30 case 5: `[[A]] and [[B]]` was read as A (the last marker won)."""
    v = judge(unreadable=unreadable).verdict(reply, 0)  # type: ignore[arg-type]
    assert v.label == UNREADABLE and not v.readable
    assert v.score == (0.5 if unreadable == "tie" else None)
    assert v.reason is not None and f"conflicting verdicts {named}" in v.reason and repr(reply) in v.reason


def test_a_custom_pattern_reads_its_own_labels() -> None:
    j = judges.llm(pattern=r"(?i)winner:\s*(a|b|tie)")
    assert j.verdict("Winner: b", 1) == Verdict(1.0, "B")
    assert j.verdict("WINNER: Tie", 0) == Verdict(0.5, "TIE")


@pytest.mark.parametrize("reply", ["I cannot decide.", "", "[[C]]", "[[A or B]]"])
@pytest.mark.parametrize("trial", [0, 1])
def test_an_unreadable_reply_is_a_judging_failure_by_default(reply: str, trial: int) -> None:
    """Issue #17 case 8: an unreadable reply was a silent tie."""
    v = judge().verdict(reply, trial)
    assert v.score is None and v.label == UNREADABLE and not v.readable
    assert v.reason is not None and "[[A]], [[B]] or [[TIE]]" in v.reason and repr(reply[:20]) in v.reason


def test_a_pattern_capturing_another_word_is_unreadable_naming_it() -> None:
    v = judges.llm(pattern=r"verdict: (\w+)").verdict("verdict: C", 0)
    assert v.score is None and v.reason is not None and "'C'" in v.reason


def test_unreadable_replies_can_be_kept_as_ties_but_still_say_so() -> None:
    v = judge(unreadable="tie").verdict("I cannot decide.", 1)
    assert v.score == 0.5 and v.label == UNREADABLE and not v.readable and v.reason


def test_a_long_unreadable_reply_is_shortened_in_the_reason() -> None:
    v = judge().verdict("x" * 10_000, 0)
    assert v.reason is not None and len(v.reason) < 300


def test_the_unreadable_policy_is_checked_and_part_of_the_identity() -> None:
    with pytest.raises(EvalReplayError, match=r"unreadable=.loss.*.fail.*.tie."):
        judges.llm(unreadable="loss")  # type: ignore[arg-type]
    assert judge().identity()["unreadable"] == "fail"
    assert judge(unreadable="tie").identity() != judge().identity()


def test_a_verdict_score_is_consistent_with_its_label() -> None:
    with pytest.raises(ValueError, match="score"):
        Verdict(0.7, "A")
    with pytest.raises(ValueError, match="reason"):
        Verdict(None, UNREADABLE)
    with pytest.raises(ValueError, match="label"):
        Verdict(1.0, "C")


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"trials": 0}, "trials=0"),
        ({"trials": True}, "trials=True"),
        ({"pattern": "("}, "not a regular expression"),
        ({"pattern": "A|B"}, "exactly one group"),
        ({"sampling": [1]}, "sampling"),
    ],
)
def test_bad_llm_judge_settings_are_refused(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(EvalReplayError, match=words.replace("(", r"\(")):
        judges.llm(**kwargs)  # type: ignore[arg-type]


# -- a function judge's values ------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, 1.0),
        (0, 0.0),
        (0.5, 0.5),
        (True, 1.0),
        (False, 0.0),
        (np.float64(0.5), 0.5),
        (Fraction(1, 2), 0.5),
    ],
)
def test_check_verdict_accepts_win_tie_and_loss(value: object, expected: float) -> None:
    got = check_verdict(value)
    assert got == expected and type(got) is float


@pytest.mark.parametrize(
    "value", [0.7, -1, 2, math.nan, math.inf, None, "1", "win", [1], 1j, np.array([1.0])]
)
def test_check_verdict_refuses_anything_else_naming_it_and_the_fix(value: object) -> None:
    with pytest.raises(ValueError, match=r"the judge returned .*return 1 \(win\), 0.5 \(tie\) or 0 \(loss\)"):
        check_verdict(value)


def test_check_verdict_names_the_value_shortened() -> None:
    with pytest.raises(ValueError, match="'xxxx") as info:
        check_verdict("x" * 1000)
    assert len(str(info.value)) < 150
