"""Loglikelihood requests on the openai provider against the local stub
server (tests/http_stub.py answers echo requests as `vllm serve` does, with
the deterministic log-probabilities of tests/stub_logprobs.py). The check
against the real server and transformers is in test_vllm_loglikelihood.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from http_stub import STUB_MODEL, Action, Fail, Hang, StubServer, completion
from llm_fixtures import ll_request, stub_provider
from stub_logprobs import is_top, token_logprob, tokenize

from pytest_evalreplay.model import GenerationError, Request
from pytest_evalreplay.providers.openai_wire import Echoed, parse_echoes

pytestmark = pytest.mark.usefixtures("no_api_key")


def expected(context: str, continuation: str) -> tuple[float, bool]:
    """What the stub's log-probabilities give, with lm-eval's split."""
    stripped = context.rstrip()
    whole = tokenize(stripped + context[len(stripped) :] + continuation)
    start = len(tokenize(stripped))
    positions = range(start, len(whole))
    return (
        sum(token_logprob(whole[p], p) for p in positions),
        all(is_top(whole[p], p) for p in positions),
    )


@dataclass(frozen=True)
class Edited(Action):
    """The stub's echo answer, changed by `edit` before it is sent."""

    edit: Callable[[dict[str, Any]], None]
    name = "answer"

    def __call__(self, handler: Any, body: dict[str, Any]) -> None:
        payload = completion(body)
        self.edit(payload)
        handler.stub._answered(handler.path, body)
        handler.reply(200, payload)


CASES = [
    ("Question: name a prime number. Answer:", (" seven", " four", " eleven is prime")),
    ("What is two plus two? The answer is ", ("four.", "five.", "")),
    ("The quick brown fox jumps over the", (" lazy dog.", " fence")),
]


def test_values_and_greedy_follow_the_echoed_logprobs(stub: StubServer) -> None:
    requests = [ll_request(c, conts, iid=f"q{n}") for n, (c, conts) in enumerate(CASES)]
    with stub_provider(stub) as provider:
        results = provider.loglikelihood(requests)
    greedy_seen = set()
    for (context, continuations), result in zip(CASES, results, strict=True):
        assert not isinstance(result, GenerationError), result
        assert len(result) == len(continuations)
        for continuation, (ll, greedy) in zip(continuations, result, strict=True):
            want, want_greedy = expected(context, continuation)
            assert ll == pytest.approx(want, abs=1e-12)
            assert greedy is want_greedy
            greedy_seen.add(greedy)
    assert greedy_seen == {True, False}


def test_one_echo_call_per_request_its_context_counted_at_tokenize(stub: StubServer) -> None:
    """The model processes one prompt per distinct continuation, as lm-eval sends."""
    with stub_provider(stub) as provider:
        (result,) = provider.loglikelihood(
            [ll_request("Say: ", ("yes", "no", "yes"), system_prompt="Be brief.")]
        )
        assert provider.notes == []
    assert not isinstance(result, GenerationError) and result[0] == result[2]
    ((path, _, body),) = stub.requests
    assert path == "/v1/completions"
    context = "Be brief.\n\nSay:"
    assert body == {
        "model": STUB_MODEL,
        "prompt": [context + " yes", context + " no"],
        "echo": True,
        "logprobs": 1,
        "max_tokens": 0,
        "temperature": 0,
    }
    assert stub.tokenized == 2  # the probe, then the context
    assert result == [expected("Be brief.\n\nSay: ", c) for c in ("yes", "no", "yes")]


def test_a_server_without_tokenize_gets_the_context_echoed_alone_and_the_same_values(
    stub: StubServer,
) -> None:
    stub.tokenize = False
    requests = [ll_request(c, conts, iid=f"q{n}") for n, (c, conts) in enumerate(CASES)]
    with stub_provider(stub) as provider:
        results = provider.loglikelihood(requests)
        (note,) = provider.notes
    assert "does not count tokens at /tokenize (HTTP 404 from http://127.0.0.1:" in note
    assert "one prompt more per request than lm-eval sends" in note
    assert sorted(body["prompt"][0] for body in stub.bodies()) == sorted(c.rstrip() for c, _ in CASES)
    assert results == [[expected(c, k) for k in conts] for c, conts in CASES]


def test_with_a_start_token_tokenize_counts_it_as_the_echo_does(stub: StubServer) -> None:
    stub.bos = True
    requests = [ll_request(c, conts, iid=f"q{n}") for n, (c, conts) in enumerate(CASES)]
    with stub_provider(stub) as provider:
        counted = provider.loglikelihood(requests)
    stub.tokenize = False
    with stub_provider(stub) as provider:
        echoed = provider.loglikelihood(requests)
    assert counted == echoed
    assert not any(isinstance(r, GenerationError) for r in counted)


def test_stream_yields_each_request_once(stub: StubServer) -> None:
    requests = [ll_request(c, conts, iid=f"q{n}") for n, (c, conts) in enumerate(CASES)]
    with stub_provider(stub, concurrency=2) as provider:
        streamed = dict(provider.loglikelihood_stream(requests))
        assert [streamed[i] for i in range(len(CASES))] == provider.loglikelihood(requests)


def test_a_503_is_retried(stub: StubServer) -> None:
    stub.script = [Fail(503, "busy")]
    with stub_provider(stub) as provider:
        (result,) = provider.loglikelihood([ll_request("Answer:", (" seven",))])
    assert result == [expected("Answer:", " seven")]
    assert stub.received == 2


def test_a_timeout_is_a_retryable_failure(stub: StubServer) -> None:
    stub.script = [Hang(), Hang()]
    with stub_provider(stub, timeout=0.3, retries=1) as provider:
        (result,) = provider.loglikelihood([ll_request("Answer:", (" seven",))])
    assert isinstance(result, GenerationError) and result.retryable
    assert "timed out" in result.message and stub.received == 2


def test_several_servers_share_the_calls(stub: StubServer) -> None:
    with StubServer(STUB_MODEL) as other, stub_provider(stub, other, concurrency=4) as provider:
        requests = [ll_request(f"Question {i}:", (" a", " b"), iid=f"q{i}") for i in range(12)]
        results = provider.loglikelihood(requests)
        # Calls, not completions: each request's /tokenize call is balanced too, so
        # strict alternation can send every completion to one server.
        assert stub.received + other.received == 12
        assert stub.received + stub.tokenized and other.received + other.tokenized, provider.notes
    assert results == [[expected(f"Question {i}:", c) for c in (" a", " b")] for i in range(12)]


def _drop_logprobs(payload: dict[str, Any]) -> None:
    payload["choices"][0].pop("logprobs")


def _short_top(payload: dict[str, Any]) -> None:
    payload["choices"][0]["logprobs"]["top_logprobs"].pop()


def _null_inside(payload: dict[str, Any]) -> None:
    for choice in payload["choices"]:
        choice["logprobs"]["token_logprobs"][-1] = None


def _nan(payload: dict[str, Any]) -> None:
    payload["choices"][0]["logprobs"]["token_logprobs"][-1] = float("nan")


def _one_choice_short(payload: dict[str, Any]) -> None:
    payload["choices"].pop()


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (_drop_logprobs, "no 'logprobs' object"),
        (_short_top, "top log-probabilities"),
        (_null_inside, "no log-probability for token"),
        (_nan, "log-probability"),
        (_one_choice_short, "0 choices where 1 were asked for"),
    ],
)
def test_a_malformed_answer_fails_clearly_never_scores(
    stub: StubServer, edit: Callable[[dict[str, Any]], None], says: str
) -> None:
    stub.default = Edited(edit)
    with stub_provider(stub) as provider:
        (result,) = provider.loglikelihood([ll_request("Answer:", (" seven",))])
    assert isinstance(result, GenerationError) and not result.retryable, result
    assert says in result.message


def test_requests_it_cannot_score_are_refused_without_a_call(stub: StubServer) -> None:
    requests = [
        ll_request([{"role": "user", "content": "Hi"}], (" a",)),
        ll_request("Look:", (" a",), images=("x.png",)),
        Request(task="t", instance_id="g", context="Hi"),
    ]
    with stub_provider(stub) as provider:
        results = provider.loglikelihood(requests)
        (empty,) = provider.loglikelihood([ll_request("", ("seven",))])
    assert all(isinstance(r, GenerationError) and not r.retryable for r in results)
    assert [m for m in ("chat context", "images", "'generate' requests") if m in str(results)] == [
        "chat context",
        "images",
        "'generate' requests",
    ]
    assert stub.received == 1  # only the empty context went out: the server decides how it tokenizes ""
    assert isinstance(empty, GenerationError) and "context is empty" in empty.message


def test_parse_echoes_reads_vllm_serve_shape() -> None:
    """The body as vLLM 0.32's server answered (abridged from a real answer)."""
    raw = (
        b'{"choices":[{"index":0,"text":"The quick","logprobs":{"text_offset":[0,3],'
        b'"token_logprobs":[null,-6.05],"tokens":["The"," quick"],'
        b'"top_logprobs":[null,{" quick":-6.05,"a":-5.31}]},"finish_reason":"length"}]}'
    )
    assert parse_echoes(raw, 1) == [Echoed((None, -6.05), (None, -5.31))]
