"""The provider contract: requests, generations, failures and the
`Provider` protocols, with their digests and keys.

Everything here is plain frozen data plus the conversions to and from the JSON
rows of the run dir, so that providers written by users depend on nothing but
this module. What the plugin makes of the results lives with its role: a
rollout's result in `run/execution.py`, `EvalResult` in `run/offline.py`, a
failed attempt in `journal/rows.py`, `Gate` with the task in `task.py`.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import orjson

RequestType = Literal["generate", "loglikelihood", "loglikelihood_rolling"]
# The request types a provider answers through `loglikelihood` / `loglikelihood_stream`.
LOGLIKELIHOOD_TYPES = ("loglikelihood", "loglikelihood_rolling")
Message = dict[str, Any]
Context = str | list[Message]
PromptKey = tuple[str | bytes, str | None]
Instance = dict[str, Any]
# A task's name becomes part of file names in the run dir (and of node ids).
TASK_NAME = re.compile(r"[A-Za-z0-9_.-]+")
RequestKey = tuple[int, str]  # (stage, instance_id)

_SORTED = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


class EvalReplayError(Exception):
    """A user-facing error: bad input, bad configuration, unreadable saved data.

    The message always says which file (and line) and what to do about it.
    """


def to_json(value: Any, option: int = 0) -> bytes:
    """`value` as the JSON the plugin saves: orjson's bytes, except that NaN
    and infinities, which orjson writes as null, raise TypeError (as anything
    else JSON cannot hold does) naming where in the value they are. A value
    saved as null would read back as None at a resume or a replay while the
    live run had NaN: the one check of every value saved (tool results,
    metadata, instances, messages) is this."""
    data = orjson.dumps(value, option=option)
    if b"null" in data:  # NaN and infinities come out as null: look only then
        check_finite(value)
    return data


def check_finite(value: Any, path: str = "") -> None:
    """Raise `to_json`'s TypeError for the first NaN or infinity in `value` (at `path`)."""
    where = non_finite(value, path)
    if where is not None:
        raise TypeError(f"{where}; JSON has no NaN or infinity (it would be saved as null)")


def non_finite(value: Any, path: str = "") -> str | None:
    """The first NaN or infinity in `value` (lists, tuples and mappings
    walked), with its path below `path` (`inf at ['a'][1]`), or None."""
    if (found := _non_finite(value)) is None:
        return None
    bad, keys = found
    where = path + "".join(f"[{key!r}]" for key in reversed(keys))
    return f"{bad!r} at {where}" if where else repr(bad)


def _non_finite(value: Any) -> tuple[float, list[Any]] | None:
    """The first NaN or infinity in `value` and the keys to it, innermost first
    (the path spelled at every step cost more than the walk)."""
    kind = type(value)
    if kind is str or value is None or kind is int or kind is bool:  # most of what a request holds
        return None
    if kind is dict:  # the plain containers before the ABC checks, which cost more than the walk
        items: Iterator[tuple[Any, Any]] = iter(value.items())
    elif kind is list or kind is tuple:
        items = enumerate(value)
    elif isinstance(value, float):
        return None if math.isfinite(value) else (value, [])
    elif isinstance(value, Mapping):
        items = iter(value.items())
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _non_finite(item)
        if found is not None:
            found[1].append(key)
            return found
    return None


def digest(value: Any) -> str:
    """A content digest: blake2b-128 over canonical (sorted-key) JSON bytes
    (`to_json`: a NaN is no null, so it neither collides with one nor is saved)."""
    return hashlib.blake2b(to_json(value, _SORTED), digest_size=16).hexdigest()


def digest_finite(value: Any) -> str:
    """`digest` of a value whose floats the caller has checked (`check_finite`
    over the part not checked before): an agent's turn holds the turns before
    it, and a walk of all of it at every turn was most of `llm.chat`'s cost."""
    return hashlib.blake2b(orjson.dumps(value, option=_SORTED), digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class HashedMessages:
    """A conversation's messages as `chat_digest` hashed them: `state` is the
    digest's state after `{"context":[` and their canonical JSON."""

    messages: Sequence[Any]
    state: Any  # hashlib.blake2b


def content_tail(content: Mapping[str, Any]) -> bytes:
    """What follows a chat request content's messages in its canonical JSON
    (`chat_digest`): the content's other fields, all of which sort after
    "context". TypeError for a value JSON cannot hold (NaN included)."""
    rest = {k: v for k, v in content.items() if k != "context"}
    if any(k < "context" for k in rest):
        raise ValueError(f"a chat content's fields must sort after 'context', got {sorted(rest)}")
    return b"]," + to_json(rest, _SORTED)[1:] if rest else b"]}"


def chat_digest(
    messages: Sequence[Any], tail: bytes, before: HashedMessages | None
) -> tuple[str, HashedMessages]:
    """`digest` of a chat request content (`{"context": messages, ...}`, whose
    `content_tail` is `tail`), hashing only the messages after those of
    `before` when it begins with them: a content's canonical JSON starts with
    its messages, so an agent's turn costs what it adds to the conversation,
    not all of it again (which grows with the square of an episode's length). The
    new messages are checked for NaN (TypeError naming where); the state
    after them is returned for the next turn."""
    start, state = 0, None
    if before is not None and len(before.messages) <= len(messages):
        known = before.messages
        if messages[: len(known)] == known:
            state, start = before.state.copy(), len(known)
    if state is None:
        state = hashlib.blake2b(b'{"context":[', digest_size=16)
    for n in range(start, len(messages)):
        data = orjson.dumps(messages[n], option=_SORTED)
        if b"null" in data:  # NaN and infinities come out as null: look only then
            check_finite(messages[n], f"['context'][{n}]")
        state.update(b"," + data if n else data)
    hashed = HashedMessages(messages, state.copy())
    state.update(tail)
    return state.hexdigest(), hashed


@dataclass(frozen=True)
class Request:
    """One instance's prompt in one stage, asking for some of its rollouts.

    `num_samples` is the task's configured sample count (what a saved run was
    generated with); `rollouts` says which of those samples are wanted now, so
    a resumed or `-k`-narrowed run asks only for what is missing. A provider
    returns one `Generation` per entry of `rollouts`, in that order, or one
    per sample (`num_samples`), of which the plugin takes `rollouts` by index.
    """

    task: str
    instance_id: str
    context: Context
    system_prompt: str | None = None
    request_type: RequestType = "generate"
    num_samples: int = 1
    sampling: Mapping[str, Any] = field(default_factory=dict)
    images: tuple[Any, ...] = ()
    tools: tuple[Any, ...] = ()
    stage: int = 1
    rollouts: tuple[int, ...] = ()
    # A loglikelihood request's continuations (delimiter + choice): the
    # provider scores each as a continuation of the prompt, in this order.
    # A loglikelihood_rolling request has none: its context is the whole text.
    continuations: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.rollouts:
            object.__setattr__(self, "rollouts", tuple(range(self.num_samples)))

    @property
    def prompt_key(self) -> PromptKey:
        return prompt_key(self.context, self.system_prompt)


@dataclass(frozen=True)
class RollingLoglikelihood:
    """A `loglikelihood_rolling` request's answer: the log-probability of the
    whole text (its context), every token scored once, summed over the windows
    a text longer than the model's context is cut into (lm-evaluation-harness's
    rolling windows), and the number of the text's tokens, which a per-token
    perplexity divides by."""

    loglikelihood: float
    tokens: int

    def to_row(self) -> dict[str, Any]:
        return {"loglikelihood": self.loglikelihood, "tokens": self.tokens}

    @classmethod
    def from_row(cls, row: Any, where: str) -> RollingLoglikelihood:
        """Build from a saved row; `where` ("file:line") names it in errors."""
        if not isinstance(row, dict):
            raise EvalReplayError(f"{where}: 'rolling' {ROLLING_SHAPE}, got {row!r:.60}")
        answer = cls(row.get("loglikelihood"), row.get("tokens"))  # type: ignore[arg-type]
        problem = answer.problem()
        if problem is not None:
            raise EvalReplayError(f"{where}: 'rolling' {problem}")
        return cls(float(answer.loglikelihood), answer.tokens)

    def problem(self) -> str | None:
        """What is wrong with a rolling answer (a provider's or a saved one), or None."""
        ll, tokens = self.loglikelihood, self.tokens
        if not is_real(ll) or not math.isfinite(ll) or type(tokens) is not int or tokens < 0:
            return f"{ROLLING_SHAPE}, got loglikelihood={ll!r:.30}, tokens={tokens!r:.30}"
        return None


ROLLING_SHAPE = 'must be {"loglikelihood": a finite number, "tokens": a non-negative integer}'


@dataclass(frozen=True)
class Generation:
    """One sample of the model. `original_text` keeps the raw text when a
    reasoning block was stripped from `text`, so replay can strip again."""

    text: str
    original_text: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    # An assistant turn's tool calls, OpenAI's shape:
    # {"id", "type": "function", "function": {"name", "arguments": JSON text}}.
    tool_calls: tuple[Mapping[str, Any], ...] = ()
    # A loglikelihood request's answer (its `text` is ""): per continuation,
    # the summed log-probability and whether it is the greedy continuation.
    loglikelihoods: tuple[tuple[float, bool], ...] = ()
    # A loglikelihood_rolling request's answer (its `text` is "").
    rolling: RollingLoglikelihood | None = None

    @property
    def raw_text(self) -> str:
        return self.text if self.original_text is None else self.original_text

    def to_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"text": self.text}
        if self.original_text is not None:
            row["original_text"] = self.original_text
        row["finish_reason"] = self.finish_reason
        row["prompt_tokens"] = self.prompt_tokens
        row["completion_tokens"] = self.completion_tokens
        if self.metadata:
            row["metadata"] = dict(self.metadata)
        if self.tool_calls:
            row["tool_calls"] = [dict(call) for call in self.tool_calls]
        if self.loglikelihoods:
            row["loglikelihoods"] = [[ll, greedy] for ll, greedy in self.loglikelihoods]
        if self.rolling is not None:
            row["rolling"] = self.rolling.to_row()
        return row

    @classmethod
    def from_row(cls, row: Any, where: str) -> Generation:
        """Build from a saved row; `where` ("file:line") names it in errors."""
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise EvalReplayError(f"{where}: a generation must be an object with a string 'text'")
        original = row.get("original_text")
        metadata = row.get("metadata") or {}
        if original is not None and not isinstance(original, str):
            raise EvalReplayError(f"{where}: 'original_text' must be a string or null")
        if not isinstance(metadata, dict):
            raise EvalReplayError(f"{where}: 'metadata' must be an object")
        tool_calls = row.get("tool_calls") or []
        problem = tool_calls_problem(tool_calls) if isinstance(tool_calls, list) else "must be a list"
        if problem is not None:
            raise EvalReplayError(f"{where}: 'tool_calls' {problem}")
        pairs = row.get("loglikelihoods") or []
        problem = loglikelihoods_problem(pairs) if isinstance(pairs, list) else "must be a list"
        if problem is not None:
            raise EvalReplayError(f"{where}: 'loglikelihoods' {problem}")
        rolling = row.get("rolling")
        return cls(
            text=row["text"],
            original_text=original,
            finish_reason=row.get("finish_reason"),
            prompt_tokens=_opt_int(row.get("prompt_tokens"), where, "prompt_tokens"),
            completion_tokens=_opt_int(row.get("completion_tokens"), where, "completion_tokens"),
            metadata=metadata,
            tool_calls=tuple(tool_calls),
            loglikelihoods=tuple((float(ll), greedy) for ll, greedy in pairs),
            rolling=None if rolling is None else RollingLoglikelihood.from_row(rolling, where),
        )

    def problem(self) -> str | None:
        """What is wrong with a generation a provider handed back, or None.

        Providers are user code: a `text` of None, a token count given as a
        string or a metadata value JSON cannot hold fails that request (naming
        the field) instead of being scored as 0 or breaking the journal."""
        if not isinstance(self.text, str):
            return f"'text' must be a string, got {type(self.text).__name__}"
        if self.original_text is not None and not isinstance(self.original_text, str):
            return f"'original_text' must be a string or None, got {type(self.original_text).__name__}"
        if self.finish_reason is not None and not isinstance(self.finish_reason, str):
            return f"'finish_reason' must be a string or None, got {self.finish_reason!r:.40}"
        for name, value in (
            ("prompt_tokens", self.prompt_tokens),
            ("completion_tokens", self.completion_tokens),
        ):
            if value is not None and (type(value) is not int or value < 0):
                return f"{name!r} must be a non-negative integer or None, got {value!r:.40}"
        if type(self.metadata) is not dict and not isinstance(self.metadata, Mapping):
            return f"'metadata' must be a mapping, got {type(self.metadata).__name__}"
        if not isinstance(self.tool_calls, (tuple, list)):
            return f"'tool_calls' must be a tuple of tool calls, got {type(self.tool_calls).__name__}"
        if (calls := tool_calls_problem(self.tool_calls)) is not None:
            return f"'tool_calls' {calls}"
        if not isinstance(self.loglikelihoods, (tuple, list)):
            got = type(self.loglikelihoods).__name__
            return f"'loglikelihoods' must be a tuple of (float, bool) pairs, got {got}"
        if (pairs := loglikelihoods_problem(self.loglikelihoods)) is not None:
            return f"'loglikelihoods' {pairs}"
        if self.rolling is not None:
            if not isinstance(self.rolling, RollingLoglikelihood):
                return f"'rolling' must be a RollingLoglikelihood or None, got {type(self.rolling).__name__}"
            if (rolling := self.rolling.problem()) is not None:
                return f"'rolling' {rolling}"
        # What JSON may refuse (surrogates, non-JSON metadata, NaN): the rest was checked above.
        # Not `to_row()`, which copies the tool calls and metadata to encode them once more.
        savable = {"text": self.text, "metadata": self.metadata, "tool_calls": self.tool_calls}
        for name, value in (("original_text", self.original_text), ("finish_reason", self.finish_reason)):
            if value is not None:  # (a null would have `to_json` walk the whole for a NaN)
                savable[name] = value
        try:
            to_json(savable)
        except TypeError as exc:
            return f"cannot be saved as JSON ({exc})"
        return None


def tool_calls_problem(calls: Sequence[Any]) -> str | None:
    """What is wrong with a turn's tool calls (OpenAI's shape), or None."""
    for n, call in enumerate(calls):
        function = call.get("function") if type(call) is dict or isinstance(call, Mapping) else None
        if (
            not (type(function) is dict or isinstance(function, Mapping))
            or not isinstance(call.get("id"), str)
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments"), str)
        ):
            return (
                f"entry {n} ({call!r:.80}) is not a tool call: give "
                '{"id": str, "type": "function", "function": {"name": str, "arguments": JSON text}}'
            )
    return None


def loglikelihoods_problem(pairs: Sequence[Any]) -> str | None:
    """What is wrong with a loglikelihood answer, or None: each entry must be a
    (log-probability, is_greedy) pair with a finite log-probability (an
    infinite or NaN one would be scored as a choice nobody could beat)."""
    for n, pair in enumerate(pairs):
        ok = isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[1], bool)
        ll = pair[0] if ok else None
        if not ok or not is_real(ll) or not math.isfinite(ll):
            return f"entry {n} ({pair!r:.60}) is not a (finite log-probability, is_greedy: bool) pair"
    return None


def _opt_int(value: Any, where: str, name: str) -> int | None:
    if value is None or (type(value) is int and value >= 0):
        return value
    raise EvalReplayError(f"{where}: {name!r} must be a non-negative integer or null, got {value!r:.40}")


@dataclass(frozen=True)
class GenerationError:
    """A request that failed. Retryable ones (timeouts, dropped connections,
    5xx) are tried again up to the attempt cap; the rest are final at once."""

    message: str
    retryable: bool = False


GenerateResult = list[Generation] | GenerationError
# Per continuation of a loglikelihood request: (summed log-probability, is greedy);
# for a loglikelihood_rolling request, the whole text's `RollingLoglikelihood`.
LoglikelihoodResult = list[tuple[float, bool]] | RollingLoglikelihood | GenerationError


@runtime_checkable
class Provider(Protocol):
    """Turns a batch of requests into generations, one entry per request.

    Providers see a whole stage (or a large chunk of it) at once. Optional
    attributes the plugin reads when present: `kind` and `model` (recorded in
    the manifest and the config fingerprint), `batch_size` (the largest chunk
    it wants, None for all at once) and `close()` (called at session end).
    """

    def generate(self, requests: list[Request]) -> list[GenerateResult]: ...


@runtime_checkable
class LoglikelihoodProvider(Protocol):
    """A provider that serves multiple-choice and bits-per-byte tasks.

    `loglikelihood(requests)` answers each `loglikelihood` request with one
    `(summed log-probability, is_greedy)` pair per entry of its
    `continuations`, in order: the log-probability of the continuation's
    tokens given the prompt, and whether greedy decoding from the prompt
    would produce exactly those tokens. A `loglikelihood_rolling` request
    (perplexity: a text and no continuations) is answered with one
    `RollingLoglikelihood`: the whole text's summed log-probability, cut into
    windows of the model's context as lm-evaluation-harness cuts it, and its
    token count. A provider may also stream these with
    `loglikelihood_stream(requests)`, yielding `(index, result)` pairs as
    `StreamingProvider.generate_stream` does.
    """

    def loglikelihood(self, requests: list[Request]) -> list[LoglikelihoodResult]: ...


@runtime_checkable
class StreamingProvider(Protocol):
    """A provider that hands back each request's result as soon as it is ready.

    `generate_stream(requests)` yields `(index, result)` pairs, `index` being
    the request's position in `requests`, each index once, in whatever order
    the requests finish. The plugin scores and journals results in small
    groups as they arrive, so a crash loses only what was in flight. A request
    the stream never yields is a retryable failure. The plugin may stop
    iterating early (an interrupt, a timeout): closing the generator must
    cancel what is still in flight and return promptly.

    A provider may also enforce a per-request time limit itself and say so
    with a `request_timeout` attribute (seconds, or None for no limit); the
    plugin then leaves `--evalreplay-timeout` to it. For a provider without
    that attribute the plugin enforces the limit from outside.
    """

    def generate(self, requests: list[Request]) -> list[GenerateResult]: ...

    def generate_stream(self, requests: list[Request]) -> Iterator[tuple[int, GenerateResult]]: ...


def prompt_key(context: Context, system_prompt: str | None) -> PromptKey:
    """The replay key: context plus system prompt, chat messages compared as
    data (canonical JSON, keys sorted). Exact, with no hash to collide; a text
    context stays a `str` and a chat one becomes `bytes`, so the two never meet.
    The key lives in one process only, so Python's own str hashing serves."""
    if isinstance(context, str):
        return (context, system_prompt)
    return (orjson.dumps(context, option=orjson.OPT_SORT_KEYS), system_prompt)


def request_content(request: Request) -> dict[str, Any]:
    """What a generation answers: the part of a request that reaches the model."""
    content: dict[str, Any] = {
        "request_type": request.request_type,
        "context": request.context,
        "system_prompt": request.system_prompt,
        "sampling": dict(request.sampling),
    }
    if request.images:
        content["images"] = list(request.images)
    if request.tools:
        content["tools"] = list(request.tools)
    if request.continuations:
        content["continuations"] = list(request.continuations)
    return content


def request_digest(request: Request) -> str:
    """The digest reuse compares: a saved generation answers a request when
    the digests of their `request_content` match."""
    return digest(request_content(request))


def scored_loglikelihoods(generation: Generation) -> tuple[tuple[float, bool], ...]:
    """The (log-likelihood, is_greedy) pairs a scorer is handed: a
    loglikelihood answer's, or a rolling answer's total as its one pair
    (never greedy: a rolling answer does not say)."""
    if generation.rolling is not None:
        return ((generation.rolling.loglikelihood, False),)
    return generation.loglikelihoods


def is_real(value: Any) -> bool:
    """A real number, not a bool (which Python counts as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
