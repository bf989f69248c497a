"""loglikelihood_rolling requests on the openai provider.

A text's windows are lm-evaluation-harness's (rolling_requests.py), over the
server's own tokens, so the calls are vLLM's tokenizer routes beside the
OpenAI API (at the server's root, as lm-eval's `tokenizer_backend=remote`
uses them), then one echo:

1. once per provider, `GET /tokenizer_info` for the start token (else the
   end-of-text token), and `POST /tokenize` of it for its id: the prefix
   token lm-eval puts before the first window;
2. `POST /tokenize` of the text without special tokens: its tokens, and the
   model's context length (`max_model_len`) the windows are cut to;
3. one `POST /completions` whose `prompt` is the windows as token ids, with
   `echo: true`, `logprobs: 1` and `max_tokens: 0`: each window's scored
   tokens' log-probabilities, summed per window and then over the windows.

All three run one after another on one worker thread, each with the retries,
time limits and balancing of any call (openai_calls.py). `vllm serve` has
these routes (`/tokenizer_info` with `--enable-tokenizer-info-endpoint`); a
server without them fails the request, naming the route.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import orjson

from pytest_evalreplay.model import GenerationError, LoglikelihoodResult, Request, RollingLoglikelihood
from pytest_evalreplay.providers.engine_requests import text_prompt
from pytest_evalreplay.providers.openai_calls import Caller
from pytest_evalreplay.providers.openai_loglikelihood import combine_scores
from pytest_evalreplay.providers.openai_watchdog import Run
from pytest_evalreplay.providers.openai_wire import (
    TEXT_PATH,
    TOKENIZE_PATH,
    CallFailure,
    Malformed,
    parse_echoes,
)
from pytest_evalreplay.providers.rolling_requests import (
    NO_MAX_LENGTH,
    Window,
    rolling_windows,
    total,
    unsupported_rolling,
    window_sum,
)

TOKENIZER_INFO_PATH = "/../tokenizer_info"
ROUTES = (
    "loglikelihood_rolling requests need the server's tokenizer routes (POST /tokenize, GET "
    "/tokenizer_info: `vllm serve --enable-tokenizer-info-endpoint`)"
)


@dataclass(frozen=True)
class Tokenized:
    """A text's tokens as the server made them, and the model's context length."""

    tokens: tuple[int, ...]
    max_model_len: int | None


def parse_tokenized(raw: bytes) -> Tokenized | CallFailure:
    """A `/tokenize` answer (`{"tokens": [...], "max_model_len": N}`), or why it is none."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        return Malformed(f"the server's /tokenize answer holds no 'tokens' list: {raw[:200]!r}", False)
    limit = data.get("max_model_len")
    return Tokenized(tuple(tokens), limit if type(limit) is int and limit > 0 else None)


def parse_special_tokens(raw: bytes) -> tuple[str | None, str | None] | CallFailure:
    """The start and end-of-text tokens' texts from a `/tokenizer_info` answer."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        return Malformed(f"the server's /tokenizer_info answer is not an object: {raw[:200]!r}", False)
    bos, eos = (
        data.get(k) if isinstance(data.get(k), str) and data.get(k) else None
        for k in ("bos_token", "eos_token")
    )
    if bos is None and eos is None:
        return CallFailure(
            "the server's /tokenizer_info names no bos_token or eos_token, and a loglikelihood_rolling "
            "text's first token is scored after one",
            retryable=False,
        )
    return bos, eos


def score_windows(raw: bytes, windows: list[Window]) -> float | CallFailure:
    """The text's log-likelihood from the echo of its windows."""
    echoed = parse_echoes(raw, len(windows))
    if isinstance(echoed, CallFailure):
        return echoed
    sums = []
    for k, (window, echo) in enumerate(zip(windows, echoed, strict=True)):
        if len(echo.logprobs) != len(window.tokens):
            return CallFailure(
                f"window {k}: the server echoed {len(echo.logprobs)} tokens for a prompt of "
                f"{len(window.tokens)} token ids",
                retryable=False,
            )
        values = echo.logprobs[len(window.context) :]
        if any(v is None for v in values):
            return CallFailure(f"window {k}: the server gave no log-probability for a scored token", False)
        sums.append(window_sum(values))  # type: ignore[arg-type]
    return total(sums)


@dataclass
class ServerTokenizer:
    """The prefix token's id, asked of the server once per provider (the
    first request to need it asks; the others wait for its answer)."""

    model: str
    _prefix: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def prefix(self, caller: Caller, run: Run) -> int | CallFailure | None:
        """The start token's id, or the end-of-text token's where there is no
        start token or its id is 0 (lm-eval's remote tokenizer takes
        `bos_token_id or eos_token_id`)."""
        with self._lock:
            if self._prefix is None:
                names = caller.call(run, TOKENIZER_INFO_PATH, b"", parse_special_tokens, method="GET")
                if not isinstance(names, tuple):
                    return names
                ids: list[int] = []
                for text in names:
                    if text is None:
                        continue
                    got = self.tokenize(caller, run, text)
                    if not isinstance(got, Tokenized):
                        return got
                    if not got.tokens:
                        return CallFailure(f"the server's /tokenize gave no token for {text!r}", False)
                    ids.append(got.tokens[0])
                    if got.tokens[0]:
                        break
                self._prefix = next((i for i in ids if i), ids[0])
            return self._prefix

    def tokenize(self, caller: Caller, run: Run, text: str) -> Tokenized | CallFailure | None:
        body = {"model": self.model, "prompt": text, "add_special_tokens": False}
        return caller.call(run, TOKENIZE_PATH, orjson.dumps(body), parse_tokenized)


@dataclass(frozen=True)
class RollingCall:
    """A rolling request's calls (see the module docstring), made in turn by
    the worker thread that runs this."""

    text: str
    tokenizer: ServerTokenizer

    def __call__(self, caller: Caller, run: Run) -> RollingLoglikelihood | CallFailure | None:
        prefix = self.tokenizer.prefix(caller, run)
        if not isinstance(prefix, int):
            return _routes(prefix)
        got = self.tokenizer.tokenize(caller, run, self.text)
        if not isinstance(got, Tokenized):
            return _routes(got)
        if got.max_model_len is None:
            return CallFailure(
                f"{NO_MAX_LENGTH}: the server's /tokenize answer gives no max_model_len (vllm serve's does)",
                retryable=False,
            )
        try:
            windows = rolling_windows(got.tokens, prefix, got.max_model_len)
        except ValueError as exc:
            return CallFailure(str(exc), retryable=False)
        if not windows:
            return RollingLoglikelihood(0.0, 0)
        body = {
            "model": self.tokenizer.model,
            "prompt": [list(w.tokens) for w in windows],
            "echo": True,
            "logprobs": 1,
            "max_tokens": 0,
            "temperature": 0,
        }
        scored = caller.call(run, TEXT_PATH, orjson.dumps(body), lambda raw: score_windows(raw, windows))
        if not isinstance(scored, float):
            return scored
        return RollingLoglikelihood(scored, len(got.tokens))


def _routes(outcome: CallFailure | None) -> CallFailure | None:
    """A tokenizer call's failure, saying what the routes are for where the server lacks them."""
    if outcome is None or "HTTP 404" not in outcome.message:
        return outcome
    return CallFailure(f"{ROUTES}: {outcome.message}", retryable=False)


def plan_rolling(
    request: Request, kind: str, tokenizer: ServerTokenizer
) -> list[RollingCall] | GenerationError:
    """A rolling request's one unit of calls, or why it cannot be scored."""
    error = unsupported_rolling(request, kind)
    if error is not None:
        return error
    assert isinstance(request.context, str)
    return [RollingCall(text_prompt(request.context, request.system_prompt), tokenizer)]


def combine_answers(outcomes: list[object]) -> LoglikelihoodResult:
    """A rolling request's result from its one unit's outcome; a choices
    request's from its calls' (`combine_scores`)."""
    if len(outcomes) == 1 and isinstance(outcomes[0], RollingLoglikelihood):
        return outcomes[0]
    return combine_scores(outcomes)
