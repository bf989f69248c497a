"""Loglikelihood requests on the openai provider.

A request is one POST to `/completions` whose `prompt` is a list: context +
continuation for each distinct continuation (the context's trailing
whitespace moved to the continuations, as lm-evaluation-harness does), with
`echo: true`, `logprobs: 1` and `max_tokens: 0`. The server answers each
prompt with its own tokens, their log-probabilities and the best one at each
position. The context's token count says where each continuation's tokens
start (the split of loglikelihood_requests.py, which the vllm provider makes
with the engine's tokenizer): its log-likelihood is the sum from there, and
it is greedy when each of its tokens is the best at its position.

The count comes from the server's `/tokenize` (`vllm serve` has it), asked
beside the echo, so the model processes one prompt per continuation, as many
as lm-eval sends; a server without `/tokenize` gets the context alone as the
echo's first prompt instead, its echoed tokens counted. Both give the same
count, so the same log-likelihoods. The calls are retried, timed and
balanced over the servers exactly as a generation's (openai_calls.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_evalreplay.model import GenerationError, LoglikelihoodResult, Request
from pytest_evalreplay.providers.loglikelihood_requests import (
    continuation_start,
    request_pairs,
    unsupported_loglikelihood,
)
from pytest_evalreplay.providers.openai_calls import Call
from pytest_evalreplay.providers.openai_wire import (
    TEXT_PATH,
    TOKENIZE_PATH,
    CallFailure,
    Echoed,
    echo_body,
    parse_echoes,
    parse_token_count,
    tokenize_body,
)
from pytest_evalreplay.values.credentials import redact_url

Scores = list[tuple[float, bool]]


def plan_scoring(request: Request, kind: str, model: str, tokenize: bool) -> list[Call] | GenerationError:
    """A loglikelihood request's calls, or why it cannot be scored. `tokenize`:
    the server counts the context's tokens at `/tokenize` (one call more, no
    prompt more); else the echo carries the context alone first."""
    error = unsupported_loglikelihood(request, kind)
    if error is not None:
        return error
    pairs = request_pairs(request)
    wholes = list(dict.fromkeys(pairs.wholes()))
    answers = tuple(wholes.index(w) for w in pairs.wholes())
    if tokenize:

        def parse_wholes(raw: bytes) -> Echoes | CallFailure:
            echoed = parse_echoes(raw, len(wholes))
            return echoed if isinstance(echoed, CallFailure) else Echoes(tuple(echoed), answers)

        return [
            Call(TOKENIZE_PATH, tokenize_body(model, pairs.context), parse_token_count),
            Call(TEXT_PATH, echo_body(model, wholes), parse_wholes),
        ]

    def parse(raw: bytes) -> Scores | CallFailure:
        echoed = parse_echoes(raw, 1 + len(wholes))
        if isinstance(echoed, CallFailure):
            return echoed
        return Echoes(tuple(echoed[1:]), answers).scores(len(echoed[0].logprobs))

    return [Call(TEXT_PATH, echo_body(model, [pairs.context, *wholes]), parse)]


@dataclass(frozen=True)
class Echoes:
    """The echoes of a request's distinct context + continuation texts, and
    which of them answers each of its continuations (`answers[k]`)."""

    wholes: tuple[Echoed, ...]
    answers: tuple[int, ...]

    def scores(self, context_tokens: int) -> Scores | CallFailure:
        """Each continuation's (log-likelihood, is_greedy), given the context's token count."""
        scores = [score_echo(context_tokens, e) for e in self.wholes]
        for k, got in enumerate(scores):
            if isinstance(got, str):
                return CallFailure(f"continuation {self.answers.index(k)}: {got}", retryable=False)
        return [scores[k] for k in self.answers]  # type: ignore[misc]


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
    """A request's result from its calls' outcomes: the scores, or the
    context's token count and the continuations' echoes."""
    if any(o is None for o in outcomes):
        return GenerationError("cancelled: the openai provider was closed", retryable=True)
    if len(outcomes) == 2 and not any(isinstance(o, CallFailure) for o in outcomes):
        count, echoes = outcomes
        assert isinstance(count, int) and isinstance(echoes, Echoes)
        outcomes = [echoes.scores(count)]
    failure = next((o for o in outcomes if isinstance(o, CallFailure)), None)
    if failure is not None:
        return GenerationError(redact_url(failure.message), retryable=failure.retryable)
    (outcome,) = outcomes
    assert isinstance(outcome, list)
    return outcome
