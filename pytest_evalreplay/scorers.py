"""Built-in scorers and the reasoning strip.

A built-in scorer compares the model's text with the task's target; any
callable `scorer(text, instance)` works in their place. Built-ins are frozen
dataclasses so their parameters are part of the config fingerprint.
"""

from __future__ import annotations

import math
import numbers
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_evalreplay.model import EvalReplayError, Generation

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_UNCLOSED_THINK = re.compile(r"<think>.*\Z", re.DOTALL)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")
_PUNCT = str.maketrans("", "", string.punctuation)


def strip_reasoning(text: str) -> str:
    """Drop `<think>...</think>` blocks; an unclosed block drops to the end
    (the model ran out of tokens while thinking, so there is no answer)."""
    return _UNCLOSED_THINK.sub("", _THINK.sub("", text)).strip()


def reasoning_stripped(generation: Generation) -> Generation:
    """A generation as a task with `strip_reasoning=True` saves and scores it:
    the stripped text, the raw one kept (log-likelihoods have no text).
    The session and the merge's run dir both apply it here."""
    if generation.loglikelihoods:
        return generation
    raw = generation.raw_text
    return Generation(
        text=strip_reasoning(raw),
        original_text=raw,
        finish_reason=generation.finish_reason,
        prompt_tokens=generation.prompt_tokens,
        completion_tokens=generation.completion_tokens,
        metadata=generation.metadata,
    )


def normalize(text: str) -> str:
    """Case-fold, drop punctuation and articles, squeeze whitespace."""
    text = text.lower().translate(_PUNCT)
    words = [w for w in text.split() if w not in ("a", "an", "the")]
    return " ".join(words)


def _extract(text: str, pattern: str | None) -> str | None:
    """The answer span: the first group of the last match of `pattern` (add `(?s)`
    to the pattern to let `.` cross lines)."""
    if pattern is None:
        return text
    matches = list(re.finditer(pattern, text))
    if not matches:
        return None
    last = matches[-1]
    return last.group(1) if last.groups() else last.group(0)


@dataclass(frozen=True)
class ExactMatch:
    """1.0 when the extracted answer equals the target (after normalisation)."""

    extract: str | None = None
    normalize: bool = True
    name: str = "exact_match"

    def score(self, text: str, target: Any) -> float:
        answer = self.answer(text)
        if answer is None:
            return 0.0
        targets = target if isinstance(target, (list, tuple)) else [target]
        prep = normalize if self.normalize else str.strip
        return float(any(answer == prep(str(t)) for t in targets))

    def answer(self, text: str) -> str | None:
        """What `score` compares (maj@k's vote): the extracted span as compared, or None."""
        span = _extract(text, self.extract)
        if span is None:
            return None
        return normalize(span) if self.normalize else span.strip()


@dataclass(frozen=True)
class NumericMatch:
    """1.0 when the extracted number is within `tolerance` (absolute or
    relative) of the target. Without `extract`, the last number in the text."""

    extract: str | None = None
    tolerance: float = 1e-6
    relative: bool = False
    name: str = "numeric_match"

    def score(self, text: str, target: Any) -> float:
        got = self.answer(text)
        if got is None:
            return 0.0
        try:
            want = float(str(target).replace(",", ""))
        except ValueError:
            return 0.0
        if self.relative:
            return float(math.isclose(got, want, rel_tol=self.tolerance, abs_tol=0.0))
        return float(abs(got - want) <= self.tolerance)

    def answer(self, text: str) -> float | None:
        """What `score` compares (maj@k's vote): the extracted number, or None."""
        span = _extract(text, self.extract)
        numbers = _NUMBER.findall(span) if span is not None else []
        if not numbers:
            return None
        try:
            return float(numbers[-1].replace(",", ""))
        except ValueError:
            return None


@dataclass(frozen=True)
class Contains:
    """1.0 when the target appears in the text."""

    normalize: bool = True
    name: str = "contains"

    def score(self, text: str, target: Any) -> float:
        targets = target if isinstance(target, (list, tuple)) else [target]
        prep = normalize if self.normalize else (lambda s: s)
        hay = self.answer(text)
        return float(any(prep(str(t)) in hay for t in targets))

    def answer(self, text: str) -> str:
        """What `score` searches (maj@k's vote): the whole text as compared."""
        return normalize(text) if self.normalize else text


MC_METRICS = ("acc", "acc_norm", "bpb")
LN2 = math.log(2)


def argmax(values: Sequence[float]) -> int:
    """The first index of the largest value (numpy's argmax, which lm-eval uses)."""
    best = 0
    for i, value in enumerate(values):
        if value > values[best]:
            best = i
    return best


def acc(loglikelihoods: Sequence[float], gold: int) -> float:
    """1.0 when the gold choice has the highest log-likelihood (ties: the first
    choice wins), as lm-evaluation-harness's `process_results` for
    `multiple_choice`: `np.argmax(lls) == gold`."""
    return float(argmax(loglikelihoods) == gold)


def acc_norm(loglikelihoods: Sequence[float], choices: Sequence[str], gold: int) -> float:
    """`acc` over each log-likelihood divided by its choice's length in
    characters (the choice text, without the delimiter), as lm-eval's
    `np.argmax(lls / completion_len)` with `completion_len = len(choice)`.
    An empty choice counts one character (lm-eval would divide by 0)."""
    return float(argmax([ll / max(len(c), 1) for ll, c in zip(loglikelihoods, choices, strict=True)]) == gold)


def bpb(loglikelihood: float, continuation: str) -> float:
    """Bits per byte of a continuation: -loglikelihood / (ln 2 * its UTF-8
    bytes), as olmo-eval's `bits_per_byte` (`-sum_logits / (num_bytes *
    log(2))`); the continuation includes its delimiter. An empty one counts
    one byte."""
    return -loglikelihood / (LN2 * max(len(continuation.encode("utf-8")), 1))


@dataclass(frozen=True)
class MultipleChoice:
    """A choices task's scores from its per-choice log-likelihoods: `acc`,
    `acc_norm` and `bpb` (bits per byte of the gold continuation)."""

    metrics: tuple[str, ...] = ("acc", "acc_norm")
    name: str = "multiple_choice"

    def scores(
        self, loglikelihoods: Sequence[float], choices: Sequence[str], gold: int, delimiter: str
    ) -> dict[str, float]:
        out: dict[str, float] = {}
        for metric in self.metrics:
            if metric == "acc":
                out["acc"] = acc(loglikelihoods, gold)
            elif metric == "acc_norm":
                out["acc_norm"] = acc_norm(loglikelihoods, choices, gold)
            else:
                out["bpb"] = bpb(loglikelihoods[gold], delimiter + choices[gold])
        return out


def multiple_choice(metrics: Sequence[str] = ("acc", "acc_norm")) -> MultipleChoice:
    """The scorer of a choices task: any of `acc`, `acc_norm`, `bpb`."""
    __tracebackhide__ = True
    if isinstance(metrics, str):
        metrics = (metrics,)
    picked = tuple(metrics) if isinstance(metrics, (list, tuple)) else ()
    wrong = [m for m in picked if m not in MC_METRICS]
    if not picked or wrong or len(set(picked)) != len(picked):
        raise EvalReplayError(
            f"scorers.multiple_choice(metrics={metrics!r}): give one or more distinct metrics of "
            f"{', '.join(MC_METRICS)}"
        )
    return MultipleChoice(metrics=picked)


BuiltinScorer = ExactMatch | NumericMatch | Contains
BUILTIN_TYPES = (ExactMatch, NumericMatch, Contains)

BUILTINS: dict[str, BuiltinScorer] = {
    "exact_match": ExactMatch(),
    "numeric_match": NumericMatch(),
    "contains": Contains(),
}


def exact_match(extract: str | None = None, normalize: bool = True) -> ExactMatch:
    return ExactMatch(extract=extract, normalize=normalize)


def numeric_match(
    extract: str | None = None, tolerance: float = 1e-6, relative: bool = False
) -> NumericMatch:
    return NumericMatch(extract=extract, tolerance=tolerance, relative=relative)


def named_scores(value: Any, task: str, scorer: str) -> dict[str, float]:
    """A scorer's return value as named float scores: a float or bool under the
    scorer's name, or a dict that is never empty (a rollout with no score would
    pass unscored) and has no two keys with one name once saved."""
    if not isinstance(value, Mapping):
        return {scorer: _as_float(value, task, scorer)}
    where = f"task {task!r}: scorer {scorer!r}"
    if not value:
        raise EvalReplayError(
            f"{where} returned no scores (an empty dict); return a float, a bool, "
            "or a dict with at least one score"
        )
    out: dict[str, float] = {}
    first: dict[str, Any] = {}
    for k, v in value.items():
        key = str(k)
        if key in first:
            raise EvalReplayError(
                f"{where} returned keys {first[key]!r} and {k!r}, both named {key!r} once saved; "
                "give each score its own string name"
            )
        first[key] = k
        out[key] = _as_float(v, task, k)
    return out


def _as_float(value: Any, task: str, key: Any) -> float:
    """A scorer's value as a float: bools and any real number (numpy's too)."""
    if isinstance(value, numbers.Real):
        return float(value)
    raise EvalReplayError(
        f"task {task!r}: scorer returned {type(value).__name__} for {key!r}; "
        "return a float, a bool, or a dict of floats"
    )


def contains(normalize: bool = True) -> Contains:
    return Contains(normalize=normalize)


def graded(rubric: Any, judge: Any) -> Any:
    """An answer graded by a judge model, one score per rubric criterion
    (`rubric.graded`; docs/grading.md)."""
    __tracebackhide__ = True  # a bad rubric or judge is reported at the user's line
    from pytest_evalreplay.rubric import graded as build

    return build(rubric, judge)
