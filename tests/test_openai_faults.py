"""The openai provider against servers that misbehave in ways issue #18 found:
a model list that is not implemented (case 6), 200 answers that hold no
answer (case 13), servers that fail every POST (case 14), and credentials in
the base URL (case 17). Pure rules (wire parsing, the breaker, redaction) are
called directly; the rest runs against tests/http_stub.py on 127.0.0.1.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
from http_stub import STUB_MODEL, Action, Fail, StubServer
from llm_fixtures import make_request

from pytest_evalreplay.model import EvalReplayError, Generation, GenerationError
from pytest_evalreplay.providers import ProviderHost
from pytest_evalreplay.providers import openai as openai_mod
from pytest_evalreplay.providers.openai import OpenAIProvider
from pytest_evalreplay.providers.openai_balancer import parse_server
from pytest_evalreplay.providers.openai_breaker import Breaker
from pytest_evalreplay.providers.openai_wire import CallFailure, parse_generations
from pytest_evalreplay.settings import Settings
from pytest_evalreplay.values.credentials import redact_url

req = make_request
pytestmark = pytest.mark.usefixtures("no_api_key")


def make(stub: StubServer, **kwargs: Any) -> OpenAIProvider:
    return OpenAIProvider(stub.url, STUB_MODEL, **{"retries": 2, "backoff": 0.01, "timeout": 30.0, **kwargs})


class Reply(Action):
    """A 200 with the given body."""

    def __init__(self, body: Any) -> None:
        self.body = body

    def __call__(self, handler: Any, body: dict[str, Any]) -> None:
        handler.stub._event("failed", handler.path, body, status=200)
        handler.reply(200, self.body)


# -- case 6: GET /models not implemented ------------------------------------------------------


@pytest.mark.parametrize("status", [404, 405, 501])
def test_a_model_list_not_implemented_skips_the_check_with_a_note(stub: StubServer, status: int) -> None:
    stub.models_status = status
    with make(stub) as provider:
        provider.check_servers()
        (result,) = provider.generate([req("x")])
        assert isinstance(result, list) and len(result) == 1
        (note,) = provider.notes
    assert f"GET /v1/models answered HTTP {status}" in note and "model check was skipped" in note
    assert stub.url in note


def test_a_model_list_served_without_the_model_is_still_refused(stub: StubServer) -> None:
    stub.model = "other"
    with pytest.raises(EvalReplayError, match="serves 'other'"):
        make(stub).check_servers()


def test_the_host_passes_the_providers_notes_on() -> None:
    class Noted:
        model = "m"

        def __init__(self) -> None:
            self.notes = ["a note"]

        def generate(self, requests: list[Any]) -> list[Any]:
            return []

    host = ProviderHost(Settings(provider="mine"), from_hook=lambda kind: Noted())
    host.get()
    host.close()
    assert host.notes == ["a note"]


# -- case 13: a 200 without an answer --------------------------------------------------------


def body(*choices: dict[str, Any]) -> bytes:
    return orjson.dumps({"choices": list(choices), "usage": {"prompt_tokens": 1, "completion_tokens": 2}})


@pytest.mark.parametrize(
    ("choice", "chat", "says"),
    [
        ({"index": 0, "finish_reason": "stop"}, False, "no 'text'"),
        ({"index": 0, "text": None}, False, "no 'text'"),
        ({"index": 0, "text": 5}, False, "no 'text'"),
        ({"index": 0, "message": {"role": "assistant"}}, True, "no 'message.content'"),
        ({"index": 0, "message": {"content": None}}, True, "no 'message.content'"),
        ({"index": 0, "message": None}, True, "no 'message.content'"),
        ({"index": 0, "text": "a chat answer in the text field"}, True, "no 'message.content'"),
    ],
)
def test_a_choice_without_an_answer_is_a_failure_not_an_empty_text(
    choice: dict[str, Any], chat: bool, says: str
) -> None:
    got = parse_generations(body(choice), 1, chat)
    assert isinstance(got, CallFailure), got
    assert says in got.message


def test_an_empty_answer_and_a_reasoning_only_chat_answer_are_answers() -> None:
    (gen,) = parse_generations(body({"index": 0, "text": ""}), 1, False)  # type: ignore[misc]
    assert gen.text == ""
    # A reasoning model that spent its tokens thinking: the answer is empty, the reasoning kept.
    choice = {"index": 0, "finish_reason": "length", "message": {"content": None, "reasoning_content": "hmm"}}
    (gen,) = parse_generations(body(choice), 1, True)  # type: ignore[misc]
    assert (gen.text, gen.metadata) == ("", {"reasoning": "hmm"})


@pytest.mark.parametrize(
    ("indices", "says"),
    [
        ([0, 0], "indices [0, 0]"),
        ([1, 2], "indices [1, 2]"),
        ([0, None], "indices [0, None]"),
        ([0, True], "indices [0, True]"),
    ],
)
def test_choice_indices_must_be_0_to_n_minus_1_each_once(indices: list[Any], says: str) -> None:
    choices = [{"index": i, "text": "t"} for i in indices]
    got = parse_generations(body(*choices), 2, False)
    assert isinstance(got, CallFailure) and says in got.message and "0..1" in got.message


def test_a_200_without_an_answer_is_retried_once_then_fails_for_good(stub: StubServer) -> None:
    empty = Reply({"choices": [{"index": 0, "text": None}]})
    stub.script = [empty]
    with make(stub) as provider:
        (result,) = provider.generate([req("x")])
    assert isinstance(result, list) and result[0].text.startswith("x|")
    assert stub.received == 2
    stub.script = [empty, empty]
    with make(stub) as provider:
        (result,) = provider.generate([req("x")])
    assert isinstance(result, GenerationError) and not result.retryable
    assert "no 'text'" in result.message and "after 2 attempts" in result.message
    assert stub.received == 4


def test_a_200_without_an_answer_fails_the_run_item_instead_of_scoring_0(pytester: pytest.Pytester) -> None:
    with StubServer(STUB_MODEL) as server:
        server.default = Reply({"choices": [{"index": 0, "finish_reason": "length"}]})
        pytester.makepyfile(
            test_evals="""
            from pytest_evalreplay import EvalTask
            t = EvalTask("t", [{"id": "a"}], prompt="Q {id}", scorer=lambda text, i: 0.0)
            """
        )
        result = pytester.runpytest(
            "-p",
            "no:randomly",
            "--evalreplay-provider=openai",
            f"--evalreplay-base-url={server.url}",
            f"--evalreplay-model={STUB_MODEL}",
            "--evalreplay-output=out",
        )
    out = result.stdout.str()
    assert result.ret == 1, out
    assert "no 'text'" in out and "1 failed" in out


# -- case 14: every server keeps failing -----------------------------------------------------


def test_the_breaker_opens_when_every_server_fails_before_any_success() -> None:
    b = Breaker(2, failures=3, give_up_after=120.0)
    for _ in range(3):
        b.record(0, 0.0, healthy=False)
    assert b.reason(0.0) is None  # server 1 has not failed yet
    for _ in range(2):
        b.record(1, 0.0, healthy=False)
    b.record(1, 0.0, healthy=None)  # cancelled: says nothing
    assert b.reason(0.0) is None
    b.record(1, 0.5, healthy=False)
    reason = b.reason(0.5)
    assert reason is not None and "every server failed 3 times in a row" in reason


def test_after_a_success_the_breaker_waits_its_time_budget() -> None:
    b = Breaker(1, failures=3, give_up_after=120.0)
    b.record(0, 0.0, healthy=True)
    for t in (10.0, 11.0, 12.0, 13.0):
        b.record(0, t, healthy=False)
    assert b.reason(100.0) is None  # a restart gets its grace time
    b.record(0, 129.0, healthy=False)
    reason = b.reason(130.0)
    assert reason is not None and "no request has succeeded for 120 s" in reason
    b.record(0, 131.0, healthy=True)  # too late: an open breaker stays open
    assert b.reason(131.0) == reason


def test_a_success_anywhere_resets_the_streak() -> None:
    b = Breaker(2, failures=2, give_up_after=120.0)
    b.record(0, 0.0, healthy=False)
    b.record(1, 0.0, healthy=False)
    b.record(0, 0.0, healthy=True)
    b.record(1, 0.0, healthy=False)
    b.record(0, 0.0, healthy=False)
    assert b.reason(0.0) is None


def test_an_always_failing_server_is_given_up_on_within_seconds(stub: StubServer) -> None:
    """Default options (1 s backoff, 4 retries, 600 s timeout): not 1,384 s."""
    stub.default = Fail(500, "internal error")
    start = time.monotonic()
    with OpenAIProvider(stub.url, STUB_MODEL) as provider:
        results = provider.generate([req("x", num_samples=2, rollouts=(0, 1), seed=1)])
        assert time.monotonic() - start < 20.0
        (error,) = results
        assert isinstance(error, GenerationError) and error.retryable
        assert "gave up" in error.message and "HTTP 500" in error.message
        assert "internal error" in error.message
        before = stub.received
        (again,) = provider.generate([req("y")])
        assert isinstance(again, GenerationError) and "gave up" in again.message
        assert stub.received == before  # nothing more is sent once it gave up
        assert any("gave up" in note for note in provider.notes)


def test_an_always_failing_server_ends_a_run_within_seconds(pytester: pytest.Pytester) -> None:
    with StubServer(STUB_MODEL) as server:
        server.default = Fail(500, "internal error")
        pytester.makepyfile(
            test_evals="""
            from pytest_evalreplay import EvalTask
            t = EvalTask("t", [{"id": "a"}], prompt="Q {id}", scorer=lambda text, i: 1.0, num_samples=2)
            """
        )
        start = time.monotonic()
        result = pytester.runpytest(
            "-p",
            "no:randomly",
            "--evalreplay-provider=openai",
            f"--evalreplay-base-url={server.url}",
            f"--evalreplay-model={STUB_MODEL}",
            "--evalreplay-output=out",
        )
        elapsed = time.monotonic() - start
    out = result.stdout.str()
    assert result.ret == 1, out
    assert elapsed < 30.0, out
    assert "gave up" in out and "HTTP 500" in out
    assert "note: the openai provider gave up" in out  # the reason once, in the summary


def test_the_default_give_up_rule_is_visible() -> None:
    text = openai_mod.describe(Settings(provider="openai", model="m", base_urls=("http://h:1/v1",)))
    assert "600 s" in text and f"{openai_mod.GIVE_UP_AFTER:g} s" in text


# -- case 17: credentials in the base URL ------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:secret@h:1/v1", "http://user:***@h:1/v1"),
        ("http://token@h/v1", "http://***@h/v1"),
        ("https://h:8/v1", "https://h:8/v1"),
        ("not a url user:secret@x", "not a url user:***@x"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_the_password_never_shows(stub: StubServer) -> None:
    gone = StubServer(STUB_MODEL).start()
    port = gone.port
    gone.stop()
    url = f"http://user:secret@127.0.0.1:{port}/v1"
    with pytest.raises(EvalReplayError) as info:
        openai_mod.from_settings(Settings(provider="openai", model=STUB_MODEL, base_urls=(url,)))
    assert "secret" not in str(info.value) and f"user:***@127.0.0.1:{port}/v1: unreachable" in str(info.value)
    for bad in ("ftp://user:secret@h/v1", "http://user:secret@h:99999999/v1"):
        with pytest.raises(EvalReplayError) as info:
            OpenAIProvider(bad, "m")
        assert "secret" not in str(info.value) and "user:***@" in str(info.value)
    authed = f"http://user:secret@127.0.0.1:{stub.port}/v1"
    stub.default = Fail(503, "down")
    with OpenAIProvider(authed, STUB_MODEL, retries=1, backoff=0.01) as provider:
        assert "secret" not in repr(provider)
        (error,) = provider.generate([req("x")])
        stub.models_status = 404
    assert isinstance(error, GenerationError)
    assert "secret" not in error.message and "user:***@" in error.message
    with OpenAIProvider(authed, STUB_MODEL) as provider:
        provider.check_servers()
        assert provider.notes and not any("secret" in note for note in provider.notes)


def test_parse_server_keeps_the_host_and_hides_the_password() -> None:
    server = parse_server("http://user:secret@h:1/v1")
    assert (server.host, server.port, server.url) == ("h", 1, "http://user:***@h:1/v1")
    assert "secret" not in repr(server)


def test_generations_are_generations() -> None:
    (gen,) = parse_generations(body({"index": 0, "text": "ok"}), 1, False)  # type: ignore[misc]
    assert isinstance(gen, Generation) and gen.text == "ok"


class EchoAuthorization(Action):
    """A 400 whose body repeats the request's Authorization header (some servers do)."""

    name = "echo"

    def __call__(self, handler: Any, body: dict[str, Any]) -> None:
        handler.stub._event("failed", handler.path, body, status=400)
        said = handler.headers.get("Authorization")
        handler.reply(400, {"error": {"message": f"bad key {said}; Authorization: {said}", "code": 400}})


KEY = "sk-test-0123456789abcdef"


def test_an_api_key_a_server_echoes_is_never_saved_or_shown(stub: StubServer) -> None:
    """Issue #30 case 6: a server echoing the key put `sk-...` into the journal and the terminal."""
    stub.default = EchoAuthorization()
    with OpenAIProvider(stub.url, STUB_MODEL, retries=0, api_key=KEY) as provider:
        (error,) = provider.generate([make_request("x")])
    assert isinstance(error, GenerationError)
    assert KEY not in error.message and "HTTP 400" in error.message
    assert "bad key Bearer ***" in error.message and "Authorization: Bearer ***" in error.message


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"key {KEY} here", "key *** here"),
        ("Authorization: Bearer abc.def-ghi", "Authorization: Bearer ***"),
        ("'authorization': 'Basic dXNlcjpwYXNz'", "'authorization': 'Basic ***'"),
        ("http://user:secret@h:1/v1", "http://user:***@h:1/v1"),
        ("nothing to hide", "nothing to hide"),
    ],
)
def test_redact_hides_the_key_authorization_values_and_url_passwords(text: str, shown: str) -> None:
    from pytest_evalreplay.values.credentials import redact

    assert redact(text, (KEY,)) == shown


@pytest.mark.parametrize("count", [-1, -5, True, 2.5, "3"])
def test_a_token_count_that_is_not_a_count_is_dropped_and_the_answer_kept(count: Any) -> None:
    """Issue #30 case 14: a negative token count from a server failed the item."""
    raw = orjson.dumps(
        {
            "choices": [{"index": 0, "text": "fine", "finish_reason": "stop"}],
            "usage": {"prompt_tokens": count, "completion_tokens": count},
        }
    )
    (gen,) = parse_generations(raw, 1, False)  # type: ignore[misc]
    assert (gen.text, gen.prompt_tokens, gen.completion_tokens) == ("fine", None, None)
    assert gen.problem() is None
