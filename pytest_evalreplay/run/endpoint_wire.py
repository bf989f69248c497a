"""The OpenAI wire formats the endpoint speaks, to and from a model turn.

Pure functions over plain data: a chat-completions or responses body becomes
what `llm.chat` takes (messages, tools, sampling), and a `Generation` becomes
the response body or the server-sent events the openai SDK reads. A body
the endpoint cannot serve raises `WireError` naming the field, which the
server answers as an OpenAI-shaped HTTP 400.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from pytest_evalreplay.model import Generation

# Fields passed on to the provider as the turn's sampling (part of what is journaled and matched).
CHAT_SAMPLING = frozenset(
    {
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "logit_bias",
        "reasoning_effort",
        "top_k",
        "min_p",
        "repetition_penalty",
    }
)
# Fields that say nothing to the model: accepted and left out of the turn.
CHAT_IGNORED = frozenset({"model", "user", "metadata", "store", "stream", "stream_options", "service_tier"})
RESPONSES_IGNORED = frozenset(
    {
        "model",
        "user",
        "metadata",
        "store",
        "stream",
        "include",
        "truncation",
        "service_tier",
        "prompt_cache_key",
    }
)
# Responses fields and the chat sampling key each becomes.
RESPONSES_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "max_output_tokens": "max_tokens",
    "parallel_tool_calls": "parallel_tool_calls",
    "top_logprobs": None,  # accepted only when null
}


class WireError(ValueError):
    """A body the endpoint cannot serve: `param` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Turn:
    """One model turn as `llm.chat` takes it, and how to answer it."""

    messages: list[dict[str, Any]]
    tools: list[Any]
    sampling: dict[str, Any]
    stream: bool
    model: str
    usage_in_stream: bool = False


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error") -> bytes:
    """An OpenAI-shaped error body (the SDKs raise it as an APIStatusError with this message)."""
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": None}})


def _body(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise WireError("body", f"the request body is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise WireError("body", "the request body must be a JSON object")
    return body


def _stream(body: Mapping[str, Any]) -> bool:
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise WireError("stream", f"stream must be true or false, not {stream!r:.40}")
    return stream


def chat_turn(raw: bytes) -> Turn:
    """A `POST /v1/chat/completions` body as a turn."""
    body = _body(raw)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise WireError("messages", "messages must be a non-empty list of chat messages")
    for n, message in enumerate(messages):
        if "audio" in message or message.get("role") not in {
            "system",
            "developer",
            "user",
            "assistant",
            "tool",
        }:
            raise WireError(f"messages[{n}]", f"message {n} is not a text chat message this endpoint serves")
    sampling: dict[str, Any] = {}
    for key, value in body.items():
        if key in CHAT_SAMPLING:
            if value is not None:
                sampling[key] = value
        elif key == "n":
            if value not in (None, 1):
                raise WireError("n", f"n={value!r:.20} is not served: an agent turn is one sample (n=1)")
        elif key in ("logprobs", "top_logprobs", "modalities", "audio", "prediction"):
            if value not in (None, False, ["text"]):
                raise WireError(key, f"{key!r} is not served by the evalreplay endpoint")
        elif key not in CHAT_IGNORED and key not in ("messages", "tools"):
            raise WireError(key, f"the field {key!r} is not served by the evalreplay endpoint")
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and t.get("type") == "function" for t in tools
    ):
        raise WireError("tools", "tools must be a list of function tools")
    options = body.get("stream_options")
    usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return Turn(messages, tools, sampling, _stream(body), str(body.get("model") or ""), usage)


def _usage(gen: Generation) -> dict[str, int]:
    p, c = gen.prompt_tokens or 0, gen.completion_tokens or 0
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _calls(gen: Generation) -> list[dict[str, Any]]:
    return [dict(call) for call in gen.tool_calls]


def chat_completion(gen: Generation, turn: Turn, ident: str, created: int) -> bytes:
    """The `chat.completion` body answering a turn."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": gen.text if gen.text or not gen.tool_calls else None,
    }
    if gen.tool_calls:
        message["tool_calls"] = _calls(gen)
    choice = {"index": 0, "message": message, "finish_reason": _finish(gen), "logprobs": None}
    return orjson.dumps(
        {
            "id": f"chatcmpl-{ident}",
            "object": "chat.completion",
            "created": created,
            "model": turn.model,
            "choices": [choice],
            "usage": _usage(gen),
        }
    )


def _finish(gen: Generation) -> str:
    if gen.finish_reason:
        return gen.finish_reason
    return "tool_calls" if gen.tool_calls else "stop"


def chat_events(gen: Generation, turn: Turn, ident: str, created: int) -> Iterator[bytes]:
    """The server-sent events of a streamed `chat.completion.chunk` answer (the whole turn is known)."""
    head = {
        "id": f"chatcmpl-{ident}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": turn.model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"

    yield chunk({"role": "assistant", "content": gen.text if gen.text or not gen.tool_calls else None})
    if gen.tool_calls:
        yield chunk({"tool_calls": [{"index": i, **call} for i, call in enumerate(_calls(gen))]})
    yield chunk({}, _finish(gen))
    if turn.usage_in_stream:
        yield b"data: " + orjson.dumps({**head, "choices": [], "usage": _usage(gen)}) + b"\n\n"
    yield b"data: [DONE]\n\n"


# -- the Responses API ---------------------------------------------------------------------


def _text_of(content: Any, where: str) -> str:
    """A message's content parts as one text (input_text / output_text / text parts only)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise WireError(where, "content must be a string or a list of text parts")
    out = []
    for n, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in {"input_text", "output_text", "text"}:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise WireError(f"{where}[{n}]", f"content part {kind!r} is not served (text parts only)")
        out.append(str(part.get("text") or ""))
    return "".join(out)


def _input_messages(items: Any) -> list[dict[str, Any]]:
    """The Responses `input` items as chat messages: function calls join the
    assistant message before them, their outputs are `tool` messages."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise WireError("input", "input must be a string or a list of input items")
    messages: list[dict[str, Any]] = []
    for n, item in enumerate(items):
        where = f"input[{n}]"
        if not isinstance(item, dict):
            raise WireError(where, "an input item must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in {"system", "developer", "user", "assistant"}:
                raise WireError(f"{where}.role", f"role {role!r:.20} is not served")
            messages.append({"role": role, "content": _text_of(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or ""},
            }
            last = messages[-1] if messages else None
            if (
                last is not None
                and last["role"] == "assistant"
                and not isinstance(last.get("tool_calls"), str)
            ):
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text_of(output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind != "reasoning":  # a reasoning item says nothing a chat model reads
            raise WireError(f"{where}.type", f"input item type {kind!r:.40} is not served")
    return messages


def _function_tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise WireError("tools", "tools must be a list")
    out = []
    for n, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise WireError(f"tools[{n}]", f"tool type {kind!r:.40} is not served (function tools only)")
        function = {
            k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None
        }
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if choice in ("auto", "none", "required"):
        return choice
    raise WireError("tool_choice", f"tool_choice {choice!r:.40} is not served")


def responses_turn(raw: bytes) -> Turn:
    """A `POST /v1/responses` body as a turn."""
    body = _body(raw)
    messages = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise WireError("instructions", "instructions must be a string")
        messages.append({"role": "system", "content": instructions})
    messages += _input_messages(body.get("input"))
    if not messages:
        raise WireError("input", "the request has no input")
    sampling: dict[str, Any] = {}
    for key, value in body.items():
        if key in ("input", "instructions", "tools") or key in RESPONSES_IGNORED:
            continue
        if value is None:
            continue
        if key == "tool_choice":
            sampling["tool_choice"] = _tool_choice(value)
        elif key == "text":
            fmt = value.get("format") if isinstance(value, dict) else None
            if fmt not in (None, {"type": "text"}):
                raise WireError("text.format", "only plain text output is served")
        elif key == "reasoning":
            if value not in ({}, {"effort": None, "summary": None}) and any(value.values()):
                raise WireError("reasoning", "reasoning settings are not served")
        elif RESPONSES_SAMPLING.get(key) is not None:
            sampling[RESPONSES_SAMPLING[key]] = value
        else:
            raise WireError(key, f"the field {key!r} is not served by the evalreplay endpoint")
    return Turn(
        messages, _function_tools(body.get("tools")), sampling, _stream(body), str(body.get("model") or "")
    )


def _output(gen: Generation, ident: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if gen.text or not gen.tool_calls:
        part = {"type": "output_text", "text": gen.text, "annotations": [], "logprobs": []}
        items.append(
            {
                "type": "message",
                "id": f"msg_{ident}",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        )
    for n, call in enumerate(gen.tool_calls):
        function = call.get("function") or {}
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{ident}_{n}",
                "call_id": call.get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments") or "",
                "status": "completed",
            }
        )
    return items


def _response(gen: Generation | None, turn: Turn, ident: str, created: int) -> dict[str, Any]:
    p, c = (0, 0) if gen is None else (gen.prompt_tokens or 0, gen.completion_tokens or 0)
    return {
        "id": f"resp_{ident}",
        "object": "response",
        "created_at": created,
        "status": "in_progress" if gen is None else "completed",
        "model": turn.model,
        "output": [] if gen is None else _output(gen, ident),
        "parallel_tool_calls": bool(turn.sampling.get("parallel_tool_calls", True)),
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "usage": None
        if gen is None
        else {
            "input_tokens": p,
            "output_tokens": c,
            "total_tokens": p + c,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def response(gen: Generation, turn: Turn, ident: str, created: int) -> bytes:
    """The `response` body answering a turn."""
    return orjson.dumps(_response(gen, turn, ident, created))


def response_events(gen: Generation, turn: Turn, ident: str, created: int) -> Iterator[bytes]:
    """The server-sent events of a streamed Responses answer, in the order the SDK expects."""
    seq = iter(range(1_000_000))

    def event(kind: str, **data: Any) -> bytes:
        payload = orjson.dumps({"type": kind, "sequence_number": next(seq), **data})
        return b"event: " + kind.encode() + b"\ndata: " + payload + b"\n\n"

    yield event("response.created", response=_response(None, turn, ident, created))
    yield event("response.in_progress", response=_response(None, turn, ident, created))
    for index, item in enumerate(_output(gen, ident)):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            yield event("response.output_item.added", output_index=index, item={**item, "content": []})
            empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            at = {"item_id": item["id"], "output_index": index, "content_index": 0}
            yield event("response.content_part.added", **at, part=empty)
            yield event("response.output_text.delta", **at, delta=text, logprobs=[])
            yield event("response.output_text.done", **at, text=text, logprobs=[])
            yield event("response.content_part.done", **at, part=item["content"][0])
        else:
            yield event("response.output_item.added", output_index=index, item={**item, "arguments": ""})
            at = {"item_id": item["id"], "output_index": index}
            yield event("response.function_call_arguments.delta", **at, delta=item["arguments"])
            yield event("response.function_call_arguments.done", **at, arguments=item["arguments"])
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=_response(gen, turn, ident, created))


def models_body(model: str) -> bytes:
    """`GET /v1/models`: the one model an episode talks to."""
    return orjson.dumps(
        {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "evalreplay"}]}
    )
