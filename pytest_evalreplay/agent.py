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
import contextlib
import inspect
import os
import shlex
import signal
import subprocess
import threading
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

    def endpoint(self) -> tuple[str, str]:
        """This episode's OpenAI-compatible base URL (ending in /v1) and its API key."""
        ...


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

    @property
    def base_url(self) -> str:
        """This episode's OpenAI-compatible endpoint (ends in /v1): every request to it is one
        model turn of this episode, exactly as `chat` would ask it."""
        return self._backend.endpoint()[0]

    @property
    def api_key(self) -> str:
        """The key the endpoint requires (a token of this session)."""
        return self._backend.endpoint()[1]

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

    @property
    def base_url(self) -> str:
        """This episode's OpenAI-compatible endpoint (ends in /v1): every request to it is one
        model turn of this episode, exactly as `chat` would ask it."""
        return self._backend.endpoint()[0]

    @property
    def api_key(self) -> str:
        """The key the endpoint requires (a token of this session)."""
        return self._backend.endpoint()[1]

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


STDERR_LINES = 20  # of a failed program's standard error, in the item's failure


@dataclass(frozen=True, eq=False)
class Command:
    """An agent that is a program (`command([...])`): run once per episode
    with `OPENAI_BASE_URL` / `OPENAI_API_KEY` set to the episode's endpoint
    and the instance as JSON on standard input; its standard output, stripped,
    is the answer. Its process group is killed when the session stops."""

    argv: tuple[str, ...]
    timeout: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    _running: set[subprocess.Popen[bytes]] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __call__(self, instance: Mapping[str, Any], llm: LLM) -> str:
        name = shlex.join(self.argv)
        try:
            data = to_json(instance)
        except TypeError as exc:
            raise EvalReplayError(
                f"command {name}: the instance is not JSON ({exc}); it goes on stdin"
            ) from None
        env = {**os.environ, **self.env, "OPENAI_BASE_URL": llm.base_url, "OPENAI_API_KEY": llm.api_key}
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=self.cwd,
                start_new_session=True,  # its own process group, killed as one
            )
        except OSError as exc:
            raise EvalReplayError(f"command {name}: cannot start it ({exc})") from None
        with self._lock:
            self._running.add(proc)
        try:
            try:
                out, err = proc.communicate(data, timeout=self.timeout)
            except subprocess.TimeoutExpired:
                _kill(proc)
                out, err = proc.communicate()
                raise EvalReplayError(
                    f"command {name}: no answer within timeout={self.timeout:g}s (killed){_tail(err)}"
                ) from None
        finally:
            _kill(proc)  # what it left running in its group goes with it
            with self._lock:
                self._running.discard(proc)
        if proc.returncode != 0:
            raise EvalReplayError(f"command {name}: exited with status {proc.returncode}{_tail(err)}")
        return out.decode("utf-8", "replace").strip()

    def stop(self) -> None:
        """Kill every episode's program still running (the session stops)."""
        with self._lock:
            running = list(self._running)
        for proc in running:
            _kill(proc)


def command(
    argv: Sequence[str],
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> Command:
    """An agent that runs `argv` per episode (see `Command`)."""
    if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
        raise EvalReplayError(
            f'command(...) takes a list of strings such as ["python", "my_agent.py"], not {argv!r:.60}'
        )
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise EvalReplayError(
            f"command(...): timeout must be a positive number of seconds, not {timeout!r:.40}"
        )
    return Command(tuple(argv), timeout, dict(env or {}), cwd)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)


def _tail(err: bytes | None) -> str:
    lines = (err or b"").decode("utf-8", "replace").rstrip().splitlines()[-STDERR_LINES:]
    return "; its last stderr lines:\n" + "\n".join(lines) if lines else " (no stderr)"
