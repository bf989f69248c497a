"""Loglikelihood requests on the vllm provider's in-process engine.

Each continuation is one engine request whose prompt is the token ids of
context + continuation, asked with `SamplingParams(max_tokens=1,
prompt_logprobs=1)`: the engine returns, for every prompt position, the
log-probability of the prompt's own token there and its rank, in one prefill.
The continuation's log-likelihood is the sum over its positions; it is
greedy when each of its tokens ranks first. Tokens are split as
lm-evaluation-harness splits them (loglikelihood_requests.py).

All continuations of all requests go into the engine before the first step
and run through the provider's own step loop (`VllmProvider._drive`), so
streaming, the time limit (counted from the request's first generated
token, as for generation: queueing and the prefill itself do not count) and
aborts on close are generation's. Requests of the same context share its
tokenization; identical context + continuation sequences within a request
are scored once. (vLLM does not serve prompt log-probabilities from its
prefix cache, so each continuation's prefill covers its context again.)

A loglikelihood_rolling request's prompts are its text's windows
(rolling_requests.py, cut to the engine's max_model_len as lm-eval's vllm
model cuts them), each scored past its context; its answer is their sum.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pytest_evalreplay.model import GenerationError, LoglikelihoodResult, Request, RollingLoglikelihood
from pytest_evalreplay.providers.engine_requests import text_prompt
from pytest_evalreplay.providers.loglikelihood_requests import (
    continuation_start,
    request_pairs,
    too_long,
    unsupported_loglikelihood,
)
from pytest_evalreplay.providers.rolling_requests import (
    NO_MAX_LENGTH,
    rolling_windows,
    total,
    unsupported_rolling,
)
from pytest_evalreplay.providers.vllm_requests import RequestTranslator
from pytest_evalreplay.providers.vllm_stream import Slot, Stream, engine_failure


@dataclass(frozen=True)
class Plan:
    """A request's engine prompts: `prompts[k]` is a distinct context +
    continuation token sequence whose continuation starts at `starts[k]`;
    continuation j is answered by prompt `answers[j]` (None: it has no tokens,
    log-likelihood 0 and greedy, as lm-eval sums an empty continuation)."""

    prompts: tuple[tuple[int, ...], ...]
    starts: tuple[int, ...]
    answers: tuple[int | None, ...]
    # A rolling request's: its prompts are the text's windows, and this its token count.
    rolling_tokens: int | None = None


def plan_request(request: Request, encode: Any, max_model_len: int | None) -> Plan | GenerationError:
    """Tokenize a supported request (`encode`: text -> token ids, cached by
    the caller) into its engine prompts, or the terminal error of one that
    cannot be scored."""
    pairs = request_pairs(request)
    context = encode(pairs.context)
    prompts: list[tuple[int, ...]] = []
    starts: list[int] = []
    answers: list[int | None] = []
    for n, whole_text in enumerate(pairs.wholes()):
        whole = tuple(encode(whole_text))
        start = continuation_start(len(context), len(whole))
        if isinstance(start, str):
            return GenerationError(start, retryable=False)
        if start == len(whole):
            answers.append(None)
            continue
        long = too_long(len(whole), max_model_len)
        if long is not None:
            return GenerationError(f"continuation {n}: {long}", retryable=False)
        if whole not in prompts:
            prompts.append(whole)
            starts.append(start)
        answers.append(prompts.index(whole))
    return Plan(tuple(prompts), tuple(starts), tuple(answers))


def plan_rolling(
    request: Request, encode: Any, prefix: int | None, max_model_len: int | None
) -> Plan | GenerationError:
    """A rolling request's windows (rolling_requests.py) as engine prompts,
    each scored past its context, or the terminal error of one that cannot be
    cut: `encode` tokenizes the text as lm-eval's vllm model does (special
    tokens added), `prefix` is the start token (else end-of-text)."""
    if max_model_len is None:
        return GenerationError(f"{NO_MAX_LENGTH}: the engine gives no max_model_len", retryable=False)
    if prefix is None:
        return GenerationError(
            "the tokenizer has no start or end-of-text token, and a loglikelihood_rolling text's first "
            "token is scored after one",
            retryable=False,
        )
    assert isinstance(request.context, str)
    tokens = encode(text_prompt(request.context, request.system_prompt))
    try:
        windows = rolling_windows(tokens, prefix, max_model_len)
    except ValueError as exc:
        return GenerationError(str(exc), retryable=False)
    return Plan(
        tuple(w.tokens for w in windows),
        tuple(len(w.context) for w in windows),
        tuple(range(len(windows))),
        rolling_tokens=len(tokens),
    )


def score(plan: Plan, k: int, prompt_logprobs: Any) -> tuple[float, bool] | str:
    """Prompt k's continuation (log-likelihood, is_greedy) from the engine's
    prompt log-probabilities (position p: {token id: Logprob}), or what is
    missing from them."""
    tokens = plan.prompts[k]
    if prompt_logprobs is None or len(prompt_logprobs) != len(tokens):
        got = "none" if prompt_logprobs is None else f"{len(prompt_logprobs)} positions"
        return f"vLLM returned {got} of prompt log-probabilities for a {len(tokens)}-token prompt"
    total = 0.0
    greedy = True
    for p in range(plan.starts[k], len(tokens)):
        position = prompt_logprobs[p] or {}
        own = position.get(tokens[p])
        if own is None:
            return f"vLLM returned no log-probability for prompt token {p}"
        total += float(own.logprob)
        if own.rank is not None:
            greedy = greedy and own.rank == 1
        else:
            greedy = greedy and own.logprob >= max(lp.logprob for lp in position.values())
    return total, greedy


@dataclass(eq=False)
class ScoreStream(Stream):
    """The requests of one `loglikelihood_stream` call: per request its plan
    and the scores of its prompts answered so far."""

    plans: dict[int, Plan] = field(default_factory=dict)
    scores: dict[int, list[tuple[float, bool] | None]] = field(default_factory=dict)

    def expect(self, index: int, plan: Plan, slots: list[Slot]) -> None:
        self.slots[index] = slots
        self.plans[index] = plan
        self.scores[index] = [None] * len(slots)

    def answer(self, index: int, plan: Plan, scores: list[tuple[float, bool] | None]) -> None:
        if plan.rolling_tokens is not None:  # the windows' sums, added in window order
            sums = [scores[k][0] for k in plan.answers if k is not None and scores[k] is not None]  # type: ignore[index]
            self.ready.append((index, RollingLoglikelihood(total(sums), plan.rolling_tokens)))
            return
        pairs = [(0.0, True) if k is None else scores[k] for k in plan.answers]
        self.ready.append((index, [p for p in pairs if p is not None]))

    def finished(self, slot: Slot, output: Any) -> GenerationError | None:
        scores = self.scores.get(slot.index)
        if scores is None:  # its request has failed already
            return None
        self.advance(1)
        failed = engine_failure(output)
        if failed is not None:
            return GenerationError(failed, retryable=True)
        plan = self.plans[slot.index]
        got = score(plan, slot.draw, getattr(output, "prompt_logprobs", None))
        if isinstance(got, str):
            return GenerationError(got, retryable=False)
        scores[slot.draw] = got
        if all(s is not None for s in scores):
            del self.slots[slot.index], self.scores[slot.index], self.plans[slot.index]
            self.answer(slot.index, plan, scores)
        return None

    def fail(self, index: int, error: GenerationError) -> list[Slot]:
        self.scores.pop(index, None)
        self.plans.pop(index, None)
        return super().fail(index, error)


def stream_loglikelihoods(
    provider: Any, requests: list[Request]
) -> Iterator[tuple[int, LoglikelihoodResult]]:
    """`VllmProvider.loglikelihood_stream` (see the module docstring).
    `provider` is the `VllmProvider` (not imported here: vllm.py imports
    this module); its engine, translator, `_drive` and `_track` are used."""
    pending: list[int] = []
    for i, request in enumerate(requests):
        if request.request_type == "loglikelihood_rolling":
            error = unsupported_rolling(request, provider.kind)
        else:
            error = unsupported_loglikelihood(request, provider.kind)
        if error is None:
            pending.append(i)
        else:
            yield i, error
    if not pending:
        return
    llm = provider.llm
    translator = provider._translator
    assert translator is not None  # set with the engine
    tokenizer = llm.get_tokenizer()
    cache: dict[str, list[int]] = {}

    def encode(text: str) -> list[int]:
        if text not in cache:
            cache[text] = list(tokenizer.encode(text))
        return cache[text]

    # lm-eval's vllm model: the start token (else end-of-text) before the first window, and the text
    # tokenized with the tokenizer's special tokens unless it starts with the start token's text.
    bos = getattr(tokenizer, "bos_token_id", None)
    prefix = bos if bos is not None else getattr(tokenizer, "eos_token_id", None)
    bos_text = getattr(tokenizer, "bos_token", None)

    def rolling_encode(text: str) -> list[int]:
        if isinstance(bos_text, str) and bos_text and text.startswith(bos_text):
            return list(tokenizer.encode(text, add_special_tokens=False))
        return encode(text)

    stream = ScoreStream()
    params = translator.sampling_params(max_tokens=1, prompt_logprobs=1, temperature=0.0)

    def add() -> None:
        for i in pending:
            if requests[i].request_type == "loglikelihood_rolling":
                plan = plan_rolling(requests[i], rolling_encode, prefix, translator.max_model_len)
            else:
                plan = plan_request(requests[i], encode, translator.max_model_len)
            if isinstance(plan, GenerationError):
                stream.ready.append((i, plan))
            elif not plan.prompts:
                stream.answer(i, plan, [])
            else:
                _enqueue(provider, llm, i, plan, params, stream, translator)

    yield from provider._drive(llm, stream, add)


def _enqueue(
    provider: Any,
    llm: Any,
    index: int,
    plan: Plan,
    params: Any,
    stream: ScoreStream,
    translator: RequestTranslator,
) -> None:
    """Put one request's prompts into the engine with one `enqueue`, so a
    rejection fails that request only."""
    prompts = [{"prompt_token_ids": list(p)} for p in plan.prompts]
    try:
        engine_ids = llm.enqueue(prompts, [params] * len(prompts), use_tqdm=False)
    except translator.rejections as exc:
        msg = f"vLLM rejected the request: {type(exc).__name__}: {exc}"
        stream.ready.append((index, GenerationError(msg, retryable=False)))
        return
    if len(engine_ids) != len(prompts):
        raise RuntimeError(f"vLLM added {len(engine_ids)} requests for {len(prompts)} prompts")
    stream.expect(index, plan, provider._track(stream, index, engine_ids))
