"""EvalTask without pytest: instances, prompts, scoring and evaluate()."""

from __future__ import annotations

import re

import pytest

from pytest_evalreplay import EvalReplayError, EvalTask, Generation, GenerationError, scorers
from pytest_evalreplay import task as task_module
from pytest_evalreplay.values.fingerprint import callable_identity


class Echo:
    """Answers each prompt with the prompt itself."""

    kind = "echo"
    model = "echo"

    def __init__(self) -> None:
        self.calls = 0

    def generate(self, requests):
        self.calls += 1
        return [[Generation(text=str(r.context)) for _ in r.rollouts] for r in requests]


def test_evaluate_scores_every_instance_with_one_call():
    task = EvalTask(
        "t",
        [{"id": "a", "x": "yes"}, {"id": "b", "x": "no"}],
        prompt="{x}",
        scorer=lambda text, inst: text == "yes",
    )
    provider = Echo()
    result = task.evaluate(provider)
    assert provider.calls == 1
    assert result.metrics == {"score": 0.5}
    assert result.scores == {"a": {"score": 1.0}, "b": {"score": 0.0}}
    assert result.errors == {}


def test_dict_scores_and_named_functions():
    def quality(text, inst):
        return {"length": len(text), "exact": text == "hi"}

    result = EvalTask("t", [{"id": "a"}], prompt="hi", scorer=quality).evaluate(Echo())
    assert result.metrics == {"exact": 1.0, "length": 2.0}


def test_builtin_scorer_by_name_uses_the_target_field():
    task = EvalTask(
        "t", [{"id": "a", "gold": "42"}], prompt="it is 42", scorer="numeric_match", target="gold"
    )
    assert task.evaluate(Echo()).metrics == {"numeric_match": 1.0}


def test_missing_target_field_names_the_fix():
    task = EvalTask("t", [{"id": "a"}], prompt="x", scorer=scorers.contains())
    result = task.evaluate(Echo())
    assert "set EvalTask(target=...)" in result.errors["a"]
    assert result.metrics == {}


def test_errors_are_reported_not_scored_zero():
    class Failing:
        def generate(self, requests):
            return [GenerationError("boom") for _ in requests]

    result = EvalTask("t", [{"id": "a"}], prompt="x", scorer="contains").evaluate(Failing())
    assert result.errors == {"a": "boom"}
    assert result.metrics == {}


def test_chat_prompt_callable_and_strip_reasoning():
    def chat(inst):
        return [{"role": "user", "content": inst["q"]}]

    class Thinker:
        def generate(self, requests):
            return [[Generation(text="<think>...</think>Paris")] for _ in requests]

    task = EvalTask(
        "t",
        [{"id": "a", "q": "capital?", "target": "Paris"}],
        prompt=chat,
        scorer="exact_match",
        strip_reasoning=True,
    )
    assert task.request(task.instances[0]).context == [{"role": "user", "content": "capital?"}]
    result = task.evaluate(Thinker())
    assert result.metrics == {"exact_match": 1.0}
    gen = result.rollouts[0].generation
    assert (gen.text, gen.original_text) == ("Paris", "<think>...</think>Paris")


@pytest.mark.parametrize(
    ("instances", "message"),
    [
        ([{"x": 1}], "needs a non-empty string 'id'"),
        ([{"id": "a"}, {"id": "a"}], "duplicate instance id 'a'"),
        ([{"id": "a::b"}], "may not contain '::'"),
        (["not a dict"], "must be a JSON object"),
    ],
)
def test_bad_instances(instances, message):
    with pytest.raises(EvalReplayError, match=message):
        EvalTask("t", instances, prompt="x", scorer="contains")


def test_integer_ids_become_strings():
    assert EvalTask("t", [{"id": 7}], prompt="x", scorer="contains").instances[0]["id"] == "7"


def test_unknown_builtin_and_bad_num_samples():
    with pytest.raises(EvalReplayError, match="unknown scorer 'nope'"):
        EvalTask("t", [{"id": "a"}], prompt="x", scorer="nope")
    with pytest.raises(EvalReplayError, match="num_samples"):
        EvalTask("t", [{"id": "a"}], prompt="x", scorer="contains", num_samples=0)


def test_template_field_missing_names_instance():
    task = EvalTask("t", [{"id": "a"}], prompt="{question}", scorer="contains")
    with pytest.raises(EvalReplayError, match=r"instance 'a'.*needs field 'question'"):
        task.request(task.instances[0])


def test_a_callable_is_identified_by_its_source():
    def s1(text, inst):
        return 1.0

    def s2(text, inst):
        return 0.0

    assert callable_identity(s1) != callable_identity(s2)
    assert callable_identity(s1) == callable_identity(s1)


def test_partial_and_object_callables_are_identified_by_what_they_wrap():
    import functools

    def weighted(text, inst, weight=1.0):
        return weight

    class Scorer:
        def __init__(self, threshold):
            self.threshold = threshold

        def __call__(self, text, inst):
            return 1.0

    config = callable_identity
    assert config(functools.partial(weighted, weight=2.0)) == config(functools.partial(weighted, weight=2.0))
    assert config(functools.partial(weighted, weight=2.0)) != config(functools.partial(weighted, weight=3.0))
    assert config(Scorer(0.5)) == config(Scorer(0.5))
    assert config(Scorer(0.5)) != config(Scorer(0.6))
    assert "0x" not in repr(config(Scorer(0.5)))


# -- checked when the task is built, or when the value arrives (#18) --------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"system_prompt": ["a", "b"]}, r"task 't': system_prompt must be a string or None, got list"),
        ({"system_prompt": 5}, r"task 't': system_prompt must be a string or None, got int"),
        ({"strip_reasoning": "no"}, r"task 't': strip_reasoning must be True or False, got 'no'"),
        ({"strip_reasoning": 1}, r"task 't': strip_reasoning must be True or False, got 1"),
        ({"instances": []}, r"task 't': no instances \(instances=\[\] is empty\)"),
        ({"instances": iter(())}, r"task 't': no instances"),
    ],
)
def test_bad_task_arguments_are_refused_when_the_task_is_built(kwargs, message):
    args = {"instances": [{"id": "a"}], "prompt": "x", "scorer": "contains", **kwargs}
    with pytest.raises(EvalReplayError, match=message):
        EvalTask("t", **args)


def test_a_chat_message_content_json_cannot_hold_names_task_instance_and_message():
    task = EvalTask(
        "t", [{"id": "a"}], prompt=lambda i: [{"role": "user", "content": {"x", "y"}}], scorer="contains"
    )
    with pytest.raises(
        EvalReplayError, match=r"task 't', instance 'a': the prompt callable returned .*message 0"
    ):
        task.request(task.instances[0])


@pytest.mark.parametrize(
    ("scorer", "message"),
    [
        (lambda text, i: {}, r"scorer 'score' returned no scores \(an empty dict\)"),
        (lambda text, i: {1: 1.0, "1": 0.0}, r"scorer 'score' returned keys 1 and '1', both named '1'"),
    ],
)
def test_a_scorer_whose_scores_cannot_be_kept_fails_that_rollout(scorer, message):
    task = EvalTask("t", [{"id": "a"}], prompt="x", scorer=scorer)
    result = task.evaluate(Echo())
    (rollout,) = result.rollouts
    assert rollout.failure_class == "scoring"
    assert re.search(message, rollout.error), rollout.error


def test_num_samples_over_the_limit_is_refused_naming_the_limit() -> None:
    """Issue #30 case 14: num_samples=10**9 built a billion items before anything ran."""
    from pytest_evalreplay.prompting import MAX_NUM_SAMPLES

    assert MAX_NUM_SAMPLES == 10_000
    EvalTask("t", [{"id": "a"}], prompt="Q", scorer="exact_match", num_samples=MAX_NUM_SAMPLES)
    with pytest.raises(EvalReplayError, match=r"task 't': num_samples=1000000000 is over the limit of 10000"):
        EvalTask("t", [{"id": "a"}], prompt="Q", scorer="exact_match", num_samples=10**9)


def test_a_prompt_is_rendered_once_and_kept_within_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    renders: list[str] = []

    def prompt(instance: dict) -> str:
        renders.append(instance["id"])
        return "x" * 10

    def run() -> list[str]:
        renders.clear()
        t = EvalTask(
            "t", [{"id": "a"}, {"id": "b"}, {"id": "c"}], prompt=prompt, scorer=lambda text, inst: 1.0
        )
        t.request_digests()
        t.keep_rendered({"a", "b", "c"})
        requests = [t.request(inst) for inst in t.instances]
        assert [r.context for r in requests] == ["x" * 10] * 3
        return renders

    assert run() == ["a", "b", "c"]  # the collection's rendering is the one sent
    monkeypatch.setattr(task_module, "RENDERED_BUDGET", 25)  # two prompts' worth kept; c rendered again
    assert run() == ["a", "b", "c", "c"]
