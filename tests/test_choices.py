"""Multiple choice without pytest's session: the metrics against the formulas
of lm-evaluation-harness and olmo-eval, the task's requests and checks, and
the pipeline's loglikelihood call (stream preferred, answers checked)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalreplay import EvalReplayError, EvalTask, GenerationError, Request, scorers
from pytest_evalreplay.run.execution import Done, Failed, generate_events

_ll = st.floats(min_value=-1e6, max_value=0.0, allow_nan=False)
_choice = st.text(min_size=1, max_size=12)


@st.composite
def mc_answers(draw: Any) -> tuple[list[float], list[str], int]:
    choices = draw(st.lists(_choice, min_size=1, max_size=6))
    lls = draw(st.lists(_ll, min_size=len(choices), max_size=len(choices)))
    return lls, choices, draw(st.integers(0, len(choices) - 1))


@given(mc_answers())
def test_acc_and_acc_norm_are_lm_evals(answer: tuple[list[float], list[str], int]) -> None:
    lls, choices, gold = answer
    # lm-evaluation-harness, ConfigurableTask.process_results, output_type multiple_choice:
    completion_len = np.array([float(len(i)) for i in choices])
    assert scorers.acc(lls, gold) == (1.0 if np.argmax(lls) == gold else 0.0)
    assert scorers.acc_norm(lls, choices, gold) == (1.0 if np.argmax(lls / completion_len) == gold else 0.0)


@given(_ll, st.text(min_size=1, max_size=20))
def test_bpb_is_olmo_evals(ll: float, continuation: str) -> None:
    # olmo-eval (oe_eval) bits_per_byte: -sum_logits / (num_bytes * log(2)).
    expected = -ll / (len(continuation.encode("utf-8")) * math.log(2))
    assert scorers.bpb(ll, continuation) == pytest.approx(expected, rel=1e-15, abs=0)


def test_the_first_of_tied_choices_wins_as_numpys_argmax() -> None:
    assert scorers.acc([-1.0, -1.0], 0) == 1.0 and scorers.acc([-1.0, -1.0], 1) == 0.0


def test_acc_norm_divides_by_characters_not_bytes() -> None:
    # "é" is 1 character and 2 bytes: per character "ab" wins (-0.75 > -1.0); per byte it would tie
    # at -0.75 and lose to "é" (-0.5).
    assert scorers.acc_norm([-1.0, -1.5], ["é", "ab"], 1) == 1.0


def test_multiple_choice_picks_its_metrics() -> None:
    mc = scorers.multiple_choice(metrics=("bpb",))
    assert mc.scores([-2.0, -1.0], ["a", "bb"], 0, " ") == {"bpb": pytest.approx(2.0 / (2 * math.log(2)))}
    assert scorers.multiple_choice().metrics == ("acc", "acc_norm")
    for bad in ((), ("acc", "acc"), ("f1",), 3):
        with pytest.raises(EvalReplayError, match="give one or more distinct metrics of acc, acc_norm, bpb"):
            scorers.multiple_choice(metrics=bad)  # type: ignore[arg-type]


ITEMS = [
    {"id": "a", "q": "Sky?", "choices": ["blue", "green"], "gold": 0},
    {"id": "b", "q": "Grass?", "choices": ["blue", "green"], "gold": "green"},
]


def mc_task(**kw: Any) -> EvalTask:
    return EvalTask("mc", ITEMS, prompt="{q}", choices="choices", target="gold", **kw)


def test_a_choices_task_asks_one_loglikelihood_request_per_instance() -> None:
    task = mc_task(choice_delimiter="\n")
    request = task.request(task.instance("a"))
    assert request.request_type == "loglikelihood"
    assert request.context == "Sky?" and request.continuations == ("\nblue", "\ngreen")
    assert task.gold(task.instance("b")) == 1
    assert task.scorer_name == "multiple_choice"


def test_choices_and_target_may_be_callables() -> None:
    task = EvalTask(
        "mc",
        ITEMS,
        prompt="{q}",
        choices=lambda i: [c.upper() for c in i["choices"]],
        target=lambda i: "GREEN",
    )
    assert task.request(task.instance("a")).continuations == (" BLUE", " GREEN")
    assert task.gold(task.instance("a")) == 1


def test_a_literal_gold_index_is_every_instances_gold() -> None:
    # A BPB task's one choice is the gold: target=0 says so (it once read as
    # "no target" and looked up a field named "target").
    task = EvalTask("bpb", ITEMS, prompt="{q}", choices=lambda i: [i["choices"][0]], target=0)
    assert [task.gold(task.instance(iid)) for iid in ("a", "b")] == [0, 0]


def test_the_choices_callable_that_raises_names_the_instance() -> None:
    task = EvalTask("mc", ITEMS, prompt="{q}", choices=lambda i: i["nope"], target="gold")
    with pytest.raises(
        EvalReplayError, match=r"task 'mc', instance 'a': the choices callable raised KeyError"
    ):
        task.request_digests()


def test_the_target_callable_that_raises_names_the_instance() -> None:
    task = EvalTask("mc", ITEMS, prompt="{q}", choices="choices", target=lambda i: i["nope"])
    with pytest.raises(
        EvalReplayError, match=r"task 'mc', instance 'a': the target callable raised KeyError"
    ):
        task.request_digests()


class Answers:
    """A provider of log-likelihoods: the gold choice's is the highest."""

    kind = "answers"

    def __init__(self, stream: bool = False, reply: Any = None) -> None:
        self.calls: list[str] = []
        self.reply = reply
        if stream:
            self.loglikelihood_stream = self._stream

    def generate(self, requests: list[Request]) -> list[Any]:
        raise AssertionError("never called for a choices task")

    def _answer(self, request: Request) -> Any:
        if self.reply is not None:
            return self.reply
        gold = 0 if request.instance_id == "a" else 1
        return [(-1.0 if n == gold else -5.0, n == gold) for n in range(len(request.continuations))]

    def loglikelihood(self, requests: list[Request]) -> list[Any]:
        self.calls.append("loglikelihood")
        return [self._answer(r) for r in requests]

    def _stream(self, requests: list[Request]) -> Iterator[tuple[int, Any]]:
        self.calls.append("loglikelihood_stream")
        for n in reversed(range(len(requests))):
            yield n, self._answer(requests[n])


@pytest.mark.parametrize("stream", [False, True])
def test_evaluate_scores_a_choices_task_through_the_provider(stream: bool) -> None:
    provider = Answers(stream=stream)
    result = mc_task().evaluate(provider)
    assert provider.calls == ["loglikelihood_stream" if stream else "loglikelihood"]
    assert result.metrics == {"acc": 1.0, "acc_norm": 1.0}
    assert result.errors == {}
    generation = result.rollouts[0].generation
    assert (
        generation is not None
        and generation.text == ""
        and generation.loglikelihoods == ((-1.0, True), (-5.0, False))
    )


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ([(-1.0, True)], "'answers' provider: loglikelihood returned 1 entries for 2 continuations"),
        ("nope", "'answers' provider: loglikelihood returned 'nope' for 2 continuations"),
        ([(-1.0, 1), (-2.0, False)], "loglikelihood returned a bad answer: entry 0 ((-1.0, 1))"),
        ([(math.inf, True), (-2.0, False)], "loglikelihood returned a bad answer: entry 0 ((inf, True))"),
        (GenerationError("server said no", retryable=False), "server said no"),
    ],
)
def test_a_bad_loglikelihood_answer_fails_its_request_never_a_score(reply: Any, message: str) -> None:
    result = mc_task().evaluate(Answers(reply=reply), max_attempts=1)
    assert result.metrics == {}
    assert set(result.errors) == {"a", "b"}
    assert message in result.errors["a"]


def test_a_retryable_loglikelihood_failure_is_asked_again() -> None:
    class Flaky(Answers):
        def loglikelihood(self, requests: list[Request]) -> list[Any]:
            self.calls.append("loglikelihood")
            if len(self.calls) == 1:
                return [GenerationError("busy", retryable=True) for _ in requests]
            return [self._answer(r) for r in requests]

    provider = Flaky()
    task = mc_task()
    events = list(generate_events(provider, [task.request(i) for i in task.instances], max_attempts=3))
    assert [type(e).__name__ for e in events if isinstance(e, (Done, Failed))] == ["Failed"] * 2 + [
        "Done"
    ] * 2
    assert provider.calls == ["loglikelihood", "loglikelihood"]


def test_a_provider_without_loglikelihood_is_a_usage_error() -> None:
    class Generates:
        def generate(self, requests: list[Request]) -> list[Any]:
            return []

    with pytest.raises(
        EvalReplayError,
        match=r"task 'mc' scores answer choices by log-likelihood, and the "
        r"provider Generates has no loglikelihood\(requests\)",
    ):
        mc_task().evaluate(Generates())


def test_a_batch_of_both_kinds_asks_each_call_for_its_own() -> None:
    from pytest_evalreplay import Generation
    from pytest_evalreplay.run.execution import stream_results

    class Both(Answers):
        def generate(self, requests: list[Request]) -> list[Any]:
            self.calls.append("generate")
            return [[Generation(text="hi")] for _ in requests]

    task = mc_task()
    mixed = [Request(task="g", instance_id="g", context="say hi"), task.request(task.instance("a"))]
    provider = Both()
    results = dict(stream_results(provider, mixed))
    assert provider.calls == ["generate", "loglikelihood"]
    assert results[0][0].text == "hi"  # type: ignore[index]
    assert results[1][0].loglikelihoods == ((-1.0, True), (-5.0, False))  # type: ignore[index]
