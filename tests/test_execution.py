"""Streaming generation with retries, and scoring, called directly with tiny providers."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from pytest_evalreplay import EvalTask, Generation, GenerationError
from pytest_evalreplay.run.execution import (
    Done,
    Failed,
    RoundEnd,
    generate_events,
    score_generation,
    stream_results,
)
from pytest_evalreplay.run.offline import run_requests


def make_task(scorer=lambda t, i: 1.0) -> EvalTask:
    # Built in a function: a module-level EvalTask in a test module is collected as eval items.
    return EvalTask("t", [{"id": f"i{n}"} for n in range(3)], prompt="{id}", scorer=scorer, num_samples=2)


class Flaky:
    """Fails each request retryably `fails` times, then answers."""

    def __init__(self, fails: int, retryable: bool = True) -> None:
        self.fails = fails
        self.retryable = retryable
        self.seen: dict[str, int] = {}
        self.calls: list[list[str]] = []

    def generate(self, requests):
        self.calls.append([r.instance_id for r in requests])
        out = []
        for r in requests:
            n = self.seen[r.instance_id] = self.seen.get(r.instance_id, 0) + 1
            if n <= self.fails:
                out.append(GenerationError(f"try {n}", retryable=self.retryable))
            else:
                out.append([Generation(text="ok") for _ in r.rollouts])
        return out


def requests():
    task = make_task()
    return [task.request(inst) for inst in task.instances]


def failures(events):
    return [e.failure for e in events if isinstance(e, Failed)]


def test_retryable_failures_are_retried_in_rounds_up_to_the_cap():
    provider = Flaky(fails=2)
    events = list(generate_events(provider, requests(), max_attempts=3))
    assert provider.calls == [["i0", "i1", "i2"]] * 3
    assert [(f.attempt, f.final) for f in failures(events)[:3]] == [(1, False)] * 3
    assert sum(isinstance(e, Done) for e in events) == 3
    # Each provider call ends a round, so the caller can save failed attempts before a retry;
    # the round says how many are retried (none after the last: nothing to save before).
    assert [e.retries for e in events if isinstance(e, RoundEnd)] == [3, 3, 0]


def test_attempt_cap_counts_earlier_attempts():
    provider = Flaky(fails=5)
    events = list(generate_events(provider, requests(), 3, {(1, "i0"): 2}))
    assert provider.seen["i0"] == 1
    i0 = [f for f in failures(events) if f.instance_id == "i0"]
    assert [(f.attempt, f.final) for f in i0] == [(3, True)]


def test_terminal_failures_are_final_at_once():
    provider = Flaky(fails=1, retryable=False)
    events = list(generate_events(provider, requests(), 3))
    assert len(provider.calls) == 1
    assert {(f.failure_class, f.final) for f in failures(events)} == {("terminal", True)}


def test_provider_exceptions_become_errors_and_interrupts_propagate():
    class Raises:
        def __init__(self, exc):
            self.exc = exc

        def generate(self, requests):
            raise self.exc

    out = failures(generate_events(Raises(ConnectionError("reset")), requests(), 2))
    assert {f.failure_class for f in out} == {"retryable"} and len(out) == 6
    out = failures(generate_events(Raises(ValueError("bug")), requests(), 2))
    assert {f.failure_class for f in out} == {"terminal"} and len(out) == 3
    with pytest.raises(KeyboardInterrupt):
        list(generate_events(Raises(KeyboardInterrupt()), requests(), 2))


def test_wrong_shaped_provider_output_is_an_error_per_request():
    class Short:
        def generate(self, requests):
            return [[Generation(text="only one")] for _ in requests]

    results = run_requests(make_task(), Short(), requests())
    assert all(not r.ok and "one per rollout" in r.error for r in results)
    assert len(results) == 6


@pytest.mark.parametrize(
    ("generation", "field"),
    [
        (Generation(text=None), "'text'"),  # type: ignore[arg-type]
        (Generation(text="x", prompt_tokens="5"), "'prompt_tokens'"),  # type: ignore[arg-type]
        (Generation(text="x", completion_tokens=True), "'completion_tokens'"),  # type: ignore[arg-type]
        (Generation(text="x", finish_reason=3), "'finish_reason'"),  # type: ignore[arg-type]
        (Generation(text="\ud800"), "JSON"),
        (Generation(text="x", metadata={"when": object()}), "JSON"),
    ],
)
def test_a_badly_typed_generation_fails_that_request_naming_the_field(generation, field):
    class Bad:
        def generate(self, requests):
            return [
                [generation, generation] if r.instance_id == "i1" else [Generation("ok")] * 2
                for r in requests
            ]

    results = run_requests(make_task(), Bad(), requests())
    bad = [r for r in results if r.instance_id == "i1"]
    assert all(not r.ok and r.failure_class == "terminal" and field in r.error for r in bad)
    assert all(r.ok for r in results if r.instance_id != "i1")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, np.float64("nan"), np.float32("inf")])
def test_a_non_finite_score_is_a_scoring_failure_naming_the_value(value):
    task = make_task(scorer=lambda t, i: {"acc": 1.0, "f1": value})
    scores, error = score_generation(task, task.instance("i0"), Generation("x"))
    assert scores is None
    assert "f1" in error and ("nan" in error or "inf" in error)


def test_a_streaming_provider_hands_back_results_as_they_finish():
    seen: list[int] = []

    class Streams:
        def generate(self, requests):  # never used: the stream is preferred
            raise AssertionError

        def generate_stream(self, requests):
            for i in reversed(range(len(requests))):
                seen.append(i)
                yield i, [Generation(f"g{i}")] * len(requests[i].rollouts)

    order = [i for i, _ in stream_results(Streams(), requests())]
    assert order == [2, 1, 0] == seen


def test_a_stream_that_skips_a_request_fails_it_retryably():
    class Skips:
        def generate_stream(self, requests):
            yield 0, [Generation("a")] * 2

    out = dict(stream_results(Skips(), requests()))
    assert isinstance(out[0], list)
    assert isinstance(out[1], GenerationError) and out[1].retryable


def test_a_provider_that_blocks_forever_fails_after_the_timeout():
    release = threading.Event()

    class Blocks:
        def generate(self, requests):
            release.wait()
            return [[Generation("late")] * 2 for _ in requests]

    try:
        out = dict(stream_results(Blocks(), requests(), timeout=0.2))
    finally:
        release.set()
    assert all(isinstance(r, GenerationError) and r.retryable for r in out.values())
    assert "--evalreplay-timeout=0.2s" in out[0].message and "thread" in out[0].message


def test_a_provider_that_honours_the_timeout_itself_is_not_watched():
    class Own:
        request_timeout = 5.0

        def __init__(self):
            self.thread = None

        def generate(self, requests):
            self.thread = threading.current_thread()
            return [[Generation("x")] * 2 for _ in requests]

    provider = Own()
    list(stream_results(provider, requests(), timeout=0.01))
    assert provider.thread is threading.main_thread()
