"""The `vllm` provider: an in-process vLLM engine.

One `vllm.LLM` per provider, started on the first batch that needs it (so a
fully resumed session never pays the start-up) and shut down by `close()`.

A batch is streamed: every engine request of every request in the batch is
added to the engine first (through `LLM.enqueue` / `LLM.enqueue_chat`, which
render prompts exactly as `LLM.generate` / `LLM.chat` do), so continuous
batching sees the whole batch; then the provider drives the engine's step
loop itself and hands back each request's result as soon as all its engine
requests have finished, instead of when the last one of the batch has.

vLLM is imported here only, and only when an engine starts.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import inspect
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_evalreplay.model import (
    EvalReplayError,
    GenerateResult,
    Generation,
    GenerationError,
    Request,
)
from pytest_evalreplay.providers.engine_requests import (
    GREEDY_EPS,
    Draw,
    chat_messages,
    key_hint,
    plan_draws,
    text_prompt,
    unsupported,
)
from pytest_evalreplay.settings import Settings

MISSING_VLLM = "the vllm provider needs vLLM: pip install 'pytest-evalreplay[vllm]'"

# SamplingParams fields that are the provider's to set, or engine plumbing.
_RESERVED = frozenset(
    {"n", "output_kind", "detokenize", "skip_clone", "output_text_buffer_length", "stream_interval"}
)

# Finish reasons that mean the engine gave up on a request rather than
# finishing it: vLLM's "abort" (cancelled) and "error" (a retryable
# request-level failure, such as a KV-cache transfer error).
_ENGINE_FAILURES = {
    "abort": "vLLM aborted the request",
    "error": "vLLM reported an internal error for the request",
}


def from_settings(settings: Settings) -> VllmProvider:
    if not settings.model:
        raise EvalReplayError(
            "the vllm provider needs a model: pass --evalreplay-model=NAME_OR_PATH (ini evalreplay_model)"
        )
    if "model" in settings.engine_args:
        raise EvalReplayError("--evalreplay-engine-arg model=... is not allowed; use --evalreplay-model")
    if importlib.util.find_spec("vllm") is None:
        raise EvalReplayError(MISSING_VLLM)
    return VllmProvider(
        settings.model, settings.engine_args, quiet=settings.quiet, request_timeout=settings.timeout
    )


@dataclass(frozen=True)
class _Job:
    """One request's engine prompts: a prompt per draw, all for request `index`."""

    index: int
    prompt: Any
    chat: bool
    draws: tuple[Draw, ...]
    params: tuple[Any, ...]


@dataclass(eq=False)
class _Slot:
    """One engine request in flight: draw `draw` of request `index` of `stream`.

    `engine_id` is what `LLM.enqueue` returned (what aborts take), `output_id`
    what the engine's outputs carry. `started` is when the request was first
    seen generating (the clock of the time limit), None before that."""

    stream: _Stream
    index: int
    draw: int
    n: int
    engine_id: str
    output_id: str
    started: float | None = None


@dataclass(eq=False)
class _Stream:
    """The bookkeeping of one `generate_stream` call."""

    ready: deque[tuple[int, GenerateResult]] = field(default_factory=deque)
    samples: dict[int, list[list[Generation] | None]] = field(default_factory=dict)
    slots: dict[int, list[_Slot]] = field(default_factory=dict)  # by request index, while in flight
    progress: Any = None


class VllmProvider:
    """Generates with an in-process `vllm.LLM` (see the module docstring).

    `engine_args` are keyword arguments of `vllm.LLM` (dtype, max_model_len,
    tensor_parallel_size, ...). `quiet` turns the progress bar off.
    `request_timeout` (seconds, None for none) limits each engine request's
    time from its first generated token, so time spent queued behind the rest
    of the batch does not count; past it the request is aborted and fails as
    retryable. `clock` is the time source for that limit.
    """

    kind = "vllm"
    batch_size: int | None = None

    def __init__(
        self,
        model: str,
        engine_args: Mapping[str, Any] | None = None,
        quiet: bool = False,
        request_timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if request_timeout is not None and not request_timeout > 0:
            raise ValueError(f"request_timeout must be a positive number of seconds, got {request_timeout!r}")
        self.model = model
        self.engine_args = dict(engine_args or {})
        self.quiet = quiet
        self.request_timeout = request_timeout
        self._clock = clock
        self._llm: Any = None
        self._start_error: str | None = None
        self._sampling_fields: frozenset[str] = frozenset()
        self._defaults: dict[str, Any] = {}
        self._max_model_len: int | None = None
        self._rejections: tuple[type[BaseException], ...] = (ValueError, TypeError)
        self._sampling_params: Any = None
        # Every engine request in flight, by the id its output carries, over
        # all open streams: whichever stream steps the engine delivers each
        # finished output to the stream that asked for it, so streams can
        # nest (a judge generating while a generation stream is open).
        self._in_flight: dict[str, _Slot] = {}

    def __repr__(self) -> str:
        return f"VllmProvider(model={self.model!r}, engine_args={self.engine_args!r})"

    def __enter__(self) -> VllmProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- engine life cycle -------------------------------------------------

    @property
    def llm(self) -> Any:
        """The engine, started on first use. A failed start is remembered so
        later batches fail at once instead of starting again."""
        if self._llm is None:
            if self._start_error is not None:
                raise RuntimeError(self._start_error)
            try:
                self._llm = self._start()
            except Exception as exc:
                self._start_error = f"vLLM engine for {self.model!r} failed to start: {exc}"
                raise RuntimeError(self._start_error) from exc
        return self._llm

    def _start(self) -> Any:
        try:
            import vllm
        except ImportError as exc:
            raise EvalReplayError(f"{MISSING_VLLM} ({exc})") from exc
        llm = vllm.LLM(model=self.model, **self.engine_args)
        self._sampling_params = vllm.SamplingParams
        fields = getattr(vllm.SamplingParams, "__struct_fields__", None)
        if not fields:  # not a msgspec Struct in this vLLM: read the signature
            fields = tuple(inspect.signature(vllm.SamplingParams).parameters)
        self._sampling_fields = frozenset(f for f in fields if not f.startswith("_") and f not in _RESERVED)
        # The model's generation_config.json defaults (temperature, top_p,
        # max_new_tokens, ...) apply under the task's own sampling, as they do
        # for `LLM.generate` without params and for `vllm serve`.
        try:
            self._defaults = dict(llm.model_config.get_diff_sampling_param())
        except Exception:  # older vLLM: no generation-config defaults
            self._defaults = {}
        self._max_model_len = getattr(llm.model_config, "max_model_len", None)
        rejections: list[type[BaseException]] = [ValueError, TypeError]
        try:
            from vllm.exceptions import VLLMClientError

            rejections.append(VLLMClientError)
        except ImportError:
            pass
        try:
            from jinja2 import TemplateError

            rejections.append(TemplateError)
        except ImportError:
            pass
        self._rejections = tuple(rejections)
        return llm

    def close(self) -> None:
        """Shut the engine down and free its memory; safe to call twice."""
        llm, self._llm = self._llm, None
        self._in_flight.clear()
        if llm is None:
            return
        shutdown = getattr(llm, "shutdown", None)
        if shutdown is None:
            core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            shutdown = getattr(core, "shutdown", None)
        try:
            if callable(shutdown):
                shutdown()
        finally:
            del llm
            gc.collect()

    # -- generation ----------------------------------------------------------

    def generate(self, requests: list[Request]) -> list[GenerateResult]:
        """All results at once, in request order: `generate_stream` collected."""
        results: list[GenerateResult | None] = [None] * len(requests)
        for index, result in self.generate_stream(requests):
            results[index] = result
        return [r if r is not None else GenerationError("no result", retryable=True) for r in results]

    def generate_stream(self, requests: list[Request]) -> Iterator[tuple[int, GenerateResult]]:
        """Yield `(index, result)` as each request finishes (see the module
        docstring). Closing the generator early aborts every engine request it
        still has in flight, so the engine is clean for the next call."""
        requests = list(requests)
        pending: list[int] = []
        for i, request in enumerate(requests):
            error = unsupported(request, self.kind)
            if error is None:
                pending.append(i)
            else:
                yield i, error
        if not pending:
            return
        llm = self.llm
        tokenizer = (
            llm.get_tokenizer() if any(isinstance(requests[i].context, str) for i in pending) else None
        )
        stream = _Stream()
        try:
            # Each request goes into the engine as soon as it is prepared, all
            # of them before the first step, so the engine starts at once and
            # continuous batching sees the whole batch.
            for i in pending:
                job = self._job(tokenizer, i, requests[i])
                if isinstance(job, GenerationError):
                    stream.ready.append((i, job))
                else:
                    self._add(llm, job, stream)
            draws = [slot for slots in stream.slots.values() for slot in slots]
            if self.request_timeout is not None and _first_token_probe(llm.llm_engine) is None:
                now = self._clock()  # this vLLM does not say when a request starts: count from now
                for slot in draws:
                    slot.started = now
            if not self.quiet and draws:
                stream.progress = _progress_bar(len(draws))
            engine = llm.llm_engine
            while True:
                while stream.ready:
                    yield stream.ready.popleft()
                if not stream.slots:
                    break
                self._step(engine)
        except BaseException:
            # Closed early, or the engine failed: leave nothing of ours running.
            with contextlib.suppress(Exception):
                self._drop(llm.llm_engine, [s for slots in stream.slots.values() for s in slots])
            raise
        finally:
            if stream.progress is not None:
                stream.progress.close()

    def _job(self, tokenizer: Any, index: int, req: Request) -> _Job | GenerationError:
        """A request's engine prompts and sampling, or the terminal error of a
        request that cannot be asked (bad sampling, a text prompt too long)."""
        try:
            draws, params = self._params(req)
        except ValueError as exc:
            return GenerationError(str(exc), retryable=False)
        if not isinstance(req.context, str):
            return _Job(index, chat_messages(req.context, req.system_prompt), True, draws, params)
        # Tokenize once here: the length check needs the ids, and handing
        # them to vLLM saves it tokenizing again.
        ids = list(tokenizer.encode(text_prompt(req.context, req.system_prompt)))
        too_long = self._check_length(len(ids))
        if too_long:
            return GenerationError(too_long, retryable=False)
        return _Job(index, {"prompt_token_ids": ids}, False, draws, params)

    def _add(self, llm: Any, job: _Job, stream: _Stream) -> None:
        """Put a job's draws into the engine with one `enqueue`: vLLM rejects
        a bad prompt (a chat prompt longer than the context, a chat template
        error, an invalid sampling value) while adding it and takes back that
        call's requests, so a rejection fails its own request only."""
        enqueue = llm.enqueue_chat if job.chat else llm.enqueue
        try:
            engine_ids = enqueue([job.prompt] * len(job.draws), list(job.params), use_tqdm=False)
        except self._rejections as exc:
            msg = f"vLLM rejected the request: {type(exc).__name__}: {exc}"
            stream.ready.append((job.index, GenerationError(msg, retryable=False)))
            return
        if len(engine_ids) != len(job.draws):
            raise RuntimeError(f"vLLM added {len(engine_ids)} requests for {len(job.draws)} prompts")
        slots = [
            _Slot(stream, job.index, pos, draw.n, engine_id, _output_id(engine_id))
            for pos, (draw, engine_id) in enumerate(zip(job.draws, engine_ids, strict=True))
        ]
        stream.slots[job.index] = slots
        stream.samples[job.index] = [None] * len(slots)
        for slot in slots:
            self._in_flight[slot.output_id] = slot

    def _step(self, engine: Any) -> None:
        """One engine step: hand each finished output to its stream, then
        abort what ran past the time limit."""
        if not engine.has_unfinished_requests():
            # Nothing left to step, yet requests unanswered (something else
            # aborted them, or took their outputs): fail them, never hang.
            for slot in list(self._in_flight.values()):
                error = GenerationError("vLLM finished without answering the request", retryable=True)
                self._fail(engine, slot.stream, slot.index, error)
            return
        for output in engine.step():
            if not output.finished:
                continue
            slot = self._in_flight.pop(output.request_id, None)
            if slot is not None:  # else: aborted meanwhile, or not ours
                self._finish(engine, slot, output)
        if self.request_timeout is not None and self._in_flight:
            self._expire(engine, self.request_timeout)

    def _finish(self, engine: Any, slot: _Slot, output: Any) -> None:
        stream = slot.stream
        samples = stream.samples.get(slot.index)
        if samples is None:  # its request has failed already
            return
        if stream.progress is not None:
            stream.progress.update(1)
        reasons = {c.finish_reason for c in output.outputs}
        failed = [_ENGINE_FAILURES[r] for r in sorted(reasons & _ENGINE_FAILURES.keys())]
        if failed:
            self._fail(engine, stream, slot.index, GenerationError(failed[0], retryable=True))
            return
        try:
            samples[slot.draw] = _generations(output, slot.n)
        except RuntimeError as exc:
            self._fail(engine, stream, slot.index, GenerationError(str(exc), retryable=True))
            return
        if all(s is not None for s in samples):
            del stream.slots[slot.index], stream.samples[slot.index]
            stream.ready.append((slot.index, [g for s in samples if s is not None for g in s]))

    def _expire(self, engine: Any, limit: float) -> None:
        """Start the clock of each engine request at its first generated
        token; abort those running past `limit` and fail their requests."""
        now = self._clock()
        generating = _first_token_probe(engine)
        expired: list[_Slot] = []
        for slot in self._in_flight.values():
            if slot.started is None:
                if generating is None or generating(slot.output_id):
                    slot.started = now
            elif now - slot.started > limit:
                expired.append(slot)
        for slot in expired:
            if slot.output_id in self._in_flight:  # not failed with a sibling draw
                msg = f"the vLLM request ran past the {limit:g} s time limit (--evalreplay-timeout); aborted"
                self._fail(engine, slot.stream, slot.index, GenerationError(msg, retryable=True))

    def _fail(self, engine: Any, stream: _Stream, index: int, error: GenerationError) -> None:
        """Fail request `index` of `stream`, aborting its draws still in flight."""
        if index not in stream.slots:
            return
        slots = stream.slots.pop(index)
        stream.samples.pop(index, None)
        stream.ready.append((index, error))
        self._drop(engine, slots)

    def _drop(self, engine: Any, slots: list[_Slot]) -> None:
        """Abort those of `slots` still in flight in the engine."""
        live = [s for s in slots if self._in_flight.pop(s.output_id, None) is not None]
        if live:
            engine.abort_request([s.engine_id for s in live], internal=True)
            if live[0].stream.progress is not None:
                live[0].stream.progress.update(len(live))

    def _check_length(self, n_tokens: int) -> str | None:
        """vLLM's own rule: a prompt needs at least one token and must leave
        room for one generated token within max_model_len."""
        if n_tokens == 0:
            return "the prompt is empty (0 tokens); vLLM cannot generate from it"
        limit = self._max_model_len
        if limit is not None and n_tokens >= limit:
            return (
                f"the prompt has {n_tokens} tokens; the model's context is {limit} tokens "
                "(max_model_len), which leaves no room to generate. Shorten the prompt "
                "or raise --evalreplay-engine-arg max_model_len=..."
            )
        return None

    def _params(self, request: Request) -> tuple[tuple[Draw, ...], tuple[Any, ...]]:
        """The request's draws and one SamplingParams per draw.
        Raises ValueError (a terminal error for this request) on bad sampling."""
        sampling = dict(request.sampling)
        for key in sampling:
            if key not in self._sampling_fields:
                raise ValueError(
                    f"unknown sampling key {key!r} for the vllm provider{key_hint(key)}; "
                    f"known keys: {', '.join(sorted(self._sampling_fields))}"
                )
        kwargs = {**self._defaults, **sampling}
        kwargs.pop("seed", None)
        # Unset max_tokens means "up to the context", as with `vllm serve`,
        # not SamplingParams' silent default of 16 tokens.
        kwargs.setdefault("max_tokens", None)
        temperature = kwargs.get("temperature", 1.0)
        greedy = temperature is not None and temperature < GREEDY_EPS
        draws = tuple(plan_draws(request, greedy))
        try:
            params = tuple(self._sampling_params(**kwargs, n=d.n, seed=d.seed) for d in draws)
        except self._rejections as exc:
            raise ValueError(f"invalid sampling {sampling!r}: {exc}") from exc
        return draws, params


def _output_id(engine_id: str) -> str:
    """The request id the engine's outputs carry, for an id `LLM.enqueue`
    returned.

    Not public API; checked against vLLM 0.32.0: `LLM.enqueue` returns the
    engine's internal id, `<external>-<8 random characters>`
    (`InputProcessor.assign_request_id`), while `RequestOutput.request_id` is
    the external id, a decimal counter (`LLM._add_request`). Fallback: an id
    not of that shape is taken as it is, which is right where the two agree
    (with VLLM_DISABLE_REQUEST_ID_RANDOMIZATION set, for one)."""
    head, sep, _ = engine_id.partition("-")
    return head if sep and head.isdigit() else engine_id


def _first_token_probe(engine: Any) -> Callable[[str], bool] | None:
    """A test of whether an engine request (by output id) has generated a
    token yet, or None where this vLLM does not say.

    Not public API; checked against vLLM 0.32.0: the `LLMEngine`'s output
    processor keeps one `RequestState` per engine request (each child of an
    n > 1 request included) under `external_req_ids[output id]` in
    `request_states`, and its `is_prefilling` turns False with the request's
    first output. Fallbacks: without that layout the caller starts every
    clock when the request is added; a state without `is_prefilling` counts
    as generating, so a limit is never silently dropped."""
    processor = getattr(engine, "output_processor", None)
    ids = getattr(processor, "external_req_ids", None)
    states = getattr(processor, "request_states", None)
    if not isinstance(ids, Mapping) or not isinstance(states, Mapping):
        return None

    def generating(output_id: str) -> bool:
        for internal_id in ids.get(output_id, ()):
            state = states.get(internal_id)
            if state is not None and not getattr(state, "is_prefilling", False):
                return True
        return False

    return generating


def _progress_bar(total: int) -> Any:
    """vLLM's own kind of progress bar (tqdm comes with vLLM)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)


def _generations(output: Any, n: int) -> list[Generation]:
    """The `n` samples of one RequestOutput, in sample order."""
    prompt_ids = getattr(output, "prompt_token_ids", None)
    prompt_tokens = len(prompt_ids) if prompt_ids is not None else None
    samples = sorted(output.outputs, key=lambda c: c.index)
    if len(samples) != n:
        raise RuntimeError(f"vLLM returned {len(samples)} samples where {n} were asked for")
    return [
        Generation(
            text=c.text,
            finish_reason=c.finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(c.token_ids),
        )
        for c in samples
    ]
