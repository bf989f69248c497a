"""One agent episode: the backend of its `llm`, and of its endpoint URL.

Each model turn is matched to the turns journal (`--resume`) or the saved
run (replay) by what it sent and its occurrence among equal requests of the
episode, never by when it arrived, so an agent's concurrent calls resume and
replay exactly; a turn neither answers goes to the task's `TurnBatcher`.
A tool call (`llm.tool`) is matched by its number and the turn before it;
from the first the journal does not answer the episode runs its tools live.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from pytest_evalreplay.agent import ToolSlot, TurnFailed, parse_call
from pytest_evalreplay.journal import transcripts
from pytest_evalreplay.journal.recorder import TaskRecorder
from pytest_evalreplay.journal.rows import Failure, RolloutKey
from pytest_evalreplay.model import (
    EvalReplayError,
    Generation,
    HashedMessages,
    Request,
    chat_digest,
    content_tail,
    digest,
    request_content,
    to_json,
)
from pytest_evalreplay.numbers.sources import Answer, Source
from pytest_evalreplay.run.context import ProviderExit
from pytest_evalreplay.run.turnbatcher import TurnBatcher
from pytest_evalreplay.task import EvalTask, validate_sampling
from pytest_evalreplay.values.credentials import configured_secrets, redact

if TYPE_CHECKING:  # the endpoint (http.server) is imported only when an agent asks for it
    from pytest_evalreplay.run.endpoint import Endpoint

TOOL_IDENTITY = {"kind": "tool"}
TOOL_PV = digest(TOOL_IDENTITY)
# The most a tool result may be as JSON: it is saved with the run and sent to
# the model, and a larger one (a whole file, a runaway loop) fails its item.
MAX_TOOL_RESULT_BYTES = 16 * 2**20


class Runner(Protocol):
    """What an episode needs of its task's runner (`episodes.EpisodeRunner`)."""

    task: EvalTask
    turns: TaskRecorder
    saved: transcripts.SavedEpisodes | None
    pv: str
    batcher: TurnBatcher
    asked: dict[str, tuple[str, dict[str, Any], str]]

    def source(self, key: RolloutKey, rq: str, pv: str) -> tuple[Answer, Generation | None]: ...

    def record_tool(self, key: RolloutKey, rq: str, slot: ToolSlot, text: str) -> None: ...

    def endpoint(self) -> Endpoint: ...


@dataclass
class Episode:
    """One rollout's episode: the backend of its `LLM`, and its transcript."""

    runner: Runner
    key: RolloutKey
    live: bool = False
    turns: list[dict[str, Any]] = field(default_factory=list)
    tool_results: list[dict[str, Any]] = field(default_factory=list)
    failure: tuple[str, str] | None = None  # (failure class, message): the episode fails
    exit: ProviderExit | None = None  # the session stops (raised into an endpoint turn)
    base_url: str | None = None  # its endpoint's, once the agent asked
    started: int = 0  # turns asked so far (the number of the next is one more)
    seen: dict[str, int] = field(default_factory=dict)  # per request digest, how often it was asked
    lock: threading.Lock = field(default_factory=threading.Lock)
    _last_turn: str | None = None  # digest of the last turn's request
    _hashed: HashedMessages | None = None  # the messages the last turn digested (`chat_digest`)
    _last_tail: tuple[dict[str, Any], bytes] | None = None  # its fields but the messages, as JSON
    spent: int = 0  # prompt and completion tokens of every turn so far (a count left out: 0)

    @property
    def name(self) -> str:
        return f"episode {self.key[1]!r} rollout {self.key[2]}"

    def fail(self, message: str, failure_class: str = "terminal") -> TurnFailed:
        if self.failure is None:
            self.failure = (failure_class, message)
        return TurnFailed(message)

    def chat(self, messages: list[dict[str, Any]], tools: list[Any], sampling: dict[str, Any]) -> Generation:
        runner = self.runner
        if self.failure is not None:
            raise TurnFailed(self.failure[1])
        # Most turns pass no sampling of their own: the task's, without walking an empty dict.
        asked = (
            {**runner.task.sampling, **validate_sampling(sampling, "llm.chat")}
            if sampling
            else dict(runner.task.sampling)
        )
        limit = runner.task.max_turns
        with self.lock:  # an agent may make concurrent calls (the endpoint serves each on its thread)
            self.started += 1
            number = self.started
        if limit is not None and number > limit:
            raise self.fail(f"{self.name}: the agent asked for turn {number}, past max_turns={limit}")
        stage, iid, rollout = self.key
        request = Request(
            task=runner.turns.task,
            instance_id=f"{iid}|r{rollout}|t{number}",
            context=messages,
            sampling=asked,
            tools=tuple(tools),
            stage=stage,
            rollouts=(0,),
        )
        content = request_content(request)
        try:
            tail = self._tail(content)
            rq, hashed = chat_digest(messages, tail, self._hashed)  # the new messages' one serialization
        except TypeError as exc:
            raise EvalReplayError(_not_json(exc, tools)) from None
        with self.lock:
            self._hashed = hashed
            occurrence = self.seen.get(rq, 0)
            self.seen[rq] = occurrence + 1
        # A turn is matched by what was sent and its occurrence among equal requests of the
        # episode, not by its arrival: concurrent calls resume and replay as exactly as sequential ones.
        journal_id = f"{iid}|r{rollout}|{rq}" + (f".{occurrence}" if occurrence else "")
        answer: Generation | Failure | str | None = None
        found, answer = runner.source((stage, journal_id, 0), rq, runner.pv)
        if found.source is Source.FAILED and found.fail is not None:
            answer = found.fail.failure
        elif found.source is Source.SAVED and runner.saved is not None:
            now = transcripts.sent(messages, tools, asked)
            answer = runner.saved.turn(self.key, number, now, occurrence)
        if answer is None:
            self.live = True
            with self.lock:
                row = self._row_content(content)
            runner.asked[request.instance_id] = (rq, row, journal_id)  # for the batch's rows
            answer = runner.batcher.ask(request)
        if isinstance(answer, str):
            raise self.fail(answer)
        if isinstance(answer, Failure):
            raise self.fail(f"{self.name}, turn {number}: {answer.message}", answer.failure_class)
        with self.lock:
            self._last_turn = rq
            self.turns.append(
                {
                    "turn": number,
                    "messages": messages,
                    "tools": tools,
                    "sampling": asked,
                    "reply": _reply(answer),
                    "finish_reason": answer.finish_reason,
                    "prompt_tokens": answer.prompt_tokens,
                    "completion_tokens": answer.completion_tokens,
                }
            )
            self.spent += (answer.prompt_tokens or 0) + (answer.completion_tokens or 0)
            spent = self.spent
        budget = runner.task.max_tokens_per_episode
        if budget is not None and spent > budget:
            raise self.fail(
                f"{self.name}, turn {number}: {spent} tokens so far, past max_tokens_per_episode={budget}"
            )
        return answer

    def serve(self, messages: list[dict[str, Any]], tools: list[Any], sampling: dict[str, Any]) -> Generation:
        """A turn the endpoint received (`run/endpoint.py`): `chat`'s, with what
        `llm.chat` would raise into the agent kept for the episode's end, since
        the agent sees only an HTTP error."""
        try:
            return self.chat(messages, tools, sampling)
        except ProviderExit as exc:
            self.exit = exc
            raise TurnFailed(str(exc)) from None
        except EvalReplayError as exc:
            raise self.fail(f"{self.name}: {exc}") from None

    def endpoint(self) -> tuple[str, str]:
        if self.base_url is None:
            self.base_url = self.runner.endpoint().open(self)
        return self.base_url, self.runner.endpoint().token

    def _tail(self, content: dict[str, Any]) -> bytes:
        """The turn's `content_tail`, the last turn's when its fields (tools,
        sampling) are equal: those were checked for NaN then, and values equal
        to them hold none (NaN equals nothing)."""
        rest = {k: v for k, v in content.items() if k != "context"}
        last = self._last_tail
        if last is not None and last[0] == rest:
            return last[1]
        tail = content_tail(content)
        self._last_tail = (rest, tail)
        return tail

    def _row_content(self, content: dict[str, Any]) -> dict[str, Any]:
        """What the turn's request row holds (`content`, the request's,
        changed in place): the messages added since the turn before (`after`:
        that turn's digest) when it sent those first, so the journal grows
        with the conversation and not with its square; the digest stays over
        the whole request."""
        prev = self.turns[-1]["messages"] if self.turns else None
        messages = content["context"]
        if prev is not None and messages[: len(prev)] == prev:
            del content["context"]
            content["after"], content["added"] = self._last_turn, messages[len(prev) :]
        return content

    def tool_slot(self, call: Mapping[str, Any]) -> ToolSlot:
        if self.failure is not None:
            raise TurnFailed(self.failure[1])
        name, arguments = parse_call(call)
        slot = ToolSlot(len(self.tool_results) + 1, dict(call), name, arguments)
        runner = self.runner
        if not self.live:  # no failure is journaled for a tool: its answer is recorded, saved or live
            found, recorded = runner.source(self._tool_key(slot), self._tool_digest(slot), TOOL_PV)
            if recorded is not None:
                slot.found, slot.result = True, orjson.loads(recorded.text)
            elif found.source is Source.SAVED and runner.saved is not None:
                saved, result, why = runner.saved.tool(self.key, slot.number, slot.call)
                if not saved:
                    raise self.fail(why)
                slot.found, slot.result = True, result
        if not slot.found:
            self.live = True
        else:
            self._keep(slot, slot.result)
        return slot

    def tool_done(self, slot: ToolSlot, result: Any) -> None:
        try:
            data = to_json(result)
        except TypeError as exc:
            raise self.fail(
                f"{self.name}: tool {slot.name!r} returned {type(result).__name__}, not JSON ({exc}); "
                "return JSON values (its result is saved with the run)"
            ) from None
        if len(data) > MAX_TOOL_RESULT_BYTES:
            raise self.fail(
                f"{self.name}: tool {slot.name!r} returned {len(data):,} bytes of JSON, over the "
                f"{MAX_TOOL_RESULT_BYTES:,} a tool result may hold (it is saved with the run and sent "
                "to the model); return less (a part, a summary, a path)"
            )
        text = data.decode()
        self._keep(slot, result)
        self.runner.record_tool(self._tool_key(slot), self._tool_digest(slot), slot, text)

    def _keep(self, slot: ToolSlot, result: Any) -> None:
        self.tool_results.append({"turn": len(self.turns), "call": slot.call, "result": result})

    def _tool_key(self, slot: ToolSlot) -> RolloutKey:
        return (self.key[0], f"{self.key[1]}|r{self.key[2]}|c{slot.number}", 0)

    def _tool_digest(self, slot: ToolSlot) -> str:
        return digest({"request_type": "tool", "after": self._last_turn, "call": slot.call})

    def transcript(self, answer: str | None) -> dict[str, Any]:
        last = self.turns[-1] if self.turns else None
        messages = [*last["messages"], last["reply"]] if last is not None else []
        return {
            "instance_id": self.key[1],
            "stage": self.key[0],
            "rollout": self.key[2],
            "answer": answer,
            "error": None
            if self.failure is None
            else redact(self.failure[1], configured_secrets(os.environ)),
            "turns": [transcripts.compact_turn(turn, messages) for turn in self.turns],
            "tool_results": self.tool_results,
            "messages": messages,
        }

    def final(self, answer: str) -> Generation:
        return Generation(
            text=answer,
            finish_reason=self.turns[-1]["finish_reason"] if self.turns else None,
            prompt_tokens=sum(t["prompt_tokens"] or 0 for t in self.turns),
            completion_tokens=sum(t["completion_tokens"] or 0 for t in self.turns),
            metadata={"turns": len(self.turns), "tool_calls": len(self.tool_results)},
        )


def _not_json(exc: TypeError, tools: list[Any]) -> str:
    """Which part of a turn's request is not JSON (its sampling was checked before)."""
    try:
        to_json(tools)
    except TypeError as bad:
        return f"llm.chat: tools are not JSON ({bad}); give OpenAI tool schemas"
    return f"llm.chat: the messages are not JSON ({exc}); they are saved with the run"


def _reply(generation: Generation) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": generation.text}
    if generation.tool_calls:
        message["tool_calls"] = [dict(c) for c in generation.tool_calls]
    return message
