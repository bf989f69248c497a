"""The openai provider's wire format: request bodies out, generations in.

Pure functions over bytes and dicts (no sockets, no threads), so the shape
of what an OpenAI-compatible server is sent and how its answers and errors
are read can be tested, and changed, apart from retries and time limits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from pytest_evalreplay.model import Generation, Request
from pytest_evalreplay.providers.engine_requests import (
    GREEDY_EPS,
    Draw,
    chat_messages,
    key_hint,
    plan_draws,
    text_prompt,
)

CHAT_PATH = "/chat/completions"
TEXT_PATH = "/completions"
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
        body["prompt"] = text_prompt(request.context, request.system_prompt)
        return TEXT_PATH, body, draws
    body["messages"] = chat_messages(request.context, request.system_prompt)
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


def _choice_tokens(choice: Mapping[str, Any]) -> int | None:
    usage = choice.get("usage")
    own = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return own if own is not None else choice.get("completion_tokens")


def parse_generations(raw: bytes, n: int, chat: bool) -> list[Generation] | CallFailure:
    """Generations from a 200 body, in choice order.

    Token counts: every choice shares the prompt, so each gets
    usage.prompt_tokens; completion tokens come per choice where the server
    gives them (a choice-level `usage` or `completion_tokens`), else
    usage.completion_tokens split evenly (rounded; exact when n is 1).
    """
    try:
        data = orjson.loads(raw)
        choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
        usage = data.get("usage") or {}
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        snippet = raw[:200].decode("utf-8", "replace")
        return CallFailure(f"malformed response from the server: {snippet!r}", retryable=False)
    if len(choices) != n:
        return CallFailure(f"the server returned {len(choices)} choices where {n} were asked for", False)
    prompt_tokens = usage.get("prompt_tokens")
    total = usage.get("completion_tokens")
    share = int(total / n + 0.5) if isinstance(total, (int, float)) else None
    gens = []
    for c in choices:
        metadata: dict[str, Any] = {}
        if chat:
            message = c.get("message") or {}
            text = message.get("content") or ""
            reasoning = message.get("reasoning_content") or message.get("reasoning")
            if reasoning:
                metadata["reasoning"] = reasoning
        else:
            text = c.get("text") or ""
        own = _choice_tokens(c)
        gens.append(
            Generation(
                text=text,
                finish_reason=c.get("finish_reason"),
                prompt_tokens=prompt_tokens if isinstance(prompt_tokens, int) else None,
                completion_tokens=own if isinstance(own, int) else share,
                metadata=metadata,
            )
        )
    return gens
