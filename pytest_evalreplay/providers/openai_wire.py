"""The openai provider's wire format: request bodies out, generations in.

Pure functions over bytes and dicts (no sockets, no threads), so the shape
of what an OpenAI-compatible server is sent and how its answers and errors
are read can be tested, and changed, apart from retries and time limits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from pytest_evalreplay.model import GenerateResult, Generation, GenerationError, Request, tool_calls_problem
from pytest_evalreplay.providers.engine_requests import (
    GREEDY_EPS,
    Draw,
    chat_messages,
    key_hint,
    plan_draws,
    text_prompt,
)
from pytest_evalreplay.values.credentials import redact_url

T = TypeVar("T")
CHAT_PATH = "/chat/completions"
TEXT_PATH = "/completions"
TOKENIZE_PATH = "/../tokenize"  # beside /v1, at the server's root (`vllm serve`)
# Body fields the provider sets itself; a task's sampling may not.
RESERVED = frozenset({"n", "model", "prompt", "messages", "stream", "echo", "best_of"})
# Statuses below 500 that are worth another attempt.
RETRY_STATUS = frozenset({408, 429})


@dataclass(frozen=True)
class CallFailure:
    """Why one HTTP attempt or call failed. `server_fault`: counts against the server's health."""

    message: str
    retryable: bool
    server_fault: bool = False


@dataclass(frozen=True)
class RetryAfter(CallFailure):
    seconds: float = 0.0


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


def plan_body(request: Request, model: str) -> tuple[str, dict[str, Any], list[Draw]]:
    """Endpoint (under the server's prefix), body without n/seed, and draws.
    ValueError on bad sampling."""
    sampling = dict(request.sampling)
    for key in sampling:
        if key in RESERVED:
            raise ValueError(f"sampling key {key!r} is set by the openai provider{key_hint(key)}")
    temperature = sampling.get("temperature")
    # Unset temperature is the server's default (1.0 for OpenAI): sampling.
    greedy = isinstance(temperature, (int, float)) and temperature < GREEDY_EPS
    draws = plan_draws(request, greedy)
    sampling.pop("seed", None)
    body: dict[str, Any] = {"model": model, **sampling}
    if isinstance(request.context, str):
        if request.tools:
            raise ValueError("tools need a chat request (a list of messages), not a text prompt")
        body["prompt"] = text_prompt(request.context, request.system_prompt)
        return TEXT_PATH, body, draws
    body["messages"] = chat_messages(request.context, request.system_prompt)
    if request.tools:  # as `vllm serve --enable-auto-tool-choice` takes them
        body["tools"] = list(request.tools)
    return CHAT_PATH, body, draws


def payload(body: Mapping[str, Any], draw: Draw) -> bytes:
    """One draw's request body: the planned body with its `n` and `seed`."""
    data = dict(body)
    if draw.n != 1:
        data["n"] = draw.n
    if draw.seed is not None:
        data["seed"] = draw.seed
    return orjson.dumps(data)


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header's seconds; None when absent or an HTTP date."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: fall back to the backoff


def server_message(raw: bytes) -> str:
    """The error text of an OpenAI-style (or FastAPI) error body, else the body."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        text = raw.decode("utf-8", "replace").strip()
        return text[:500] or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            for key in ("message", "detail"):
                if isinstance(err.get(key), str):
                    return err[key]
        if isinstance(err, str):
            return err
        if isinstance(data.get("detail"), str):
            return data["detail"]
    return orjson.dumps(data).decode()[:500]


def _count(value: Any) -> int | None:
    """A token count as a server gives it, or None when it is not one (negative,
    a float, a bool, a string): the answer is kept, only the count is dropped."""
    return value if type(value) is int and value >= 0 else None


def _choice_tokens(choice: Mapping[str, Any]) -> int | None:
    usage = choice.get("usage")
    own = _count(usage.get("completion_tokens")) if isinstance(usage, dict) else None
    return own if own is not None else _count(choice.get("completion_tokens"))


def _choice_text(
    choice: Mapping[str, Any], chat: bool
) -> tuple[str, dict[str, Any], tuple[dict[str, Any], ...]] | str:
    """A choice's answer and metadata, or what is missing. `""` is an answer
    (the model stopped at once); a missing or null one is not: saved as `""`
    it would be scored as a wrong answer instead of failing. A chat message
    with reasoning but no content is a reasoning model that spent its tokens
    thinking: its answer is `""`, the reasoning kept in the metadata."""
    if not chat:
        text = choice.get("text")
        return (text, {}, ()) if isinstance(text, str) else f"no 'text' (got {described(text)})"
    message = choice.get("message")
    message = message if isinstance(message, dict) else {}
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    metadata = {"reasoning": reasoning} if isinstance(reasoning, str) and reasoning else {}
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list) or tool_calls_problem(calls) is not None:
        return f"malformed 'message.tool_calls' ({described(calls)})"
    tool_calls = tuple({"id": c["id"], "type": "function", "function": dict(c["function"])} for c in calls)
    content = message.get("content")
    if isinstance(content, str):
        return content, metadata, tool_calls
    if content is None and (metadata or tool_calls):  # a turn that only calls tools has no content
        return "", metadata, tool_calls
    return f"no 'message.content' (got {described(content)})"


def described(value: Any) -> str:
    """A value from a server's answer, shortened, for a message."""
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {orjson.dumps(value, default=str).decode()[:60]}"


def ordered_choices(choices: Any, n: int) -> list[Mapping[str, Any]] | str:
    """The choices by index, or what is wrong: n of them, indices 0..n-1 each once."""
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        return f"'choices' is not a list of objects: {described(choices)}"
    if len(choices) != n:
        return f"the server returned {len(choices)} choices where {n} were asked for"
    indices = [c.get("index", 0 if n == 1 else None) for c in choices]
    if sorted(i for i in indices if type(i) is int) != list(range(n)):
        shown = "[" + ", ".join(repr(i) for i in indices) + "]"
        return f"the choices' indices {shown} are not 0..{n - 1} each once"
    return sorted(choices, key=lambda c: c.get("index", 0))


@dataclass(frozen=True)
class Malformed(CallFailure):
    """A 200 that holds no usable answer: worth one more attempt (a proxy or
    server glitch), final on the second (a server that answers this request
    that way every time)."""


def parse_generations(raw: bytes, n: int, chat: bool) -> list[Generation] | CallFailure:
    """Generations from a 200 body, in choice order; `Malformed` when the
    body, the choices (n of them, indices 0..n-1 each once) or an answer is
    missing or of the wrong type.

    Token counts: every choice shares the prompt, so each gets
    usage.prompt_tokens; completion tokens come per choice where the server
    gives them (a choice-level `usage` or `completion_tokens`), else
    usage.completion_tokens split evenly (rounded; exact when n is 1).
    """
    snippet = raw[:200].decode("utf-8", "replace")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or "choices" not in data:
        return Malformed(f"malformed response from the server: {snippet!r}", retryable=False)
    choices = ordered_choices(data["choices"], n)
    if isinstance(choices, str):
        return Malformed(f"malformed response from the server: {choices}", retryable=False)
    usage = data.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    prompt_tokens = _count(usage.get("prompt_tokens"))
    total = _count(usage.get("completion_tokens"))
    share = int(total / n + 0.5) if total is not None else None
    gens = []
    for c in choices:
        answer = _choice_text(c, chat)
        if isinstance(answer, str):
            where = f"choice {c.get('index', 0)}" if n > 1 else "its choice"
            return Malformed(f"the server's 200 answer holds no answer: {where} has {answer}", False)
        text, metadata, tool_calls = answer
        own = _choice_tokens(c)
        gens.append(
            Generation(
                text=text,
                finish_reason=c.get("finish_reason") if isinstance(c.get("finish_reason"), str) else None,
                prompt_tokens=prompt_tokens,
                completion_tokens=own if own is not None else share,
                metadata=metadata,
                tool_calls=tool_calls,
            )
        )
    return gens


# GET /models statuses of a server that does not implement the list (some
# OpenAI-compatible proxies): the model check is skipped, not failed.
NO_MODEL_LIST = frozenset({404, 405, 501})


@dataclass(frozen=True)
class ModelCheck:
    """One server's answer to GET /models: `problem` refuses the server,
    `note` says the check could not be done (the run goes on)."""

    problem: str | None = None
    note: str | None = None
    down: bool = False  # no answer at all: the server may come up later, unlike a wrong model


def check_model_list(url: str, prefix: str, status: int, raw: bytes, model: str) -> ModelCheck:
    """Whether the model list server `url` answered serves `model`."""
    get = f"{url}: GET {prefix}/models"
    if status in NO_MODEL_LIST:
        return ModelCheck(
            note=f"{get} answered HTTP {status} ({server_message(raw)[:100]}): the model check was skipped, "
            f"so {model!r} is not known to be served there; if that URL's path is wrong, every request "
            "fails with an HTTP 4xx naming it"
        )
    if status != 200:
        hint = " (check $EVALREPLAY_API_KEY or $OPENAI_API_KEY)" if status in (401, 403) else ""
        return ModelCheck(f"{get} answered HTTP {status}: {server_message(raw)}{hint}")
    try:
        names = [str(m["id"]) for m in orjson.loads(raw)["data"]]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return ModelCheck(f"{get} gave no model list: {raw[:200]!r}")
    if model in names:
        return ModelCheck()
    served = ", ".join(repr(n) for n in names) if names else "no model"
    return ModelCheck(f"{url}: serves {served}, not {model!r}")


# One draw's outcome: its generations, why it failed, or None (cancelled).
Outcome = list[Generation] | CallFailure | None


def sent(future: Future[tuple[Any, T]]) -> tuple[Any, T | None]:
    """A finished call's outcome and what else its worker returned (None
    when it never ran or raised); a bug in one call fails its request only."""
    if future.cancelled():
        return None, None
    exc = future.exception()
    if exc is not None:
        return CallFailure(f"openai provider: {type(exc).__name__}: {exc}", retryable=False), None
    return future.result()


def combine_draws(outcomes: list[Outcome]) -> GenerateResult:
    """A request's result from its draws, in draw order: the first failure
    (credentials in any URL hidden), or all generations."""
    gens: list[Generation] = []
    for outcome in outcomes:
        if outcome is None:
            return GenerationError("cancelled: the openai provider was closed", retryable=True)
        if isinstance(outcome, CallFailure):
            return GenerationError(redact_url(outcome.message), retryable=outcome.retryable)
        gens.extend(outcome)
    return gens


# -- loglikelihood: prompt log-probabilities echoed by /completions ----------------------


def echo_body(model: str, prompts: list[str]) -> bytes:
    """A completions body asking for each prompt's own tokens and their
    log-probabilities with the top-1 alternative, generating nothing (as
    `vllm serve` takes it: `echo` with `max_tokens` 0)."""
    body = {"model": model, "prompt": prompts, "echo": True, "logprobs": 1, "max_tokens": 0, "temperature": 0}
    return orjson.dumps(body)


def tokenize_body(model: str, prompt: str) -> bytes:
    """A `/tokenize` body: the prompt's tokens as a completions request
    tokenizes it (special tokens such as a start token included)."""
    return orjson.dumps({"model": model, "prompt": prompt, "add_special_tokens": True})


def parse_token_count(raw: bytes) -> int | CallFailure:
    """How many tokens a 200 `/tokenize` body holds (its `count`, else its
    `tokens` list); `Malformed` when it holds neither."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        count = _count(data.get("count"))
        if count is not None:
            return count
        if isinstance(data.get("tokens"), list):
            return len(data["tokens"])
    snippet = raw[:200].decode("utf-8", "replace")
    return Malformed(f"the server's 200 answer to /tokenize has no token count: {snippet!r}", retryable=False)


@dataclass(frozen=True)
class Echoed:
    """One prompt's tokens as the server echoed them: per token its
    log-probability (None for the first, which nothing precedes) and the best
    log-probability at that position (None where none was given)."""

    logprobs: tuple[float | None, ...]
    best: tuple[float | None, ...]


def parse_echoes(raw: bytes, n: int) -> list[Echoed] | CallFailure:
    """The `n` prompts' echoed tokens from a 200 body, in prompt order;
    `Malformed` when the body, the choices or their `logprobs` are missing or
    of the wrong shape."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or "choices" not in data:
        snippet = raw[:200].decode("utf-8", "replace")
        return Malformed(f"malformed response from the server: {snippet!r}", retryable=False)
    choices = ordered_choices(data["choices"], n)
    if isinstance(choices, str):
        return Malformed(f"malformed response from the server: {choices}", retryable=False)
    echoed: list[Echoed] = []
    for k, choice in enumerate(choices):
        got = _echoed(choice.get("logprobs"))
        if isinstance(got, str):
            return Malformed(f"the server's 200 answer to an echo request: prompt {k} {got}", retryable=False)
        echoed.append(got)
    return echoed


def _echoed(logprobs: Any) -> Echoed | str:
    if not isinstance(logprobs, dict):
        return f"has no 'logprobs' object (got {described(logprobs)}); does the server support echo?"
    tokens, values, tops = (logprobs.get(k) for k in ("tokens", "token_logprobs", "top_logprobs"))
    if not all(isinstance(x, list) for x in (tokens, values, tops)):
        return "has no 'tokens', 'token_logprobs' and 'top_logprobs' lists in its 'logprobs'"
    assert isinstance(tokens, list) and isinstance(values, list) and isinstance(tops, list)
    if not len(tokens) == len(values) == len(tops):
        return (
            f"has {len(tokens)} tokens, {len(values)} log-probabilities and {len(tops)} top log-probabilities"
        )
    own: list[float | None] = []
    best: list[float | None] = []
    for p, (value, top) in enumerate(zip(values, tops, strict=True)):
        if value is not None and not _finite(value):
            return f"has log-probability {described(value)} at token {p}"
        if top is not None and not (isinstance(top, dict) and top and all(_finite(v) for v in top.values())):
            return f"has top log-probabilities {described(top)} at token {p}"
        own.append(None if value is None else float(value))
        best.append(None if top is None else max(float(v) for v in top.values()))
    return Echoed(tuple(own), tuple(best))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
