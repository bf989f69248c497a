"""The openai provider: fault paths against the local stub server
(tests/http_stub.py, stdlib only, runs everywhere), then the real thing against
vLLM's OpenAI-compatible server running the tiny Llama in a subprocess (skips
without vLLM).

No test asserts a timing or races on a sleep: states ("two requests in
flight") are reached by holding requests at the stub and waiting for its
events; timeouts appear only where a timeout is what is tested, and then only
the outcome is asserted.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
from http_stub import ANSWER, STUB_MODEL, Action, Drop, Fail, Hang, StubServer, Trickle
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_fixtures import make_request, stub_provider

from pytest_evalreplay.model import EvalReplayError, Generation, GenerationError, Request
from pytest_evalreplay.providers import openai as openai_mod
from pytest_evalreplay.providers.openai import OpenAIProvider
from pytest_evalreplay.providers.openai_balancer import Balancer
from pytest_evalreplay.settings import Settings

req = make_request
pytestmark = pytest.mark.usefixtures("no_api_key")
T = TypeVar("T")


def ok(result: Any) -> list[Generation]:
    assert isinstance(result, list), result
    assert all(isinstance(g, Generation) for g in result)
    return result


def failed(result: Any) -> GenerationError:
    assert isinstance(result, GenerationError), result
    return result


def finishes(fn: Callable[[], T], limit: float = 120.0) -> T:
    """Run `fn` in a thread; fail (instead of hanging the suite) if it never returns."""
    box: list[Any] = []

    def target() -> None:
        try:
            box.append(("ok", fn()))
        except BaseException as exc:  # handed back to the test
            box.append(("error", exc))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"still running after {limit} s: a hang"
    kind, value = box[0]
    if kind == "error":
        raise value
    return value


@pytest.fixture
def stub2() -> Iterator[StubServer]:
    with StubServer(STUB_MODEL) as server:
        yield server


# -- settings and the servers' model -------------------------------------------------------


def test_settings_need_base_url_and_model(stub: StubServer) -> None:
    with pytest.raises(EvalReplayError, match="--evalreplay-base-url"):
        openai_mod.from_settings(Settings(provider="openai", model="m"))
    with pytest.raises(EvalReplayError, match="--evalreplay-model"):
        openai_mod.from_settings(Settings(provider="openai", base_urls=("http://127.0.0.1:1/v1",)))
    with pytest.raises(EvalReplayError, match="http"):
        openai_mod.from_settings(Settings(provider="openai", model="m", base_urls=("localhost:8000",)))
    s = Settings(provider="openai", model=STUB_MODEL, base_urls=(stub.url,), concurrency=3, timeout=7.5)
    with openai_mod.from_settings(s) as p:
        assert (p.kind, p.model, p.batch_size, p.concurrency) == ("openai", STUB_MODEL, None, 3)
        assert p.request_timeout == p.timeout == 7.5
        assert p.base_urls == (stub.url,)
    with openai_mod.from_settings(Settings(provider="openai", model=STUB_MODEL, base_urls=(stub.url,))) as p:
        assert p.request_timeout == openai_mod.DEFAULT_TIMEOUT


@pytest.mark.parametrize(
    ("url", "prefix"),
    [
        ("http://h:1", "/v1"),
        ("http://h:1/", "/v1"),
        ("http://h:1/v1/", "/v1"),
        ("https://h/api/v2", "/api/v2"),
    ],
)
def test_base_url_forms(url: str, prefix: str) -> None:
    provider = OpenAIProvider(url, "m")
    assert provider.servers[0].prefix == prefix
    assert provider.base_url == url.rstrip("/") + ("" if url.rstrip("/").endswith(prefix) else prefix)


def test_one_url_or_several_each_once() -> None:
    assert OpenAIProvider(["http://a:1/v1", "http://b:2"], "m").base_urls == (
        "http://a:1/v1",
        "http://b:2/v1",
    )
    with pytest.raises(EvalReplayError, match="twice"):
        OpenAIProvider(["http://a:1/v1", "http://a:1/v1/"], "m")
    with pytest.raises(EvalReplayError, match="at least one"):
        OpenAIProvider([], "m")


def test_a_server_serving_another_model_is_refused_at_build(stub: StubServer, stub2: StubServer) -> None:
    stub2.model = ["other-model", "lora-adapter"]
    settings = Settings(provider="openai", model=STUB_MODEL, base_urls=(stub.url, stub2.url))
    with pytest.raises(EvalReplayError) as info:
        openai_mod.from_settings(settings)
    message = str(info.value)
    assert f"{stub2.url}: serves 'other-model', 'lora-adapter', not 'stub-model'" in message
    assert "1 of its 2 servers" in message and stub.url not in message
    assert "--served-model-name" in message
    stub2.model = []
    with pytest.raises(EvalReplayError, match="serves no model"):
        openai_mod.from_settings(settings)
    stub2.model = STUB_MODEL
    with openai_mod.from_settings(settings) as provider:
        assert len(ok(provider.generate([req("x")])[0])) == 1


def test_an_unreachable_server_at_start_is_a_clear_error(stub: StubServer) -> None:
    gone = StubServer(STUB_MODEL).start()
    url = gone.url
    gone.stop()
    with pytest.raises(EvalReplayError) as info:
        openai_mod.from_settings(Settings(provider="openai", model=STUB_MODEL, base_urls=(url,)))
    assert f"{url}: unreachable" in str(info.value) and "is the server running" in str(info.value)


def test_one_of_two_servers_down_at_start_runs_on_the_live_one_and_says_so(stub: StubServer) -> None:
    """Issue #30 case 14: one unreachable base URL of two refused the whole run."""
    gone = StubServer(STUB_MODEL).start()
    url = gone.url
    gone.stop()
    with openai_mod.from_settings(
        Settings(provider="openai", model=STUB_MODEL, base_urls=(url, stub.url))
    ) as provider:
        assert all(len(ok(r)) == 1 for r in provider.generate([req(f"x{i}") for i in range(4)]))
        (note,) = provider.notes
    assert f"{url}: unreachable" in note and "running on the 1 other server" in note
    assert stub.count("answered") == 4


def test_models_check_failing_with_http_names_the_status_and_key(stub: StubServer) -> None:
    stub.api_key = "right"
    with pytest.raises(EvalReplayError, match=r"HTTP 401: Invalid API key \(check \$EVALREPLAY_API_KEY"):
        stub_provider(stub).check_servers()
    stub.api_key, stub.models_status = None, 500
    with pytest.raises(EvalReplayError, match="HTTP 500"):
        stub_provider(stub).check_servers()


def test_models_are_checked_once_on_first_use(stub: StubServer) -> None:
    with stub_provider(stub) as provider:
        assert stub.count("models") == 0
        provider.generate([req("a")])
        provider.generate([req("b")])
        list(provider.generate_stream([req("c")]))
    assert stub.count("models") == 1
    stub.model = "other"
    with stub_provider(stub) as provider, pytest.raises(EvalReplayError, match="serves 'other'"):
        provider.generate([req("a")])
    assert stub.received == 3  # the refused provider sent nothing


# -- requests and responses ------------------------------------------------------------------


def test_text_and_chat_endpoints_and_system_prompt(stub: StubServer) -> None:
    with stub_provider(stub) as provider:
        out = provider.generate(
            [
                req("2+2=", system_prompt="Be brief.", max_tokens=4),
                req([{"role": "user", "content": "hi"}], iid="c", system_prompt="Be brief."),
                req("plain", iid="p"),
            ]
        )
    (text,) = ok(out[0])
    assert text.text == "Be brief.\n\n2+2=|seed=None|i=0"
    assert (text.finish_reason, text.prompt_tokens, text.completion_tokens) == ("length", 5, 10)
    (chat,) = ok(out[1])
    assert chat.text == "hi|seed=None|i=0" and chat.finish_reason == "stop"
    by_path = {path: body for path, _, body in stub.requests}
    assert by_path["/v1/completions"]["model"] == STUB_MODEL
    assert by_path["/v1/chat/completions"]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    bodies = {b.get("prompt"): b for b in stub.bodies()}
    assert bodies["Be brief.\n\n2+2="] == {
        "model": STUB_MODEL,
        "prompt": "Be brief.\n\n2+2=",
        "max_tokens": 4,
    }
    assert "n" not in bodies["plain"] and "seed" not in bodies["plain"]


def test_seed_n_and_greedy_plans(stub: StubServer) -> None:
    with stub_provider(stub) as provider:
        out = provider.generate(
            [
                req("seeded", num_samples=3, seed=7),
                req("sampled", num_samples=3, temperature=0.7),
                req("greedy", num_samples=2, temperature=0),
                req("resumed", num_samples=3, rollouts=(2,), seed=7),
            ]
        )
    assert [g.text for g in ok(out[0])] == [f"seeded|seed={s}|i=0" for s in (7, 8, 9)]
    sampled = ok(out[1])
    assert [g.text for g in sampled] == [f"sampled|seed=None|i={i}" for i in range(3)]
    # usage is per response: prompt tokens shared, completion tokens split (10/3 -> 3)
    assert [(g.prompt_tokens, g.completion_tokens) for g in sampled] == [(5, 3)] * 3
    assert [g.text for g in ok(out[2])] == ["greedy|seed=None|i=0"] * 2
    assert [g.text for g in ok(out[3])] == ["resumed|seed=9|i=0"]
    plans = sorted((b["prompt"], b.get("n"), b.get("seed")) for b in stub.bodies())
    assert plans == sorted(
        [
            ("seeded", None, 7),
            ("seeded", None, 8),
            ("seeded", None, 9),
            ("sampled", 3, None),
            ("greedy", None, None),
            ("greedy", None, None),
            ("resumed", None, 9),
        ]
    )


def test_reserved_sampling_keys_fail_that_request_only(stub: StubServer) -> None:
    with stub_provider(stub) as provider:
        out = provider.generate([req("a", n=2), req("b", stream=True), req("c", top_k=3)])
    assert "num_samples" in failed(out[0]).message and "'stream'" in failed(out[1]).message
    assert not failed(out[0]).retryable and not failed(out[1]).retryable
    assert len(ok(out[2])) == 1
    assert stub.bodies() == [{"model": STUB_MODEL, "prompt": "c", "top_k": 3}]


def test_unsupported_requests_make_no_http_call(stub: StubServer) -> None:
    with stub_provider(stub) as provider:
        out = provider.generate(
            [Request(task="t", instance_id="a", context="x", request_type="loglikelihood")]
        )
    assert not failed(out[0]).retryable
    assert stub.received == 0


# -- faults --------------------------------------------------------------------------------------


def test_5xx_then_success_is_retried(stub: StubServer) -> None:
    stub.script = [Fail(503, "overloaded"), Fail(500)]
    with stub_provider(stub) as provider:
        (result,) = provider.generate([req("x")])
    assert len(ok(result)) == 1
    assert stub.received == 3


def test_persistent_5xx_is_a_retryable_error(stub: StubServer) -> None:
    stub.default = Fail(502, "bad gateway")
    with stub_provider(stub, retries=2) as provider:
        (result,) = provider.generate([req("x")])
    error = failed(result)
    assert error.retryable and "3 attempts" in error.message
    assert f"HTTP 502 from {stub.url}/completions: bad gateway" in error.message
    assert stub.received == 3


def test_4xx_is_terminal_with_the_server_message(stub: StubServer) -> None:
    msg = "This model's maximum context length is 256 tokens."
    stub.script = [Fail(400, msg)]
    with stub_provider(stub) as provider:
        out = provider.generate([req("x"), req("y", iid="other")])
    errors = [r for r in out if isinstance(r, GenerationError)]
    assert len(errors) == 1 and not errors[0].retryable and msg in errors[0].message
    assert sum(isinstance(r, list) for r in out) == 1
    assert stub.received == 2  # no retry of the 400


def test_retry_after_sets_the_wait_within_the_cap(stub: StubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    stub.script = [
        Fail(429, "slow down", (("Retry-After", "0"),)),
        Fail(503, "busy", (("Retry-After", "99"),)),
    ]
    with stub_provider(stub, backoff=30.0, max_backoff=5.0) as provider:
        waits: list[float] = []
        monkeypatch.setattr(provider._caller, "_pause", lambda run, seconds: waits.append(seconds) or False)
        (result,) = provider.generate([req("x")])
    assert len(ok(result)) == 1
    assert waits == [0.0, 5.0]  # the header, not the 30 s backoff; 99 s capped at max_backoff


def test_backoff_doubles_with_jitter(stub: StubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    stub.script = [Fail(503)] * 4
    slow = {"backoff": 1.0, "max_backoff": 3.0, "failures_to_cool": 10, "give_up_failures": 10}
    with stub_provider(stub, retries=4, **slow) as provider:
        waits: list[float] = []
        monkeypatch.setattr(provider._caller, "_pause", lambda run, seconds: waits.append(seconds) or False)
        (result,) = provider.generate([req("x")])
    assert len(ok(result)) == 1
    for wait, base in zip(waits, [1.0, 2.0, 3.0, 3.0], strict=True):
        assert base / 2 <= wait <= base


def test_a_hanging_server_is_a_retryable_timeout(stub: StubServer) -> None:
    stub.default = Hang()
    with stub_provider(stub, timeout=0.5, retries=0) as provider:
        (result,) = finishes(lambda: provider.generate([req("x")]))
    error = failed(result)
    assert error.retryable and "timed out after 0.5 s (--evalreplay-timeout)" in error.message
    assert stub.wait_until(lambda s: s.count("client_gone") == 1)  # the call was cut, not left open


@pytest.mark.parametrize("in_headers", [False, True], ids=["body", "headers"])
def test_a_trickling_server_is_a_retryable_timeout(stub: StubServer, in_headers: bool) -> None:
    """A byte every 50 ms never trips a socket timeout of 0.5 s; the deadline still ends it."""
    stub.default = Trickle(interval=0.05, in_headers=in_headers)
    with stub_provider(stub, timeout=0.5, retries=1) as provider:
        (result,) = finishes(lambda: provider.generate([req("x")]))
    error = failed(result)
    assert error.retryable and "--evalreplay-timeout" in error.message and "2 attempts" in error.message


def test_a_call_never_outlasts_its_budget(stub: StubServer) -> None:
    """(retries + 1) x timeout in all: waits and attempts are cut there."""
    stub.default = Hang()
    with stub_provider(stub, timeout=0.3, retries=3, backoff=0.2, failures_to_cool=10) as provider:
        (result,) = finishes(lambda: provider.generate([req("x")]))
    assert failed(result).retryable and "--evalreplay-timeout" in failed(result).message
    assert stub.received <= 4


def test_timeout_then_success(stub: StubServer) -> None:
    stub.script = [Hang()]
    with stub_provider(stub, timeout=3.0, retries=1) as provider:  # the answer must come within 3 s
        (result,) = finishes(lambda: provider.generate([req("x")]))
    assert len(ok(result)) == 1
    assert stub.received == 2


def test_dropped_connection_is_retried(stub: StubServer) -> None:
    stub.script = [Drop()]
    with stub_provider(stub) as provider:
        (result,) = provider.generate([req("x")])
    assert len(ok(result)) == 1
    stub.default = Drop()
    with stub_provider(stub, retries=1) as provider:
        (result,) = provider.generate([req("x")])
    error = failed(result)
    assert error.retryable and "connection error" in error.message


def test_malformed_200_is_retried_once_then_terminal(stub: StubServer) -> None:
    class Garbage(Action):
        def __call__(self, handler: Any, body: dict[str, Any]) -> None:
            handler.reply(200, {"unexpected": True})

    stub.script = [Garbage()]
    with stub_provider(stub) as provider:
        (result,) = provider.generate([req("x")])
    assert len(ok(result)) == 1 and stub.received == 2
    stub.script = [Garbage(), Garbage()]
    with stub_provider(stub) as provider:
        (result,) = provider.generate([req("x")])
    assert not failed(result).retryable and "malformed" in failed(result).message
    assert "after 2 attempts" in failed(result).message and stub.received == 4


def test_api_key_from_env_as_bearer(stub: StubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    with stub_provider(stub) as provider:
        provider.generate([req("none")])
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fallback")
    with stub_provider(stub) as provider:
        provider.generate([req("fallback")])
    monkeypatch.setenv("EVALREPLAY_API_KEY", "sk-evalreplay")
    with stub_provider(stub) as provider:
        provider.generate([req("preferred")])
        assert "sk-" not in repr(provider)
    auth = [headers.get("authorization") for _, headers, _ in stub.requests]
    assert auth == [None, "Bearer sk-fallback", "Bearer sk-evalreplay"]


def test_concurrency_bounds_requests_in_flight(stub: StubServer) -> None:
    stub.hold_if = lambda body: True
    with stub_provider(stub, concurrency=3) as provider:
        worker = threading.Thread(
            target=provider.generate, args=([req(f"q{i}", iid=f"q{i}") for i in range(9)],)
        )
        worker.start()
        assert stub.wait_until(lambda s: s.in_flight == 3)
        stub.release()
        worker.join()
    assert stub.answered == 9 and stub.peak_in_flight == 3
    stub.peak_in_flight = 0
    with stub_provider(stub, concurrency=1) as provider:
        provider.generate([req(f"q{i}", iid=f"q{i}") for i in range(3)])
    assert stub.peak_in_flight == 1


def test_connections_are_kept_alive(stub: StubServer) -> None:
    with stub_provider(stub, concurrency=1) as provider:
        for i in range(4):
            provider.generate([req(f"q{i}")])
    ports = {e["client_port"] for e in stub.events if e["event"] == "received"}
    assert len(ports) == 1


def test_server_closing_a_kept_alive_connection_costs_no_retry(stub: StubServer) -> None:
    class AnswerThenClose(Action):
        def __call__(self, handler: Any, body: dict[str, Any]) -> None:
            ANSWER(handler, body)
            handler.close_connection = True  # closes without a "Connection: close" header

    stub.script = [AnswerThenClose()]
    with stub_provider(stub, concurrency=1, retries=0) as provider:
        assert len(ok(provider.generate([req("a")])[0])) == 1
        # the model check's connection and the answered one are both closed now
        assert stub.wait_until(lambda s: s.count("closed") == 2)
        assert len(ok(provider.generate([req("b")])[0])) == 1
    assert stub.answered == 2


# -- streaming ---------------------------------------------------------------------------------


def test_the_stream_yields_a_finished_request_before_a_slow_one(stub: StubServer) -> None:
    stub.hold_if = lambda body: body.get("prompt") == "slow"
    with stub_provider(stub, concurrency=4) as provider:
        stream = provider.generate_stream([req("slow", iid="s"), req("fast", iid="f", num_samples=2, seed=1)])
        index, result = next(stream)
        assert index == 1 and [g.text for g in ok(result)] == ["fast|seed=1|i=0", "fast|seed=2|i=0"]
        assert stub.prompts() == ["fast", "fast"]  # "slow" is still held at the server
        stub.release()
        index, result = next(stream)
        assert index == 0 and ok(result)[0].text == "slow|seed=None|i=0"
        assert next(stream, None) is None


def test_a_connection_sends_its_next_request_only_once_its_answer_was_taken(stub: StubServer) -> None:
    """The loss bound of a kill: the consumer journals each answer it is
    handed before asking for the next, so an answer handed out but not yet
    taken back holds its connection; what the server answered is never more
    than one answer per connection ahead of the journal."""
    requests = [req(f"q{i}", iid=f"q{i}") for i in range(6)]
    with stub_provider(stub, concurrency=2) as provider:
        stream = provider.generate_stream(requests)
        next(stream)  # held, not yet journaled
        assert stub.wait_until(lambda s: s.answered == 2)
        assert not stub.wait_until(lambda s: s.received > 2, timeout=0.5)
        next(stream)  # the first answer is journaled now: its connection asks the next
        assert stub.wait_until(lambda s: s.received == 3)
        assert not stub.wait_until(lambda s: s.received > 3, timeout=0.5)
        assert len(list(stream)) == 4
    assert stub.answered == 6


def test_a_request_of_several_calls_holds_only_its_last_connection(stub: StubServer) -> None:
    stub.hold_if = lambda body: body.get("seed") == 2
    requests = [req("a", iid="a", num_samples=2, seed=1), req("b", iid="b"), req("c", iid="c")]
    safety = threading.Timer(10.0, stub.release)  # a wrong hold would wait for this, then fail below
    safety.start()
    try:
        with stub_provider(stub, concurrency=2) as provider:
            stream = provider.generate_stream(requests)
            # a's first draw answered leaves nothing to journal: its connection asks for b at once
            assert next(stream)[0] == 1
            assert stub.wait_until(lambda s: s.in_flight == 1, timeout=5)  # a's second draw, held
            assert not stub.wait_until(lambda s: s.received > 3, timeout=0.5)  # b is not journaled yet
            stub.release()
            assert sorted(i for i, _ in stream) == [0, 2]
    finally:
        safety.cancel()


def test_the_stream_yields_each_index_once(stub: StubServer) -> None:
    stub.script = [Fail(400, "bad")]
    requests = [
        req("a", iid="a", num_samples=3, seed=0),
        Request(task="t", instance_id="ll", context="x", request_type="loglikelihood"),
        req("b", iid="b", n=3),
        req("c", iid="c"),
        req("d", iid="d", num_samples=2, temperature=0),
    ]
    with stub_provider(stub, concurrency=2) as provider:
        pairs = list(provider.generate_stream(requests))
        assert sorted(i for i, _ in pairs) == list(range(len(requests)))
        assert provider.generate(requests)[1:3] == [dict(pairs)[1], dict(pairs)[2]]


def test_closing_the_stream_aborts_in_flight_calls_and_the_provider_works_again(stub: StubServer) -> None:
    stub.hold_if = lambda body: body.get("prompt", "").startswith("held")
    requests = [req("fast", iid="fast")] + [req(f"held{i}", iid=f"h{i}") for i in range(5)]
    with stub_provider(stub, concurrency=3) as provider:
        stream = provider.generate_stream(requests)
        assert next(stream)[0] == 0  # "fast"'s connection waits until it is journaled
        assert stub.wait_until(lambda s: len(s.prompts("received")) == 3)  # two held, three still queued
        stream.close()  # returns with the server still holding both
        assert stub.wait_until(lambda s: s.count("client_gone") == 2)
        assert stub.received == 3 and stub.answered == 1  # the queued three never went out
        stub.release()
        assert [g.text for g in ok(provider.generate([req("after")])[0])] == ["after|seed=None|i=0"]
    assert stub.received == 4


class _Interrupt(Exception):
    pass


def test_an_interrupt_while_waiting_aborts_calls(stub: StubServer) -> None:
    """A signal (as Ctrl-C is) arriving while the stream waits for results."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")

    def interrupt(signum: int, frame: Any) -> None:
        raise _Interrupt

    stub.hold_if = lambda body: True
    main = threading.main_thread().ident
    assert main is not None
    provider = stub_provider(stub, concurrency=2)

    def interrupter() -> None:
        if stub.wait_until(lambda s: s.in_flight == 2):
            signal.pthread_kill(main, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        thread = threading.Thread(target=interrupter)
        thread.start()
        with pytest.raises(_Interrupt):
            provider.generate([req(f"q{i}", iid=f"q{i}") for i in range(4)])
        thread.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert stub.wait_until(lambda s: s.count("client_gone") == 2)
    assert stub.received == 2
    stub.release()
    with provider:
        assert len(ok(provider.generate([req("after")])[0])) == 1


def test_close_cancels_a_stream_in_another_thread(stub: StubServer) -> None:
    """provider.close() while a stream waits: every index still comes, as a retryable failure."""
    stub.hold_if = lambda body: True
    provider = stub_provider(stub, concurrency=1)
    box: list[list[tuple[int, Any]]] = []
    consumer = threading.Thread(
        target=lambda: box.append(list(provider.generate_stream([req("a"), req("b")])))
    )
    consumer.start()
    assert stub.wait_until(lambda s: s.in_flight == 1)
    provider.close()
    consumer.join()
    (pairs,) = box
    assert sorted(i for i, _ in pairs) == [0, 1]
    assert all(failed(r).retryable and "closed" in failed(r).message for _, r in pairs)


# -- several servers -----------------------------------------------------------------------------


def test_load_is_spread_over_servers(stub: StubServer, stub2: StubServer) -> None:
    for s in (stub, stub2):
        s.hold_if = lambda body: True
    prompts = [f"q{i}" for i in range(12)]
    with stub_provider(stub, stub2, concurrency=4) as provider:
        worker = threading.Thread(target=provider.generate, args=([req(p, iid=p) for p in prompts],))
        worker.start()
        # fewest in flight first: the four first calls go two and two
        assert stub.wait_until(lambda s: s.in_flight == 2) and stub2.wait_until(lambda s: s.in_flight == 2)
        stub.release()
        stub2.release()
        worker.join()
    assert stub.answered >= 2 and stub2.answered >= 2
    assert sorted(stub.prompts() + stub2.prompts()) == sorted(prompts)


def test_a_server_stopped_mid_run_loses_nothing(stub: StubServer, stub2: StubServer) -> None:
    stub.hold_if = lambda body: True  # it never answers; then it goes away
    prompts = [f"q{i}" for i in range(20)]
    with stub_provider(stub, stub2, concurrency=4, cool_down=1000.0) as provider:
        box: list[list[Any]] = []
        worker = threading.Thread(
            target=lambda: box.append(provider.generate([req(p, iid=p) for p in prompts]))
        )
        worker.start()
        assert stub.wait_until(lambda s: s.in_flight >= 1)
        stub.stop()
        worker.join()
    (out,) = box
    assert [r[0].text for r in map(ok, out)] == [f"{p}|seed=None|i=0" for p in prompts]
    assert stub.answered == 0
    assert sorted(stub2.prompts()) == sorted(prompts)  # each answered once, by the other server


def test_a_hanging_server_sends_its_requests_to_the_other(stub: StubServer, stub2: StubServer) -> None:
    """The first call goes to the hanging server (no load anywhere yet), times
    out, takes it out and is retried on the other; the second goes there at once."""
    stub.default = Hang()
    with stub_provider(
        stub, stub2, concurrency=1, timeout=3.0, failures_to_cool=1, cool_down=1000.0
    ) as provider:
        out = finishes(lambda: provider.generate([req("a", iid="a"), req("b", iid="b")]))
    assert all(len(ok(r)) == 1 for r in out)
    assert stub.answered == 0 and sorted(stub2.prompts()) == ["a", "b"]
    assert stub.wait_until(lambda s: s.prompts("received") == ["a"])


def test_every_server_out_fails_retryable_at_once_when_none_is_back_in_time(stub: StubServer) -> None:
    stub.default = Fail(503, "down")
    with stub_provider(stub, retries=3, timeout=5.0, failures_to_cool=1, cool_down=1000.0) as provider:
        (result,) = provider.generate([req("x")])
    error = failed(result)
    assert error.retryable and "every server is out" in error.message and "HTTP 503" in error.message
    assert stub.received == 1


def test_a_call_waits_for_a_server_to_come_back(stub: StubServer) -> None:
    stub.script = [Fail(503, "restarting")]
    with stub_provider(stub, failures_to_cool=1, cool_down=0.05) as provider:
        (result,) = provider.generate([req("x")])
    assert len(ok(result)) == 1 and stub.received == 2


# -- the balancer, without a network ------------------------------------------------------------


def test_balancer_fewest_in_flight_then_least_recent() -> None:
    b = Balancer(3, failures_to_cool=3, cool_down=10.0, max_cool_down=40.0)
    assert [b.choose(0.0) for _ in range(4)] == [0, 1, 2, 0]
    b.done(1, 0.0, True)
    assert b.choose(0.0) == 1  # now the least loaded
    assert b.choose(0.0, avoid=frozenset({2})) == 1  # 1 and 2 tie on load; 2 is avoided
    assert b.choose(0.0, avoid=frozenset({0, 1, 2})) == 2  # all avoided: avoidance yields


def test_balancer_cool_down_grows_and_a_success_resets_it() -> None:
    b = Balancer(2, failures_to_cool=3, cool_down=10.0, max_cool_down=25.0)
    for _ in range(3):
        assert b.choose(0.0, avoid=frozenset({1})) == 0
        b.done(0, 0.0, False)
    assert not b.available(0, 9.9) and b.back_at(0.0) == 10.0
    assert b.choose(5.0) == 1  # 0 is out
    b.done(1, 5.0, True)
    assert b.choose(10.0, avoid=frozenset({1})) == 0  # back, on probation: one probe at a time
    assert not b.available(0, 10.0)
    b.done(0, 10.0, False)  # the probe failed: out again, twice as long
    assert b.back_at(10.0) == 30.0
    assert b.choose(30.0, avoid=frozenset({1})) == 0
    b.done(0, 30.0, False)
    assert b.back_at(30.0) == 55.0  # capped at max_cool_down
    assert b.choose(55.0, avoid=frozenset({1})) == 0
    b.done(0, 55.0, True)  # a success: healthy again, three failures needed once more
    for _ in range(2):
        b.choose(56.0, avoid=frozenset({1}))
        b.done(0, 56.0, False)
    assert b.available(0, 56.0)


def test_balancer_ignores_failures_of_calls_sent_before_it_went_out() -> None:
    b = Balancer(1, failures_to_cool=1, cool_down=10.0, max_cool_down=100.0)
    b.choose(0.0)
    b.choose(0.0)
    b.done(0, 1.0, False)
    b.done(0, 2.0, False)  # still out: no second, longer cool-down
    assert b.back_at(2.0) == 11.0
    b.choose(11.0)
    b.done(0, 11.0, None)  # cancelled: says nothing about the server
    assert b.available(0, 11.0) and b.health[0].probation


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["pick", "ok", "fail", "cancel"]), st.integers(0, 3), st.floats(0, 50)),
        max_size=60,
    )
)
def test_balancer_invariants(ops: list[tuple[str, int, float]]) -> None:
    b = Balancer(3, failures_to_cool=2, cool_down=1.0, max_cool_down=8.0)
    now = 0.0
    flying: list[int] = []
    for op, pick, step in ops:
        now += step
        if op == "pick":
            chosen = b.choose(now, avoid=frozenset({pick}))
            if chosen is None:
                assert not any(b.available(i, now) for i in range(3))
            else:
                flying.append(chosen)
        elif flying:
            server = flying.pop(pick % len(flying))
            b.done(server, now, {"ok": True, "fail": False, "cancel": None}[op])
        for i, h in enumerate(b.health):
            assert h.in_flight == flying.count(i) >= 0
            assert h.out_until <= now + 8.0


# -- the stub as a subprocess (what plugin-level tests run) ------------------------------------


def test_stub_subprocess_prints_its_port_and_logs_each_answer(tmp_path: Path) -> None:
    log = tmp_path / "answers.jsonl"
    script = Path(__file__).with_name("http_stub.py")
    cmd = [sys.executable, str(script), "--port", "0", "--model", "m", "--delay", "0", "--log", str(log)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            port = int(proc.stdout.readline())
            with OpenAIProvider(f"http://127.0.0.1:{port}/v1", "m", concurrency=2) as provider:
                out = provider.generate([req(f"q{i}", iid=f"q{i}", num_samples=2, seed=3) for i in range(3)])
            assert all(len(ok(r)) == 2 for r in out)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
    rows = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    assert sorted((r["prompt"], r["seed"]) for r in rows) == sorted(
        (f"q{i}", s) for i in range(3) for s in (3, 4)
    )
    assert all(r["event"] == "answered" and r["model"] == "m" and r["port"] == port for r in rows)


def test_stub_answers_nothing_to_a_client_gone_during_its_delay() -> None:
    with StubServer(delay=600.0) as stub:
        body = orjson.dumps({"model": "m", "prompt": "p"})
        with socket.create_connection(("127.0.0.1", stub.port)) as sock:
            head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
            sock.sendall(head.encode() + body)
            assert stub.wait_until(lambda s: s.received == 1)
        assert stub.wait_until(lambda s: s.count("client_gone") == 1)
        assert stub.answered == 0


# -- against vLLM's OpenAI-compatible server ------------------------------------------

SERVED_NAME = "tiny-llama"
SERVER_KEY = "test-key-123"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`python -m vllm.entrypoints.openai.api_server` on a free local port,
    always killed (with its engine processes) at the end of the module."""
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_llama), "--served-model-name", SERVED_NAME,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "256", "--enforce-eager",
        "--gpu-memory-utilization", "0.1", "--uvicorn-log-level", "warning",
    ]  # fmt: skip
    env = {**os.environ, "VLLM_API_KEY": SERVER_KEY}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:]
                pytest.fail(f"vLLM server exited with {proc.returncode}:\n{tail}")
            if time.monotonic() > deadline:
                pytest.fail("vLLM server not ready after 240 s:\n" + log.read_text(errors="replace")[-3000:])
            try:
                probe = urllib.request.Request(
                    f"{base}/v1/models", headers={"Authorization": f"Bearer {SERVER_KEY}"}
                )
                with urllib.request.urlopen(probe, timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        yield f"{base}/v1"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def served(vllm_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIProvider]:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("EVALREPLAY_API_KEY", SERVER_KEY)
    with OpenAIProvider(vllm_server, SERVED_NAME, concurrency=4, timeout=60, retries=1, backoff=0.1) as p:
        yield p


def test_real_server_text_seeds_and_n(served: OpenAIProvider) -> None:
    out = served.generate(
        [
            req("Question: what is 2+2?", num_samples=3, seed=5, max_tokens=8, ignore_eos=True),
            req("Sample freely", iid="s", num_samples=3, temperature=1.0, max_tokens=8, ignore_eos=True),
            req("Greedy", iid="g", num_samples=2, temperature=0, max_tokens=8),
        ]
    )
    seeded = ok(out[0])
    assert len(seeded) == 3 and len({g.text for g in seeded}) == 3
    for g in seeded:
        assert g.finish_reason == "length" and g.completion_tokens == 8 and g.prompt_tokens
    sampled = ok(out[1])
    assert len(sampled) == 3 and all(g.completion_tokens == 8 for g in sampled)  # 24 split over n=3
    greedy = ok(out[2])
    assert len(greedy) == 2 and greedy[0].text == greedy[1].text
    again = served.generate(
        [req("Question: what is 2+2?", num_samples=3, rollouts=(2,), seed=5, max_tokens=8, ignore_eos=True)]
    )
    assert [g.text for g in ok(again[0])] == [seeded[2].text]


def test_real_server_chat(served: OpenAIProvider, tiny_llama: Path) -> None:
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "What is two plus two?"}]
    (result,) = served.generate([req(messages, system_prompt="Answer briefly.", max_tokens=6, seed=1)])
    (g,) = ok(result)
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    rendered = tok.apply_chat_template(
        [{"role": "system", "content": "Answer briefly."}, *messages],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert g.prompt_tokens == len(tok.encode(rendered, add_special_tokens=False))
    assert g.finish_reason in ("stop", "length") and 0 < (g.completion_tokens or 0) <= 6


def test_real_server_rejections_are_terminal(served: OpenAIProvider, vllm_server: str) -> None:
    (too_long,) = served.generate([req("0 1 2 3 4 5 6 7 8 9 " * 200, max_tokens=4)])
    assert isinstance(too_long, GenerationError) and not too_long.retryable
    assert "HTTP 400" in too_long.message and "context length" in too_long.message
    # A wrong key is refused once, when the servers are checked, not item by item.
    bad = OpenAIProvider(vllm_server, SERVED_NAME, api_key="wrong", retries=0)
    with bad, pytest.raises(EvalReplayError, match=r"HTTP 401.*EVALREPLAY_API_KEY"):
        bad.generate([req("hi", max_tokens=2)])


def test_real_server_model_check_and_two_urls(served: OpenAIProvider, vllm_server: str) -> None:
    """Two URLs (the same server under two names) share the load; a wrong
    model name is refused naming what the server serves."""
    port = vllm_server.rsplit(":", 1)[1]
    urls = (vllm_server, f"http://localhost:{port}")
    with pytest.raises(EvalReplayError, match=f"serves '{SERVED_NAME}', not 'Qwen/Qwen3-0.6B'"):
        openai_mod.from_settings(Settings(provider="openai", model="Qwen/Qwen3-0.6B", base_urls=urls))
    settings = Settings(provider="openai", model=SERVED_NAME, base_urls=urls, concurrency=4, timeout=60)
    with openai_mod.from_settings(settings) as both:
        requests = [req(f"Question {i}:", iid=f"q{i}", temperature=0, max_tokens=4) for i in range(8)]
        streamed = dict(both.generate_stream(requests))
        alone = served.generate(requests)
    assert [ok(streamed[i]) for i in range(8)] == [ok(r) for r in alone]


def test_real_server_matches_in_process_engine(served: OpenAIProvider, vllm_provider: Any) -> None:
    """Both providers ask the model the same thing: greedy answers agree."""
    requests = [
        req("What is 2+2?", iid="text", system_prompt="Answer briefly.", temperature=0, max_tokens=8),
        req(
            [{"role": "user", "content": "hi"}],
            iid="chat",
            system_prompt="Be kind.",
            temperature=0,
            max_tokens=8,
        ),
    ]
    over_http = [ok(r) for r in served.generate(requests)]
    in_process = [ok(r) for r in vllm_provider.generate(requests)]
    for a, b in zip(over_http, in_process, strict=True):
        assert [(g.text, g.prompt_tokens, g.completion_tokens) for g in a] == [
            (g.text, g.prompt_tokens, g.completion_tokens) for g in b
        ]
