"""Unbounded inputs from a server and from a tool (issue 30, case 4): an
HTTP answer over `openai_watchdog.MAX_BODY_BYTES` (256 MiB) fails the
request naming the URL and the cap, read a chunk at a time, whether the
server declared its length or not; a tool result over
`episode.MAX_TOOL_RESULT_BYTES` (16 MiB as JSON) fails its item naming the
tool; an agent's request to its endpoint over `endpoint.MAX_REQUEST_BYTES`
is a 413. The caps are made small here."""

from __future__ import annotations

import gc
import warnings
from typing import Any

import orjson
import pytest
from http_stub import STUB_MODEL, Action, StubServer
from llm_fixtures import make_request

from pytest_evalreplay.model import GenerationError
from pytest_evalreplay.providers import openai_watchdog
from pytest_evalreplay.providers.openai import OpenAIProvider
from pytest_evalreplay.run import episode

CAP = 1000


class Huge(Action):
    """A 200 answer of about 4 times the cap, with or without a Content-Length."""

    name = "huge"

    def __init__(self, declared: bool) -> None:
        self.declared = declared

    def __call__(self, handler: Any, body: dict[str, Any]) -> None:
        text = "x" * (4 * CAP)
        data = orjson.dumps({"choices": [{"index": 0, "text": text, "finish_reason": "stop"}]})
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        if self.declared:
            handler.send_header("Content-Length", str(len(data)))
        else:
            handler.send_header("Connection", "close")  # the body ends where the connection does
        handler.end_headers()
        handler.wfile.write(data)
        handler.wfile.flush()
        handler.close_connection = True


@pytest.mark.parametrize("declared", [True, False])
def test_a_server_answer_over_the_cap_fails_naming_the_url_and_the_cap(
    stub: StubServer, monkeypatch: pytest.MonkeyPatch, declared: bool
) -> None:
    monkeypatch.setattr(openai_watchdog, "MAX_BODY_BYTES", CAP)
    monkeypatch.setattr(openai_watchdog, "BODY_CHUNK", 256)
    stub.default = Huge(declared)
    with OpenAIProvider(stub.url, STUB_MODEL, retries=2, backoff=0.01) as provider:
        (error,) = provider.generate([make_request("x")])
    assert isinstance(error, GenerationError) and not error.retryable
    assert f"the answer from {stub.url}/completions is over {CAP:,} bytes" in error.message
    assert "attempts" not in error.message  # final: asking again would fetch as much again
    with warnings.catch_warnings(record=True) as seen:  # the refused answer's socket is closed
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    assert not [w for w in seen if issubclass(w.category, ResourceWarning)]


def test_an_answer_under_the_cap_is_read_whole(stub: StubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_watchdog, "BODY_CHUNK", 7)  # many chunks
    with OpenAIProvider(stub.url, STUB_MODEL, retries=0) as provider:
        (gens,) = provider.generate([make_request("x")])
    assert not isinstance(gens, GenerationError) and gens[0].text.startswith("x|")


AGENT_PROJECT = """
from pytest_evalreplay import EvalTask, Generation

class Quiet:
    kind, model = "quiet", "quiet-1"

    def generate(self, requests):
        return [[Generation(text="ok") for _ in r.rollouts] for r in requests]

def pytest_evalreplay_make_provider(config, kind):
    return Quiet() if kind == "quiet" else None
"""

AGENT_EVALS = """
from pytest_evalreplay import EvalTask

def agent(instance, llm):
    call = {"id": "c1", "type": "function", "function": {"name": "fetch", "arguments": "{}"}}
    return str(len(llm.tool(call, lambda: "x" * instance["size"])))

t = EvalTask("t", [{"id": "small", "size": 10}, {"id": "big", "size": 200}], agent=agent,
             scorer=lambda text, instance: 1.0)
"""


def test_a_tool_result_over_the_cap_fails_its_item_naming_the_tool(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(episode, "MAX_TOOL_RESULT_BYTES", 100, raising=False)
    pytester.makeconftest(AGENT_PROJECT)
    pytester.makepyfile(test_evals=AGENT_EVALS)
    result = pytester.runpytest("--evalreplay-provider=quiet", "--evalreplay-output=run")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*t big*: tool 'fetch' returned 202 bytes of JSON, over the 100 a tool result may hold*"]
    )
    turns = (pytester.path / "run" / "t-turns-journal.jsonl").read_bytes()
    assert b"x" * 200 not in turns


def test_an_agent_request_over_the_cap_is_a_413_naming_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    import http.client
    from urllib.parse import urlsplit

    from pytest_evalreplay.run import endpoint as endpoint_mod

    monkeypatch.setattr(endpoint_mod, "MAX_REQUEST_BYTES", CAP, raising=False)
    endpoint = endpoint_mod.Endpoint("m")
    try:
        url = urlsplit(endpoint.open(object()))  # type: ignore[arg-type]
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
        body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * CAP}]})
        headers = {"Authorization": f"Bearer {endpoint.token}", "Content-Type": "application/json"}
        conn.request("POST", f"{url.path}/chat/completions", body=body, headers=headers)
        answer = conn.getresponse()
        assert answer.status == 413
        message = orjson.loads(answer.read())["error"]["message"]
        assert message.startswith(f"a request body of {len(body):,} bytes, over the {CAP:,}")
        conn.close()
    finally:
        endpoint.stop()
