"""The `vllm` provider: an in-process vLLM engine.

One `vllm.LLM` per provider, started on the first `generate` (so a fully
resumed session never pays the start-up) and shut down by `close()`. Every
call sends all its text requests through one `LLM.generate` and all its chat
requests through one `LLM.chat`, so vLLM schedules the whole batch itself.

vLLM is imported here only, and only when an engine starts.
"""

from __future__ import annotations

import gc
import importlib.util
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_evalreplay.model import (
    EvalReplayError,
    GenerateResult,
    Generation,
    GenerationError,
    Request,
)
from pytest_evalreplay.options import Settings
from pytest_evalreplay.providers.engine_requests import (
    GREEDY_EPS,
    Draw,
    chat_messages,
    key_hint,
    plan_draws,
    text_prompt,
    unsupported,
)

MISSING_VLLM = "the vllm provider needs vLLM: pip install 'pytest-evalreplay[vllm]'"

# SamplingParams fields that are the provider's to set, or engine plumbing.
_RESERVED = frozenset(
    {"n", "output_kind", "detokenize", "skip_clone", "output_text_buffer_length", "stream_interval"}
)


def from_settings(settings: Settings) -> VllmProvider:
    if not settings.model:
        raise EvalReplayError(
            "the vllm provider needs a model: pass --evalreplay-model=NAME_OR_PATH (ini evalreplay_model)"
        )
    if "model" in settings.engine_args:
        raise EvalReplayError("--evalreplay-engine-arg model=... is not allowed; use --evalreplay-model")
    if importlib.util.find_spec("vllm") is None:
        raise EvalReplayError(MISSING_VLLM)
    return VllmProvider(settings.model, settings.engine_args, quiet=settings.quiet)


@dataclass(frozen=True)
class _Job:
    """One request's engine prompts: a prompt per draw, all for request `index`."""

    index: int
    prompt: Any
    draws: tuple[Draw, ...]
    params: tuple[Any, ...]


class VllmProvider:
    """Generates with an in-process `vllm.LLM` (see the module docstring).

    `engine_args` are keyword arguments of `vllm.LLM` (dtype, max_model_len,
    tensor_parallel_size, ...). `quiet` turns vLLM's progress bars off.
    """

    kind = "vllm"
    batch_size: int | None = None

    def __init__(self, model: str, engine_args: Mapping[str, Any] | None = None, quiet: bool = False) -> None:
        self.model = model
        self.engine_args = dict(engine_args or {})
        self.quiet = quiet
        self._llm: Any = None
        self._start_error: str | None = None
        self._sampling_fields: frozenset[str] = frozenset()
        self._defaults: dict[str, Any] = {}
        self._max_model_len: int | None = None
        self._rejections: tuple[type[BaseException], ...] = (ValueError, TypeError)
        self._sampling_params: Any = None

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
        results: list[GenerateResult | None] = [unsupported(r, self.kind) for r in requests]
        pending = [i for i, r in enumerate(results) if r is None]
        if not pending:
            return [r for r in results if r is not None]
        llm = self.llm
        text_jobs: list[_Job] = []
        chat_jobs: list[_Job] = []
        has_text = any(isinstance(requests[i].context, str) for i in pending)
        tokenizer = llm.get_tokenizer() if has_text else None
        for i in pending:
            req = requests[i]
            try:
                draws, params = self._params(req)
            except ValueError as exc:
                results[i] = GenerationError(str(exc), retryable=False)
                continue
            if isinstance(req.context, str):
                # Tokenize once here: the length check needs the ids, and
                # handing them to vLLM saves it tokenizing again.
                ids = list(tokenizer.encode(text_prompt(req.context, req.system_prompt)))
                too_long = self._check_length(len(ids))
                if too_long:
                    results[i] = GenerationError(too_long, retryable=False)
                    continue
                text_jobs.append(_Job(i, {"prompt_token_ids": ids}, draws, params))
            else:
                messages = chat_messages(req.context, req.system_prompt)
                chat_jobs.append(_Job(i, messages, draws, params))
        use_tqdm = not self.quiet
        for jobs, call in (
            (text_jobs, lambda p, s: llm.generate(p, s, use_tqdm=use_tqdm)),
            (chat_jobs, lambda p, s: llm.chat(p, s, use_tqdm=use_tqdm)),
        ):
            if jobs:
                for index, res in self._run(call, jobs).items():
                    results[index] = res
        return [r if r is not None else GenerationError("no result", retryable=True) for r in results]

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

    def _run(
        self, call: Callable[[list[Any], list[Any]], Sequence[Any]], jobs: list[_Job]
    ) -> dict[int, GenerateResult]:
        """Run `jobs` in one engine call. If vLLM rejects a prompt (it rejects
        the whole call then, before generating anything), split the batch in
        halves until the rejected requests are isolated as terminal errors;
        the rest still generate, in as few calls as that allows."""
        prompts = [job.prompt for job in jobs for _ in job.draws]
        params = [p for job in jobs for p in job.params]
        try:
            outputs = list(call(prompts, params))
        except self._rejections as exc:
            if len(jobs) == 1:
                msg = f"vLLM rejected the request: {type(exc).__name__}: {exc}"
                return {jobs[0].index: GenerationError(msg, retryable=False)}
            mid = len(jobs) // 2
            return {**self._run(call, jobs[:mid]), **self._run(call, jobs[mid:])}
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
        results: dict[int, GenerateResult] = {}
        pos = 0
        for job in jobs:
            gens: list[Generation] = []
            for draw in job.draws:
                gens.extend(_generations(outputs[pos], draw.n))
                pos += 1
            results[job.index] = gens
        return results


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
