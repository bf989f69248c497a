"""How a `loglikelihood_rolling` request (a perplexity task's text) is cut
into windows, the same for every engine-backed provider (vllm, openai), so
both score the tokens lm-evaluation-harness scores.

The cut is lm-eval's (`get_rolling_token_windows` then `make_disjoint_window`,
with context 1 and windows of the model's context length less 2, as both its
`vllm` and its API models call them): the first window is a prefix token
(the start token, else the end-of-text token) and the first tokens of the
text, every one of them scored; each later window scores the next tokens,
after as many of the tokens before them as fit. Every token of the text is
scored exactly once, and the text's log-likelihood is the sum over windows
of each window's sum, in window order, as lm-eval adds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_evalreplay.model import GenerationError, Request


@dataclass(frozen=True)
class Window:
    """One window: `context` tokens, then the `scored` tokens whose
    log-probabilities count (the context's own do not)."""

    context: tuple[int, ...]
    scored: tuple[int, ...]

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.context + self.scored


def rolling_windows(tokens: Sequence[int], prefix: int, max_length: int) -> list[Window]:
    """The windows of a text of `tokens` for a model of context `max_length`:
    each scores at most `max_length - 2` tokens after at least one, so a
    window is at most `max_length - 1` tokens and leaves room for the one
    generated token an engine asks for."""
    seq_len = max_length - 2
    if seq_len < 1:
        raise ValueError(f"a model context of {max_length} tokens leaves no room for a window")
    tokens = list(tokens)
    if not tokens:
        return []
    first = min(seq_len, len(tokens))
    windows = [Window((prefix,), tuple(tokens[:first]))]
    done = first
    while done < len(tokens):
        count = min(len(tokens) - done, seq_len)
        end = done + count
        # lm-eval's window is tokens[end - seq_len - 1 : end - 1] -> tokens[end - count : end],
        # made disjoint: its context is what precedes the scored tokens in it.
        start = max(end - seq_len - 1, 0)
        windows.append(Window(tuple(tokens[start : end - count]), tuple(tokens[end - count : end])))
        done = end
    return windows


def window_sum(values: Sequence[float]) -> float:
    """One window's log-likelihood, as lm-eval adds it (the builtin `sum`,
    so a Python that compensates float sums does so on both sides)."""
    return sum(values)


def total(window_sums: Sequence[float]) -> float:
    """The text's log-likelihood from its windows', in window order, as lm-eval adds them."""
    return sum(window_sums)


def unsupported_rolling(request: Request, kind: str) -> GenerationError | None:
    """The terminal error for a rolling request the `kind` provider cannot score, or None."""
    if request.images:
        what = "loglikelihood_rolling requests with images"
    elif not isinstance(request.context, str):
        what = (
            "loglikelihood_rolling requests with a chat context (a list of messages): a text's "
            "log-likelihood is taken over the text itself; give the task a text"
        )
    elif request.continuations:
        what = "loglikelihood_rolling requests with continuations (the text is the context alone)"
    else:
        return None
    return GenerationError(f"the {kind} provider does not support {what}", retryable=False)


NO_MAX_LENGTH = (
    "the model's context length is not known, and a loglikelihood_rolling text is cut into windows of it"
)
