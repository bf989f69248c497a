"""Running an agent task's episodes: concurrently, journaled turn by turn.

`--evalreplay-concurrency` episodes run at a time (threads for a plain
`solve`, one event loop for an `async def` one). Their model turns meet in a
`TurnBatcher`, which hands the provider one batch of every turn waiting
(through `generation.stream_into_journal`, so retries, the per-turn timeout
and the journal rows are the ones every generation gets). Every model turn
and every tool result is a row of `<task>-turns-journal.jsonl` the moment it
exists, keyed by episode, turn and the digest of what was sent; under
`--resume` an episode re-runs its agent, each call that matches its
recorded row is answered from there (a tool's result without running the
tool), and from the first that does not the episode is live. A replay
(`--evalreplay-predictions`) answers turns and tools from the saved run's
transcripts instead. The final answer is the rollout's `gen` row in the
task's journal; a failed episode, its `fail` row; either way the transcript
so far is kept for the run dir.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson

from pytest_evalreplay.agent import LLM, AsyncLLM, ToolSlot, TurnFailed, parse_call
from pytest_evalreplay.journal import transcripts
from pytest_evalreplay.journal.recorder import TaskRecorder
from pytest_evalreplay.journal.rows import Failure, RolloutKey
from pytest_evalreplay.model import EvalReplayError, Generation, Request, digest, request_content, to_json
from pytest_evalreplay.numbers.planning import TaskPlan
from pytest_evalreplay.numbers.sources import Answer, Mode, Source, answer_source
from pytest_evalreplay.run.context import ProgressSink, ProviderExit, RunContext
from pytest_evalreplay.run.generation import stream_into_journal
from pytest_evalreplay.run.turnbatcher import TurnBatcher
from pytest_evalreplay.storage.runschema import TURNS_SUFFIX
from pytest_evalreplay.task import EvalTask, validate_sampling

TOOL_IDENTITY = {"kind": "tool"}
TOOL_PV = digest(TOOL_IDENTITY)


def turns_name(task: str) -> str:
    return task + TURNS_SUFFIX


def episode_key(key: RolloutKey) -> RolloutKey:
    """Where an episode's transcript row sits in the turns journal."""
    return (key[0], f"{key[1]}|r{key[2]}|episode", 0)


@dataclass
class Episode:
    """One rollout's episode: the backend of its `LLM`, and its transcript."""

    runner: EpisodeRunner
    key: RolloutKey
    live: bool = False
    turns: list[dict[str, Any]] = field(default_factory=list)
    tool_results: list[dict[str, Any]] = field(default_factory=list)
    failure: tuple[str, str] | None = None  # (failure class, message): the episode fails
    _last_turn: str | None = None  # digest of the last turn's request

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
        number = len(self.turns) + 1
        limit = runner.task.max_turns
        if limit is not None and number > limit:
            raise self.fail(f"{self.name}: the agent asked for turn {number}, past max_turns={limit}")
        asked = {**runner.task.sampling, **validate_sampling(sampling, "llm.chat")}
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
            rq = digest(content)  # the one serialization of what is sent, per turn
        except TypeError as exc:
            raise EvalReplayError(_not_json(exc, tools)) from None
        answer: Generation | Failure | str | None = None
        if not self.live:  # from the first call the journal does not answer, the episode is live
            found, answer = runner.source((stage, request.instance_id, 0), rq, runner.pv)
            if found.source is Source.FAILED and found.fail is not None:
                answer = found.fail.failure
            elif found.source is Source.SAVED and runner.saved is not None:
                answer = runner.saved.turn(self.key, number, transcripts.sent(messages, tools, asked))
        if answer is None:
            self.live = True
            runner.asked[request.instance_id] = (rq, self._row_content(content))  # for the batch's rows
            answer = runner.batcher.ask(request)
        if isinstance(answer, str):
            raise self.fail(answer)
        if isinstance(answer, Failure):
            raise self.fail(f"{self.name}, turn {number}: {answer.message}", answer.failure_class)
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
        budget = runner.task.max_tokens_per_episode
        if budget is not None and (spent := self.tokens()) > budget:
            raise self.fail(
                f"{self.name}, turn {number}: {spent} tokens so far, past max_tokens_per_episode={budget}"
            )
        return answer

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

    def tokens(self) -> int:
        """Prompt and completion tokens of every turn so far (a count the provider left out: 0)."""
        return sum((t["prompt_tokens"] or 0) + (t["completion_tokens"] or 0) for t in self.turns)

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
            text = to_json(result).decode()
        except TypeError as exc:
            raise self.fail(
                f"{self.name}: tool {slot.name!r} returned {type(result).__name__}, not JSON ({exc}); "
                "return JSON values (its result is saved with the run)"
            ) from None
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
            "error": None if self.failure is None else self.failure[1],
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


class EpisodeRunner:
    """An agent task's episodes in one session: its turns journal, the saved
    run replayed (if any) and the batcher. One lock (the turns recorder's
    mutex) guards both recorders, which the episode threads and the batcher
    share; it is never held while the provider generates, so episodes keep
    running their tools and reading the journal meanwhile."""

    def __init__(
        self, ctx: RunContext, name: str, task: EvalTask, plan: TaskPlan, recorder: TaskRecorder
    ) -> None:
        self.ctx = ctx
        self.name = name
        self.task = task
        self.plan = plan
        self.recorder = recorder
        settings = ctx.settings
        self.turns = ctx.open_journal(recorder.directory, turns_name(name))
        self.lock = self.turns.mutex
        self.saved: transcripts.SavedEpisodes | None = None
        if settings.provider == "replay" and settings.predictions is not None:
            self.saved = transcripts.SavedEpisodes.read(settings.predictions, name)
        self.pv = ctx.provider_digest
        self.mode = Mode(ctx.run_id, ctx.resuming, self.saved is not None, settings.max_attempts)
        self.batcher = TurnBatcher(self._generate)
        self.asked: dict[str, tuple[str, dict[str, Any]]] = {}  # a turn in flight's digest and row content

    # -- the journal ---------------------------------------------------------------

    def source(self, key: RolloutKey, rq: str, pv: str) -> tuple[Answer, Generation | None]:
        """Where this call's answer comes from (`sources.answer_source` over the
        turns journal), and the journal's answer when it is there."""
        with self.lock:
            index = self.turns.index
            found = answer_source(self.mode, index.latest_gen(key, rq, pv), index.latest_fail(key, rq, pv))
            return found, None if found.gen is None else index.generation(found.gen)

    def record_tool(self, key: RolloutKey, rq: str, slot: ToolSlot, text: str) -> None:
        if self.saved is not None:
            return
        with self.lock:
            rows = self.turns.provider_rows(TOOL_PV, TOOL_IDENTITY)
            rows += self.turns.request_rows(rq, {"request_type": "tool", "call": slot.call})
            rows.append(self.turns.gen(key, rq, TOOL_PV, Generation(text=text)))
            self.turns.add(rows)

    def _generate(self, requests: list[Request]) -> list[Generation | Failure]:
        """One batch of turns into the turns journal; each turn's answer as it
        was written, or its final failure."""
        asked = {r.instance_id: self.asked.pop(r.instance_id) for r in requests}
        answers: dict[str, Generation | Failure] = {}
        stream_into_journal(  # each of its writes takes the turns recorder's mutex
            self.turns,
            self.ctx.host.get(),
            (self.pv, self.ctx.provider_identity),
            requests,
            self.ctx.settings,
            digest_of=lambda r: asked[r.instance_id][0],
            content_of=lambda r: asked[r.instance_id][1],
            progress=ProgressSink(),
            on_answer=lambda key, gen: answers.__setitem__(key[1], gen),
            on_failure=lambda failure: answers.__setitem__(failure.instance_id, failure),
            settle=False,
        )
        return [
            answers.get(r.instance_id)
            or Failure(r.stage, r.instance_id, (0,), 1, "retryable", "no answer was recorded", True)
            for r in requests
        ]

    # -- running -----------------------------------------------------------------------

    def run(self, keys: Sequence[RolloutKey]) -> None:
        """Run these rollouts' episodes; each ends as a journal row of the task."""
        with self.lock:
            self.recorder.add(self.recorder.provider_rows(self.pv, self.ctx.provider_identity))
        progress = self.ctx.progress
        progress.start(self.name, len(keys), len(keys))
        done = [0, 0]
        stop: list[BaseException] = []

        def one(episode: Episode, answer: Any) -> None:
            self.finish(episode, answer, stop)
            done[0] += 1
            done[1] += episode.failure is not None
            progress.update(self.name, done[0], done[0], done[1], 0)

        workers = max(1, self.ctx.settings.concurrency)
        self.batcher.expect(len(keys), workers)
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="evalreplay-episode")
        try:
            if inspect.iscoroutinefunction(self.task.agent):
                asyncio.run(self._run_async(keys, pool, one))
            else:
                list(pool.map(lambda key: self._run_sync(key, one), keys))
        finally:
            self.batcher.close()
            pool.shutdown(wait=False, cancel_futures=True)
            progress.end(self.name)
            with self.lock:
                self.turns.flush()
                self.recorder.flush()
        if stop:
            raise stop[0]

    def _run_sync(self, key: RolloutKey, one: Callable[[Episode, Any], None]) -> None:
        episode = Episode(self, key)
        try:
            answer: Any = _call(lambda: self.task.agent(self.task.instance(key[1]), LLM(episode)))
        finally:
            self.batcher.ended()
        one(episode, answer)

    async def _run_async(
        self, keys: Sequence[RolloutKey], pool: ThreadPoolExecutor, one: Callable[..., None]
    ) -> None:
        gate = asyncio.Semaphore(max(1, self.ctx.settings.concurrency))

        async def run_one(key: RolloutKey) -> None:
            async with gate:
                episode = Episode(self, key)
                try:
                    answer: Any = await self.task.agent(self.task.instance(key[1]), AsyncLLM(episode, pool))
                except KeyboardInterrupt:
                    raise
                except BaseException as exc:
                    answer = _Raised(exc)
                finally:
                    self.batcher.ended()
                one(episode, answer)

        await asyncio.gather(*(run_one(key) for key in keys))

    def finish(self, episode: Episode, answer: Any, stop: list[BaseException]) -> None:
        """The episode's journal rows: its final answer or its failure, and its transcript."""
        if isinstance(answer, _Raised):
            exc = answer.exc
            if isinstance(exc, ProviderExit):
                stop.append(exc)
                return  # the session stops: nothing of this episode is final
            if isinstance(exc, EvalReplayError):  # llm.chat or llm.tool misused: the message names which
                episode.fail(f"{episode.name}: {exc}")
            elif not isinstance(exc, TurnFailed):
                episode.fail(f"{episode.name}: the agent raised {type(exc).__name__}: {exc}")
        elif not isinstance(answer, str) and episode.failure is None:
            episode.fail(
                f"{episode.name}: the agent returned {type(answer).__name__} {answer!r:.60}; "
                "return the final answer text (a str) the scorer reads"
            )
        recorder = self.recorder
        key = episode.key
        rq = self.plan.requests[(key[0], key[1])]
        final = isinstance(answer, str) and episode.failure is None
        doc = episode.transcript(answer if final else None)
        # An episode a resume answered wholly from the journal (nothing live) counts as reused.
        generated = episode.live or self.saved is not None or not self.ctx.resuming
        with self.lock:
            rows = self.turns.request_rows(rq, {"request_type": "episode"})
            rows += self.turns.provider_rows(self.pv, self.ctx.provider_identity)
            rows.append(
                self.turns.gen(
                    episode_key(key),
                    rq,
                    self.pv,
                    Generation("", metadata={"transcript": doc, "generated": generated}),
                )
            )
            self.turns.add(rows)
            task = self.task
            main = recorder.request_rows(rq, request_content(task.request(task.instance(key[1]))))
            if final:
                main.append(recorder.gen(key, rq, self.pv, episode.final(answer)))
            else:
                assert episode.failure is not None
                failure_class, message = episode.failure
                failure = Failure(
                    key[0], key[1], (key[2],), self.ctx.settings.max_attempts, failure_class, message, True
                )
                main.append(recorder.fail(failure, rq, self.pv))
            recorder.add(main)

    # -- the run dir ------------------------------------------------------------------------

    def from_journal(self, keys: Sequence[RolloutKey]) -> set[RolloutKey]:
        """The keys whose episode this run answered wholly from an earlier
        run's journal rows: their final answer is this run's row, but nothing
        was generated for it, so the summary counts them reused."""
        with self.lock:
            self.turns.flush()
            index = self.turns.index
            out = set()
            for key in keys:
                ref = index.latest_gen(episode_key(key), self.plan.request_of(key), self.plan.provider)
                own = ref is not None and ref.run == self.ctx.run_id
                if own and index.generation(ref).metadata.get("generated") is False:
                    out.add(key)
            return out

    def transcript_rows(self, keys: Sequence[RolloutKey]) -> list[dict[str, Any]]:
        """The transcript each key's result stands on (call under the task lock)."""
        with self.lock:
            self.turns.flush()
            index = self.turns.index
            plan = self.plan
            rows = []
            for key in keys:
                ref = index.latest_gen(episode_key(key), plan.request_of(key), plan.provider)
                if ref is not None:
                    rows.append(index.generation(ref).metadata["transcript"])
            return rows


@dataclass(frozen=True)
class _Raised:
    exc: BaseException


def _call(fn: Callable[[], Any]) -> Any:
    """An agent's result, or what it raised (an interrupt still stops the session)."""
    try:
        return fn()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return _Raised(exc)
