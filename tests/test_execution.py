"""Batched generation with retries, called directly with tiny providers."""

from __future__ import annotations

from pytest_evalreplay import EvalTask, Generation, GenerationError
from pytest_evalreplay.execution import generate_with_retries, run_requests


def make_task() -> EvalTask:
    # Built in a function: a module-level EvalTask in a test module is collected as eval items.
    return EvalTask(
        "t", [{"id": f"i{n}"} for n in range(3)], prompt="{id}", scorer=lambda t, i: 1.0, num_samples=2
    )


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


def test_retryable_failures_are_retried_in_batches_up_to_the_cap():
    provider, failures = Flaky(fails=2), []
    results = generate_with_retries(provider, requests(), max_attempts=3, on_failure=failures.append)
    assert all(isinstance(r, list) for r in results)
    assert provider.calls == [["i0", "i1", "i2"]] * 3
    assert [(f.attempt, f.final) for f in failures[:3]] == [(1, False)] * 3


def test_attempt_cap_counts_earlier_attempts():
    provider, failures = Flaky(fails=5), []
    results = generate_with_retries(provider, requests(), 3, {(1, "i0"): 2}, failures.append)
    assert isinstance(results[0], GenerationError)
    assert provider.seen["i0"] == 1
    assert [f.attempt for f in failures if f.request.instance_id == "i0"] == [3]
    assert failures[-1].final


def test_terminal_failures_are_final_at_once():
    provider, failures = Flaky(fails=1, retryable=False), []
    results = generate_with_retries(provider, requests(), 3, on_failure=failures.append)
    assert all(isinstance(r, GenerationError) for r in results)
    assert len(provider.calls) == 1
    assert {(f.failure_class, f.final) for f in failures} == {("terminal", True)}


def test_provider_exceptions_become_errors_and_interrupts_propagate():
    class Raises:
        def __init__(self, exc):
            self.exc = exc

        def generate(self, requests):
            raise self.exc

    out = generate_with_retries(Raises(ConnectionError("reset")), requests(), 2)
    assert all(isinstance(r, GenerationError) and r.retryable for r in out)
    out = generate_with_retries(Raises(ValueError("bug")), requests(), 2)
    assert all(isinstance(r, GenerationError) and not r.retryable for r in out)
    try:
        generate_with_retries(Raises(KeyboardInterrupt()), requests(), 2)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("KeyboardInterrupt must propagate")


def test_wrong_shaped_provider_output_is_an_error_per_request():
    class Short:
        def generate(self, requests):
            return [[Generation(text="only one")] for _ in requests]

    results = run_requests(make_task(), Short(), requests())
    assert all(not r.ok and "one per rollout" in r.error for r in results)
    assert len(results) == 6
