"""The openai provider: fault paths against a local stub server (stdlib only,
runs everywhere), then the real thing against vLLM's OpenAI-compatible server
running the tiny Llama in a subprocess (skips without vLLM)."""

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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
from llm_fixtures import make_request

from pytest_evalreplay.model import EvalReplayError, Generation, GenerationError, Request
from pytest_evalreplay.options import Settings
from pytest_evalreplay.providers import openai as openai_mod
from pytest_evalreplay.providers.openai import OpenAIProvider

req = make_request


def ok(result: Any) -> list[Generation]:
    assert isinstance(result, list), result
    assert all(isinstance(g, Generation) for g in result)
    return result


# -- stub server -----------------------------------------------------------------

Action = Callable[["_Handler", dict[str, Any]], None]


def answer(handler: _Handler, body: dict[str, Any]) -> None:
    """A well-formed answer: each choice echoes the prompt, seed and index."""
    n = body.get("n", 1)
    prompt = body["messages"][-1]["content"] if "messages" in body else body["prompt"]
    texts = [f"{prompt}|seed={body.get('seed')}|i={i}" for i in range(n)]
    choices = [
        {"index": i, "finish_reason": "stop", "message": {"role": "assistant", "content": t}}
        if "messages" in body
        else {"index": i, "finish_reason": "length", "text": t}
        for i, t in enumerate(texts)
    ]
    choices.reverse()  # order must come from "index", not position
    usage = {"prompt_tokens": 5, "completion_tokens": 10, "total_tokens": 15}
    handler.reply(200, {"id": "x", "choices": choices, "usage": usage})


def status(code: int, message: str = "boom", headers: dict[str, str] | None = None) -> Action:
    def act(handler: _Handler, body: dict[str, Any]) -> None:
        handler.reply(code, {"error": {"message": message, "code": code}}, headers)

    return act


def sleep_then_answer(seconds: float) -> Action:
    def act(handler: _Handler, body: dict[str, Any]) -> None:
        time.sleep(seconds)
        with contextlib.suppress(OSError):
            answer(handler, body)

    return act


def drop(handler: _Handler, body: dict[str, Any]) -> None:
    """Close the connection without a response."""
    handler.close_connection = True


class Stub:
    """A scripted OpenAI-compatible server: each POST takes the next action
    (then `answer` once the script is used up) and is recorded."""

    def __init__(self) -> None:
        self.script: list[Action] = []
        self.seen: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.delay = 0.0
        stub = self

        class Handler(_Handler):
            owner = stub

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def provider(self, **kwargs: Any) -> OpenAIProvider:
        kwargs = {"retries": 2, "backoff": 0.01, "timeout": 5.0, **kwargs}
        return OpenAIProvider(self.url, "stub-model", **kwargs)

    def bodies(self) -> list[dict[str, Any]]:
        return [body for _, _, body in self.seen]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: Stub

    def log_message(self, *args: Any) -> None:
        pass

    def reply(self, code: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = orjson.dumps(payload)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        stub = self.owner
        body = orjson.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with stub.lock:
            stub.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            action = stub.script.pop(0) if stub.script else answer
            stub.in_flight += 1
            stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
        try:
            if stub.delay:
                time.sleep(stub.delay)
            action(self, body)
        finally:
            with stub.lock:
                stub.in_flight -= 1


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stub]:
    for name in openai_mod.API_KEY_ENV:
        monkeypatch.delenv(name, raising=False)
    server = Stub()
    yield server
    server.close()


# -- settings --------------------------------------------------------------------


def test_settings_need_base_url_and_model() -> None:
    with pytest.raises(EvalReplayError, match="--evalreplay-base-url"):
        openai_mod.from_settings(Settings(provider="openai", model="m"))
    with pytest.raises(EvalReplayError, match="--evalreplay-model"):
        openai_mod.from_settings(Settings(provider="openai", base_url="http://127.0.0.1:1/v1"))
    with pytest.raises(EvalReplayError, match="http"):
        openai_mod.from_settings(Settings(provider="openai", model="m", base_url="localhost:8000"))
    p = openai_mod.from_settings(
        Settings(provider="openai", model="m", base_url="http://127.0.0.1:1", concurrency=3)
    )
    assert (p.kind, p.model, p.batch_size, p.concurrency) == ("openai", "m", None, 3)


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
    assert OpenAIProvider(url, "m")._prefix == prefix


# -- requests and responses --------------------------------------------------------


def test_text_and_chat_endpoints_and_system_prompt(stub: Stub) -> None:
    with stub.provider() as provider:
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
    by_path = {path: body for path, _, body in stub.seen}
    assert by_path["/v1/completions"]["model"] == "stub-model"
    assert by_path["/v1/chat/completions"]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    bodies = {b.get("prompt"): b for b in stub.bodies()}
    assert bodies["Be brief.\n\n2+2="] == {
        "model": "stub-model",
        "prompt": "Be brief.\n\n2+2=",
        "max_tokens": 4,
    }
    assert "n" not in bodies["plain"] and "seed" not in bodies["plain"]


def test_seed_n_and_greedy_plans(stub: Stub) -> None:
    with stub.provider() as provider:
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


def test_reserved_sampling_keys_fail_that_request_only(stub: Stub) -> None:
    with stub.provider() as provider:
        out = provider.generate([req("a", n=2), req("b", stream=True), req("c", top_k=3)])
    assert isinstance(out[0], GenerationError) and "num_samples" in out[0].message
    assert isinstance(out[1], GenerationError) and "'stream'" in out[1].message
    assert not out[0].retryable and not out[1].retryable
    assert len(ok(out[2])) == 1
    assert stub.bodies() == [{"model": "stub-model", "prompt": "c", "top_k": 3}]


def test_unsupported_requests_make_no_http_call(stub: Stub) -> None:
    with stub.provider() as provider:
        out = provider.generate(
            [Request(task="t", instance_id="a", context="x", request_type="loglikelihood")]
        )
    assert isinstance(out[0], GenerationError) and not out[0].retryable
    assert stub.seen == []


# -- faults ------------------------------------------------------------------------


def test_5xx_then_success_is_retried(stub: Stub) -> None:
    stub.script = [status(503, "overloaded"), status(500)]
    with stub.provider() as provider:
        (result,) = provider.generate([req("x")])
    assert len(ok(result)) == 1
    assert len(stub.seen) == 3


def test_persistent_5xx_is_a_retryable_error(stub: Stub) -> None:
    stub.script = [status(502, "bad gateway")] * 10
    with stub.provider(retries=2) as provider:
        (result,) = provider.generate([req("x")])
    assert isinstance(result, GenerationError) and result.retryable
    assert "HTTP 502" in result.message and "bad gateway" in result.message
    assert "3 attempts" in result.message
    assert len(stub.seen) == 3


def test_4xx_is_terminal_with_the_server_message(stub: Stub) -> None:
    msg = "This model's maximum context length is 256 tokens."
    stub.script = [status(400, msg)]
    with stub.provider() as provider:
        out = provider.generate([req("x"), req("y", iid="other")])
    errors = [r for r in out if isinstance(r, GenerationError)]
    assert len(errors) == 1 and not errors[0].retryable and msg in errors[0].message
    assert sum(isinstance(r, list) for r in out) == 1
    assert len(stub.seen) == 2  # no retry of the 400


def test_429_honours_retry_after(stub: Stub) -> None:
    stub.script = [status(429, "slow down", {"Retry-After": "0"})]
    with stub.provider(backoff=30.0) as provider:  # the header, not the backoff, sets the wait
        start = time.monotonic()
        (result,) = provider.generate([req("x")])
    assert len(ok(result)) == 1 and time.monotonic() - start < 5


def test_timeout_is_retryable(stub: Stub) -> None:
    stub.script = [sleep_then_answer(1.0)] * 2
    with stub.provider(timeout=0.2, retries=1) as provider:
        (result,) = provider.generate([req("x")])
    assert isinstance(result, GenerationError) and result.retryable
    assert "timed out" in result.message


def test_timeout_then_success(stub: Stub) -> None:
    stub.script = [sleep_then_answer(1.0)]
    with stub.provider(timeout=0.3, retries=1) as provider:
        (result,) = provider.generate([req("x")])
    assert len(ok(result)) == 1


def test_dropped_connection_is_retried(stub: Stub) -> None:
    stub.script = [drop]
    with stub.provider() as provider:
        (result,) = provider.generate([req("x")])
    assert len(ok(result)) == 1
    stub.script = [drop] * 20
    with stub.provider(retries=1) as provider:
        (result,) = provider.generate([req("x")])
    assert isinstance(result, GenerationError) and result.retryable
    assert "connection" in result.message


def test_malformed_200_is_terminal(stub: Stub) -> None:
    def garbage(handler: _Handler, body: dict[str, Any]) -> None:
        handler.reply(200, {"unexpected": True})

    stub.script = [garbage]
    with stub.provider() as provider:
        (result,) = provider.generate([req("x")])
    assert isinstance(result, GenerationError) and not result.retryable
    assert "malformed" in result.message


def test_api_key_from_env_as_bearer(stub: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    with stub.provider() as provider:
        provider.generate([req("none")])
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fallback")
    with stub.provider() as provider:
        provider.generate([req("fallback")])
    monkeypatch.setenv("EVALREPLAY_API_KEY", "sk-evalreplay")
    with stub.provider() as provider:
        provider.generate([req("preferred")])
        assert "sk-" not in repr(provider)
    auth = [headers.get("authorization") for _, headers, _ in stub.seen]
    assert auth == [None, "Bearer sk-fallback", "Bearer sk-evalreplay"]


def test_concurrency_bounds_requests_in_flight(stub: Stub) -> None:
    stub.delay = 0.1
    with stub.provider(concurrency=3) as provider:
        out = provider.generate([req(f"q{i}", iid=f"q{i}") for i in range(9)])
    assert all(len(ok(r)) == 1 for r in out)
    assert stub.max_in_flight == 3
    stub.max_in_flight = 0
    with stub.provider(concurrency=1) as provider:
        provider.generate([req(f"q{i}", iid=f"q{i}") for i in range(3)])
    assert stub.max_in_flight == 1


def test_connections_are_kept_alive(stub: Stub) -> None:
    ports = []

    def record_port(handler: _Handler, body: dict[str, Any]) -> None:
        ports.append(handler.client_address[1])
        answer(handler, body)

    stub.script = [record_port] * 4
    with stub.provider(concurrency=1) as provider:
        for i in range(4):
            provider.generate([req(f"q{i}")])
    assert len(set(ports)) == 1


def test_server_closing_a_kept_alive_connection_costs_no_retry(stub: Stub) -> None:
    def answer_then_close(handler: _Handler, body: dict[str, Any]) -> None:
        answer(handler, body)
        handler.close_connection = True  # closes without a "Connection: close" header

    stub.script = [answer_then_close]
    with stub.provider(concurrency=1, retries=0) as provider:
        assert len(ok(provider.generate([req("a")])[0])) == 1
        time.sleep(0.1)
        assert len(ok(provider.generate([req("b")])[0])) == 1


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
    with OpenAIProvider(vllm_server, SERVED_NAME, api_key="wrong", retries=0) as bad:
        (denied,) = bad.generate([req("hi", max_tokens=2)])
    assert isinstance(denied, GenerationError) and not denied.retryable and "HTTP 401" in denied.message


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
