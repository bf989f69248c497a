"""Loglikelihood requests on the openai provider.

A request is one POST to `/completions` whose `prompt` is a list: the
context (its trailing whitespace moved to the continuations, as
lm-evaluation-harness does), then context + continuation for each distinct
continuation, with `echo: true`, `logprobs: 1` and `max_tokens: 0`. The
server answers each prompt with its own tokens, their log-probabilities and
the best one at each position. The context's token count says where each
continuation's tokens start (the split of loglikelihood_requests.py, which
the vllm provider makes with the engine's tokenizer): its log-likelihood is
the sum from there, and it is greedy when each of its tokens is the best at
its position. The call is retried, timed and balanced over the servers
exactly as a generation's (openai_calls.py).
"""

from __future__ import annotations

from pytest_evalreplay.credentials import redact_url
from pytest_evalreplay.model import GenerationError, LoglikelihoodResult, Request
from pytest_evalreplay.providers.loglikelihood_requests import (
    continuation_start,
    request_pairs,
    unsupported_loglikelihood,
)
from pytest_evalreplay.providers.openai_calls import Call
from pytest_evalreplay.providers.openai_wire import (
    TEXT_PATH,
    CallFailure,
    Echoed,
    echo_body,
    parse_echoes,
)

Scores = list[tuple[float, bool]]


def plan_scoring(request: Request, kind: str, model: str) -> list[Call] | GenerationError:
    """A loglikelihood request's one call, or why it cannot be scored."""
    error = unsupported_loglikelihood(request, kind)
    if error is not None:
        return error
    pairs = request_pairs(request)
    wholes = list(dict.fromkeys(pairs.wholes()))
    answers = tuple(wholes.index(w) for w in pairs.wholes())

    def parse(raw: bytes) -> Scores | CallFailure:
        echoed = parse_echoes(raw, 1 + len(wholes))
        if isinstance(echoed, CallFailure):
            return echoed
        scores: list[tuple[float, bool] | str] = [score_echo(len(echoed[0].logprobs), e) for e in echoed[1:]]
        for k, got in enumerate(scores):
            if isinstance(got, str):
                return CallFailure(f"continuation {answers.index(k)}: {got}", retryable=False)
        return [scores[k] for k in answers]  # type: ignore[misc]

    return [Call(TEXT_PATH, echo_body(model, [pairs.context, *wholes]), parse)]


def score_echo(context_tokens: int, whole: Echoed) -> tuple[float, bool] | str:
    """A continuation's (log-likelihood, is_greedy) from the echo of context +
    continuation, given the context's own token count; or why it has none."""
    start = continuation_start(context_tokens, len(whole.logprobs))
    if isinstance(start, str):
        return start
    total = 0.0
    greedy = True
    for p in range(start, len(whole.logprobs)):
        own, best = whole.logprobs[p], whole.best[p]
        if own is None or best is None:
            return f"the server gave no log-probability for token {p} of the prompt"
        total += own
        greedy = greedy and own >= best
    return total, greedy


def combine_scores(outcomes: list[object]) -> LoglikelihoodResult:
    """A request's result from its one call's outcome."""
    (outcome,) = outcomes
    if outcome is None:
        return GenerationError("cancelled: the openai provider was closed", retryable=True)
    if isinstance(outcome, CallFailure):
        return GenerationError(redact_url(outcome.message), retryable=outcome.retryable)
    assert isinstance(outcome, list)
    return outcome
