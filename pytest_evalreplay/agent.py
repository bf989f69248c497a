"""What an agent sees: `llm.chat(...) -> Turn` and `llm.tool(call, fn)`.

An agent task's `solve(instance, llm)` runs one episode through an `LLM`
(`AsyncLLM` for `async def solve`, whose methods are awaited). Both hand each
call to an episode backend (`episodes.Episode`), which answers a model turn
from the journal, a saved run or the provider, and a tool call from the
journal or the saved run before running the tool; so this module holds the
user-facing shapes only and knows nothing of journals or providers.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from pytest_evalreplay.model import EvalReplayError, Generation, to_json


class TurnFailed(Exception):
    """A model turn failed for good (after its retries), or a limit was hit.
    Raised into the agent; the episode fails whatever the agent does with it."""


@dataclass(frozen=True)
class Turn:
    """One assistant turn: its text, its tool calls (OpenAI's shape), why it
    stopped and its token counts."""

    text: str
    tool_calls: tuple[Mapping[str, Any], ...] = ()
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    @property
    def message(self) -> dict[str, Any]:
        """The turn as the assistant message to append to the conversation."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            message["tool_calls"] = [dict(call) for call in self.tool_calls]
        return message

    @classmethod
    def of(cls, generation: Generation) -> Turn:
        return cls(
            text=generation.text,
            tool_calls=tuple(generation.tool_calls),
            finish_reason=generation.finish_reason,
            prompt_tokens=generation.prompt_tokens,
            completion_tokens=generation.completion_tokens,
        )


@dataclass
class ToolSlot:
    """One tool call of an episode: its parsed arguments, and the recorded
    result when the journal or the saved run holds it (`found`)."""

    number: int
    call: Mapping[str, Any]
    name: str
    arguments: dict[str, Any]
    found: bool = False
    result: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    """What an `LLM` needs of the episode it belongs to."""

    def chat(
        self, messages: list[dict[str, Any]], tools: list[Any], sampling: dict[str, Any]
    ) -> Generation: ...

    def tool_slot(self, call: Mapping[str, Any]) -> ToolSlot: ...

    def tool_done(self, slot: ToolSlot, result: Any) -> None: ...


def parse_call(call: Any) -> tuple[str, dict[str, Any]]:
    """A tool call's function name and arguments (a JSON object in OpenAI's shape)."""
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise EvalReplayError(
            f"llm.tool: {call!r:.80} is not a tool call; pass one of turn.tool_calls "
            '({"id", "type": "function", "function": {"name", "arguments"}})'
        )
    raw = function.get("arguments") or "{}"
    try:
        arguments = orjson.loads(raw) if isinstance(raw, (str, bytes)) else raw
    except orjson.JSONDecodeError as exc:
        raise ValueError(
            f"tool call {function['name']!r}: its arguments are not JSON ({exc}): {raw!r:.80}"
        ) from None
    if not isinstance(arguments, dict):
        raise ValueError(f"tool call {function['name']!r}: its arguments are not a JSON object: {raw!r:.80}")
    return function["name"], arguments


def _checked_messages(messages: Any, sent: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of the messages as they are sent (the agent may change its own
    later). The first ones, when equal to what the episode's last call sent
    (`sent`), are that call's copies: an agent that appends to its
    conversation copies only what it added, not all of it every turn."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise EvalReplayError(
            "llm.chat: messages must be a non-empty list of chat messages ({'role', 'content'})"
        )
    start = len(sent)
    if start and type(messages) is list and messages[:start] == sent:
        out = sent.copy()
    else:
        out, start = [], 0
    for n in range(start, len(messages)):
        message = messages[n]
        if type(message) is dict and type(message.get("role")) is str:  # the common case, without ABC checks
            out.append(message.copy())
            continue
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise EvalReplayError(
                f"llm.chat: message {n} ({message!r:.80}) is not a chat message ({{'role', ...}})"
            )
        out.append(dict(message))
    return out  # whether they are JSON shows when the turn's request is digested (episodes.py)


def _checked_tools(tools: Any) -> list[Any]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise EvalReplayError("llm.chat: tools must be a list of OpenAI tool schemas")
    return tools  # whether they are JSON shows when the turn's request is digested (episodes.py)


class LLM:
    """The model, for a plain `solve(instance, llm)`."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._sent: list[dict[str, Any]] = []  # the messages of the last call, as copied

    def chat(
        self, messages: Sequence[Mapping[str, Any]], tools: list[Any] | None = None, **sampling: Any
    ) -> Turn:
        """One assistant turn for these messages (sampling: the task's, updated by these)."""
        self._sent = checked = _checked_messages(messages, self._sent)
        return Turn.of(self._backend.chat(checked, _checked_tools(tools), sampling))

    def tool(self, call: Mapping[str, Any], fn: Callable[..., Any]) -> Any:
        """`fn(**arguments)` for this tool call, run once: resume and replay serve the recorded result."""
        slot = self._backend.tool_slot(call)
        if slot.found:
            return slot.result
        result = fn(**slot.arguments)
        self._backend.tool_done(slot, result)
        return result


class AsyncLLM:
    """The model, for an `async def solve(instance, llm)`: await its methods.
    Turns wait on a thread of `executor`, so the one event loop keeps every
    other episode going (and the provider gets their turns as one batch)."""

    def __init__(self, backend: Backend, executor: Executor) -> None:
        self._backend = backend
        self._executor = executor
        self._sent: list[dict[str, Any]] = []

    async def chat(
        self, messages: Sequence[Mapping[str, Any]], tools: list[Any] | None = None, **sampling: Any
    ) -> Turn:
        self._sent = checked = _checked_messages(messages, self._sent)
        checked_tools = _checked_tools(tools)
        loop = asyncio.get_running_loop()
        generation = await loop.run_in_executor(
            self._executor, self._backend.chat, checked, checked_tools, sampling
        )
        return Turn.of(generation)

    async def tool(self, call: Mapping[str, Any], fn: Callable[..., Any]) -> Any:
        loop = asyncio.get_running_loop()
        slot = await loop.run_in_executor(self._executor, self._backend.tool_slot, call)
        if slot.found:
            return slot.result
        result = fn(**slot.arguments)
        if inspect.isawaitable(result):
            result = await result
        await loop.run_in_executor(self._executor, self._backend.tool_done, slot, result)
        return result


def tool_message(call: Mapping[str, Any], result: Any) -> dict[str, Any]:
    """The `tool` message answering a call with its result (text as is, anything else as JSON)."""
    content = result if isinstance(result, str) else to_json(result).decode()
    return {"role": "tool", "tool_call_id": call.get("id"), "content": content}
