"""Issue #30 case 3: every value the plugin saves must read back as itself.

orjson writes NaN and infinities as `null`, so a tool result of NaN was
`nan` live and `None` at a resume or a replay, while the summary said the
episode was reused. `model.to_json` is the one check of what is saved (it is
orjson's, plus NaN and infinities refused, naming where in the value they
are); each place that saves a value (a tool result, a provider's metadata,
an agent's instance, chat messages) goes through it. Scores and judge
verdicts are checked for finite numbers where they are read
(`execution.score_generation`, `judges.check_verdict`: tests/test_execution.py,
tests/test_judges.py)."""

from __future__ import annotations

import math

import orjson
import pytest
from agent_project import AGENT, CONFTEST, INI

from pytest_evalreplay import EvalTask, Generation
from pytest_evalreplay.model import EvalReplayError, to_json


@pytest.mark.parametrize(
    ("value", "where"),
    [
        (math.nan, "nan"),
        ({"a": [1, math.inf]}, "inf at ['a'][1]"),
        ([{"x": -math.inf}], "-inf at [0]['x']"),
        ((1.0, float("nan")), "nan at [1]"),
    ],
)
def test_a_value_with_nan_or_inf_is_not_json(value, where) -> None:
    with pytest.raises(TypeError) as info:
        to_json(value)
    assert where in str(info.value)
    assert "JSON has no NaN or infinity" in str(info.value)


@pytest.mark.parametrize("value", [None, 1.5, "nan", {"a": [None, "null", 1e308]}, [], {}])
def test_json_values_are_written_as_orjson_writes_them(value) -> None:
    assert to_json(value) == orjson.dumps(value)
    assert to_json(value, orjson.OPT_SORT_KEYS) == orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def test_a_set_is_still_not_json() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        to_json({1, 2})


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_generation_whose_metadata_holds_nan_is_refused(bad) -> None:
    problem = Generation("x", metadata={"logprob": [bad]}).problem()
    assert problem is not None and "cannot be saved as JSON" in problem
    assert f"{bad} at ['metadata']['logprob'][0]" in problem


def test_an_agent_tasks_instance_with_nan_is_refused_when_its_request_is_rendered() -> None:
    task = EvalTask("t", [{"id": "a", "x": math.nan}], agent=lambda i, llm: "", scorer="exact_match")
    with pytest.raises(EvalReplayError, match=r"instance 'a'.*not JSON \(nan at \['x'\]; JSON has no NaN"):
        task.request_digests()  # at collection


def test_chat_messages_from_a_prompt_callable_with_inf_are_refused() -> None:
    def prompt(instance):
        return [{"role": "user", "content": "hi", "weight": math.inf}]

    task = EvalTask("t", [{"id": "a"}], prompt=prompt, scorer="exact_match")
    with pytest.raises(EvalReplayError, match=r"message 0 .* is not JSON \(inf at \['weight'\]"):
        task.request_digests()


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makeini(INI)
    return pytester


@pytest.mark.parametrize("bad", ['float("nan")', 'float("inf")', '{"sum": [float("-inf")]}'])
def test_a_tool_result_of_nan_or_inf_fails_the_item_and_saves_nothing_else(project, bad) -> None:
    """Before: live, the agent saw nan; the journal held null, so --resume
    served None and the summary said "6 reused" for a different answer."""
    agent = AGENT.replace("    return a + b", f"    return {bad} if a == 1 else a + b")
    project.makepyfile(test_sums=agent)
    result = project.runpytest("--evalreplay-output=run")
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*episode 'q1' rollout 0: tool 'add' returned *, not JSON (*JSON has no NaN or infinity*); "
            "return JSON values*"
        ]
    )
    journal = (project.path / "run" / "sums-turns-journal.jsonl").read_bytes()
    assert b'"result":null' not in journal.replace(b" ", b"")
    result = project.runpytest("--evalreplay-output=run", "--resume")
    result.assert_outcomes(passed=5, failed=1)  # the same answer as live: the item fails again


def test_chat_messages_with_nan_fail_the_episode_naming_llm_chat(project) -> None:
    agent = AGENT.replace("""+ {instance['b']}?"}]""", """+ {instance['b']}?", "w": float("nan")}]""")
    project.makepyfile(test_sums=agent)
    result = project.runpytest("--evalreplay-output=run")
    result.assert_outcomes(failed=6)
    result.stdout.fnmatch_lines(
        ["*episode 'q0' rollout 0: llm.chat: the messages are not JSON (nan at *JSON has no NaN*"]
    )


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        # A message the agent changed after turn 1 sent it (its copy was sent then).
        (
            "        turn = llm.chat(messages, tools=[ADD])\n",
            "        if len(messages) > 1:\n            messages[0]['w'] = float('nan')\n"
            "        turn = llm.chat(messages, tools=[ADD])\n",
            "the messages are not JSON (nan at ['context'][0]['w']",
        ),
        # A message added after turn 1.
        (
            "messages.append(tool_message(call, llm.tool(call, add)))",
            "messages.append({**tool_message(call, llm.tool(call, add)), 'w': float('inf')})",
            "the messages are not JSON (inf at ['context'][2]['w']",
        ),
        # Tools that changed after turn 1.
        (
            "llm.chat(messages, tools=[ADD])",
            "llm.chat(messages, tools=[ADD] if len(messages) == 1 else [{**ADD, 'x': float('-inf')}])",
            "tools are not JSON (-inf at [0]['x']",
        ),
    ],
    ids=["changed-message", "added-message", "changed-tools"],
)
def test_nan_in_a_later_turns_request_fails_the_episode_naming_where(project, old, new, where) -> None:
    """A turn's request is checked for NaN only where it differs from the turn
    before (which passed the check): what changed in between is still checked."""
    assert old in AGENT
    project.makepyfile(test_sums=AGENT.replace(old, new))
    result = project.runpytest("--evalreplay-output=run")
    result.assert_outcomes(failed=6)
    assert f"episode 'q0' rollout 0: llm.chat: {where}; JSON has no NaN" in result.stdout.str()
