"""Running an agent task's episodes: concurrently, journaled turn by turn.

`--evalreplay-concurrency` episodes run at a time (threads for a plain
`solve`, one event loop for an `async def` one). Their model turns meet in a
`TurnBatcher`, which hands the provider one batch of every turn waiting
(through `generation.stream_into_journal`, so retries, the per-turn timeout
and the journal rows are the ones every generation gets). Every model turn
is a row of `<task>-turns-journal.jsonl` the moment it arrives, every tool
result one written at the latest with the next batch, before that batch
reaches the provider (one write for the batch's tool results, not one per
tool), keyed by episode, turn and the digest of what was sent; under
`--resume` an episode re-runs its agent, each call that matches its
recorded row is answered from there (a tool's result without running the
tool), and from the first that does not the episode is live. A replay
(`--evalreplay-predictions`) answers turns and tools from the saved run's
transcripts instead. The final answer is the rollout's `gen` row in the
task's journal; a failed episode, its `fail` row; either way the transcript
so far is kept for the run dir. An ended episode's rows wait for the next
batch's write (its transcript first, then its answer in the task's journal),
so the episodes that end together cost two writes, not two each: a kill
before then loses no model turn, only the agent's re-run over its journaled
turns on `--resume`.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from pytest_evalreplay.agent import LLM, AsyncLLM, Command, ToolSlot, TurnFailed
from pytest_evalreplay.journal import transcripts
from pytest_evalreplay.journal.index import GenRef, JournalIndex
from pytest_evalreplay.journal.recorder import TaskRecorder
from pytest_evalreplay.journal.rows import Failure, RolloutKey
from pytest_evalreplay.model import EvalReplayError, Generation, Request, request_content
from pytest_evalreplay.numbers.planning import TaskPlan
from pytest_evalreplay.numbers.sources import Answer, Mode, answer_source
from pytest_evalreplay.run.context import ProgressSink, ProviderExit, RunContext
from pytest_evalreplay.run.episode import TOOL_IDENTITY, TOOL_PV, Episode
from pytest_evalreplay.run.generation import stream_into_journal
from pytest_evalreplay.run.turnbatcher import TurnBatcher
from pytest_evalreplay.storage.runschema import TURNS_SUFFIX
from pytest_evalreplay.task import EvalTask

if TYPE_CHECKING:  # the endpoint (http.server) is imported only when an agent asks for it
    from pytest_evalreplay.run.endpoint import Endpoint


def turns_name(task: str) -> str:
    return task + TURNS_SUFFIX


def episode_key(key: RolloutKey) -> RolloutKey:
    """Where an episode's transcript row sits in the turns journal."""
    return (key[0], f"{key[1]}|r{key[2]}|episode", 0)


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
        self._unrecorded = answer_source(self.mode, None, None)  # a call the journal holds nothing of
        self.batcher = TurnBatcher(self._generate)
        # A turn in flight's digest, row content and journal id, by its request's instance id.
        self.asked: dict[str, tuple[str, dict[str, Any], str]] = {}
        self._endpoint: Endpoint | None = None
        self._endpoint_lock = threading.Lock()
        # Ended episodes' rows of the task's journal, written after their transcripts (held in `turns`).
        self._ended: list[dict[str, Any]] = []

    def endpoint(self) -> Endpoint:
        """The task's OpenAI-compatible endpoint, started on the first episode that asks."""
        with self._endpoint_lock:
            if self._endpoint is None:
                from pytest_evalreplay.run.endpoint import Endpoint

                self._endpoint = Endpoint(self.ctx.settings.model or "")
            return self._endpoint

    # -- the journal ---------------------------------------------------------------

    def source(self, key: RolloutKey, rq: str, pv: str) -> tuple[Answer, Generation | None]:
        """Where this call's answer comes from (`sources.answer_source` over the
        turns journal), and the journal's answer when it is there."""
        with self.lock:
            index = self.turns.index
            gen, fail = index.latest_gen(key, rq, pv), index.latest_fail(key, rq, pv)
            if gen is None and fail is None:
                return self._unrecorded, None  # a live run's every turn: nothing to weigh
            found = answer_source(self.mode, gen, fail)
            return found, None if found.gen is None else index.generation(found.gen)

    def record_tool(self, key: RolloutKey, rq: str, slot: ToolSlot, text: str) -> None:
        if self.saved is not None:
            return
        with self.lock:
            # No request row: the call is in the turn before's gen row (and the transcript),
            # and `rq` (the call and that turn's digest) is all a resume matches it by.
            rows = self.turns.provider_rows(TOOL_PV, TOOL_IDENTITY)
            rows.append(self.turns.gen(key, rq, TOOL_PV, Generation(text=text)))
            self.turns.hold(rows)  # written before this episode's next turn is asked, with its batch

    def _generate(self, requests: list[Request]) -> list[Generation | Failure]:
        """One batch of turns into the turns journal; each turn's answer as it
        was written, or its final failure."""
        asked = {r.instance_id: self.asked.pop(r.instance_id) for r in requests}
        # What these episodes held (tool results, ended episodes' rows): on disk before their turns
        # reach the provider.
        self._write_held()
        answers: dict[str, Generation | Failure] = {}  # by journal id
        stream_into_journal(  # each of its writes takes the turns recorder's mutex
            self.turns,
            self.ctx.host.get(),
            (self.pv, self.ctx.provider_identity),
            requests,
            self.ctx.settings,
            digest_of=lambda r: asked[r.instance_id][0],
            content_of=lambda r: asked[r.instance_id][1],
            journal_id=lambda r: asked[r.instance_id][2],
            progress=ProgressSink(),
            on_answer=lambda key, gen: answers.__setitem__(key[1], gen),
            on_failure=lambda failure: answers.__setitem__(failure.instance_id, failure),
            settle=False,
        )
        return [
            answers.get(asked[r.instance_id][2])
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
            if isinstance(self.task.agent, Command):
                self.task.agent.stop()
            with self._endpoint_lock:
                endpoint, self._endpoint = self._endpoint, None
            if endpoint is not None:
                endpoint.stop()
            pool.shutdown(wait=False, cancel_futures=True)
            progress.end(self.name)
            with self.lock:
                self._write_held()
                self.turns.flush()
                self.recorder.flush()
        if stop:
            raise stop[0]

    def _write_held(self) -> None:
        """What the turns journal holds (tool results, ended episodes'
        transcripts), then the ended episodes' rows of the task's journal,
        which stand on those transcripts."""
        with self.lock:
            self.turns.write_held()
            ended, self._ended = self._ended, []
            self.recorder.add(ended)

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
        if episode.base_url is not None and self._endpoint is not None:
            self._endpoint.close(episode.base_url)
        if episode.exit is not None:
            stop.append(episode.exit)
            return  # the session stops: nothing of this episode is final
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
            self.turns.hold(rows)  # written with the next batch (`_write_held`), or at the end of `run`
            task = self.task
            main = (  # the request rendered only when the journal lacks its row (once per instance)
                []
                if recorder.has_request(rq)
                else recorder.request_rows(rq, request_content(task.request(task.instance(key[1]))))
            )
            if final:
                main.append(recorder.gen(key, rq, self.pv, episode.final(answer)))
            else:
                assert episode.failure is not None
                failure_class, message = episode.failure
                failure = Failure(
                    key[0], key[1], (key[2],), self.ctx.settings.max_attempts, failure_class, message, True
                )
                main.append(recorder.fail(failure, rq, self.pv))
            self._ended += main

    # -- the run dir ------------------------------------------------------------------------

    def from_journal(self, keys: Sequence[RolloutKey]) -> set[RolloutKey]:
        """The keys whose episode this run answered wholly from an earlier
        run's journal rows: their final answer is this run's row, but nothing
        was generated for it, so the summary counts them reused."""
        if not self.ctx.resuming:
            return set()  # a run without --resume answers from nothing earlier (`generated` is True)
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
                    rows.append(_transcript_of(index, ref, self.ctx.run_id))
            return rows


# An episode row's generation as `finish` writes it, around the transcript:
# `{..."metadata":{"transcript":` TRANSCRIPT `,"generated":true}}`.
_HEAD = orjson.dumps(Generation("", metadata={"transcript": None}).to_row()).rpartition(b"null")[0]
_TAILS = (b',"generated":true}}', b',"generated":false}}')


def _transcript_of(index: JournalIndex, ref: GenRef, run: str) -> dict[str, Any] | orjson.Fragment:
    """An episode row's transcript for the run dir's transcripts file: where
    this run wrote the row (`finish`), its JSON as the journal holds it, not
    decoded and encoded again; an earlier run's row, decoded (as the run dir's
    predictions take only this run's rows undecoded: `rundir.writer`)."""
    data = index.generation_json(ref) if ref.run == run else b""
    if data.startswith(_HEAD):
        for tail in _TAILS:
            if data.endswith(tail):
                return orjson.Fragment(data[len(_HEAD) : -len(tail)])
    return index.generation(ref).metadata["transcript"]


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
