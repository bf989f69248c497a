"""Pairwise judges for `EloEval`: a plain function, or `judges.llm(...)` on top
of any provider.

A judge scores the candidate's answer against one reference's answer to the
same task: 1 win, 0.5 tie, 0 loss. A plain function is
`judge(instance, candidate, reference) -> float`; any other value is a judging
failure naming it (never a loss). The LLM judge asks a model `trials` times,
swapping the two answers' positions on alternate trials (a judge that
prefers the first position then cancels out), and reads the verdict with a
pattern. A reply it cannot read is a `Verdict` that says so, with the reason:
by default a judging failure (a model that never answers in the asked form
must not rate as all ties), or, with `unreadable="tie"`, a tie still counted
as unreadable.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_evalreplay.model import Context, EvalReplayError, Instance

FunctionJudge = Callable[[Instance, str, str], Any]

DEFAULT_TEMPLATE = (
    "You are judging two answers to the same task.\n\n"
    "[Task]\n{task}\n\n"
    "[Answer A]\n{answer_a}\n\n"
    "[Answer B]\n{answer_b}\n\n"
    "Which answer is better? Reply with [[A]] if A is better, [[B]] if B is better, "
    "or [[TIE]] if they are equally good."
)
DEFAULT_PATTERN = r"\[\[\s*(A|B|TIE)\s*\]\]"
DEFAULT_SAMPLING: Mapping[str, Any] = {"temperature": 0.0, "max_tokens": 64}
LABELS = ("A", "B", "TIE")
UNREADABLE = "unreadable"
UnreadablePolicy = Literal["fail", "tie"]
UNREADABLE_POLICIES: tuple[UnreadablePolicy, ...] = ("fail", "tie")
# The template's placeholders, filled in one pass: text already filled in is never read again.
_PLACEHOLDER = re.compile(r"\{(task|answer_a|answer_b)\}")
_REPLY_SHOWN = 80  # characters of an unreadable reply quoted in its reason
# The candidate's scores each label allows (an unreadable reply: a failure, or a tie kept as one).
_SCORES_OF: dict[str, tuple[float | None, ...]] = {
    "A": (0.0, 1.0),
    "B": (0.0, 1.0),
    "TIE": (0.5,),
    UNREADABLE: (None, 0.5),
}


def check_verdict(value: Any) -> float:
    """A function judge's value as 1.0, 0.5 or 0.0; ValueError naming anything else."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        v = float(value)
        if v in (0.0, 0.5, 1.0):
            return v
    elif isinstance(value, bool):
        return float(value)
    raise ValueError(f"the judge returned {value!r:.60}; return 1 (win), 0.5 (tie) or 0 (loss)")


def task_text(context: Context) -> str:
    """The task as the judge reads it: a text prompt as is; a chat prompt as its messages."""
    if isinstance(context, str):
        return context
    return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in context)


@dataclass(frozen=True)
class Verdict:
    """One trial's verdict, read from the judge's reply.

    `label` is what the reply said ("A", "B", "TIE") or UNREADABLE; `score` is
    the candidate's (1 win, 0.5 tie, 0 loss, the positions swapped back), None
    for an unreadable reply the judge fails on (its `reason` says why).
    """

    score: float | None
    label: str
    reason: str | None = None

    def __post_init__(self) -> None:
        allowed = _SCORES_OF.get(self.label)
        if allowed is None:
            raise ValueError(f"Verdict label {self.label!r}: use one of {tuple(_SCORES_OF)}")
        if self.score not in allowed:
            raise ValueError(
                f"Verdict score {self.score!r} does not fit label {self.label!r}: one of {allowed}"
            )
        if (self.label == UNREADABLE) != (self.reason is not None):
            raise ValueError("a Verdict has a reason exactly when it is unreadable")

    @property
    def readable(self) -> bool:
        return self.label != UNREADABLE


@dataclass(frozen=True)
class LlmJudge:
    """A judge that asks a model (see `llm`)."""

    provider: Any = None
    model: str | None = None
    base_url: str | None = None
    template: str = DEFAULT_TEMPLATE
    system_prompt: str | None = None
    trials: int = 2
    pattern: str = DEFAULT_PATTERN
    sampling: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_SAMPLING))
    unreadable: UnreadablePolicy = "fail"

    def __post_init__(self) -> None:
        if type(self.trials) is not int or self.trials < 1:
            raise EvalReplayError(f"judges.llm(trials={self.trials!r}): give a positive number of trials")
        try:
            compiled = re.compile(self.pattern)
        except re.error as exc:
            raise EvalReplayError(
                f"judges.llm(pattern={self.pattern!r}) is not a regular expression: {exc}"
            ) from None
        if compiled.groups != 1:
            raise EvalReplayError(
                f"judges.llm(pattern={self.pattern!r}) needs exactly one group capturing A, B or TIE"
            )
        for name in ("task", "answer_a", "answer_b"):
            if "{" + name + "}" not in self.template:
                raise EvalReplayError(f"judges.llm(template=...) must contain {{{name}}}")
        if not isinstance(self.sampling, Mapping):
            raise EvalReplayError(
                "judges.llm(sampling=...) must be a dict of sampling settings, "
                f"not {type(self.sampling).__name__}"
            )
        if self.unreadable not in UNREADABLE_POLICIES:
            raise EvalReplayError(
                f"judges.llm(unreadable={self.unreadable!r}): give 'fail' (an unreadable reply is a "
                "judging failure) or 'tie' (it counts as a tie)"
            )

    def prompt(self, task: str, candidate: str, reference: str, trial: int) -> str:
        """Trial `trial`'s prompt: the candidate is answer A on even trials, B on odd ones.

        Filled in one pass, so a placeholder inside an answer or the task stays as written.
        """
        a, b = (candidate, reference) if trial % 2 == 0 else (reference, candidate)
        values = {"task": task, "answer_a": a, "answer_b": b}
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)], self.template)

    def verdict(self, text: str, trial: int) -> Verdict:
        """Trial `trial`'s verdict from the judge's reply, the positions swapped back."""
        labels = self._labels(text)
        label = labels[0] if len(labels) == 1 else None
        if len(labels) > 1:
            reason = (
                f"the judge's reply names conflicting verdicts {', '.join(labels)} where one of "
                f"{self._asked()} was asked for (pattern {self.pattern!r}): {text[:_REPLY_SHOWN]!r}"
                + (f" ({len(text)} characters)" if len(text) > _REPLY_SHOWN else "")
            )
            return Verdict(0.5 if self.unreadable == "tie" else None, UNREADABLE, reason)
        if label not in LABELS:
            said = "no verdict" if label is None else f"the verdict {label!r}"
            reason = (
                f"the judge's reply has {said} where {self._asked()} was asked for "
                f"(pattern {self.pattern!r}): {text[:_REPLY_SHOWN]!r}"
                + (f" ({len(text)} characters)" if len(text) > _REPLY_SHOWN else "")
            )
            return Verdict(0.5 if self.unreadable == "tie" else None, UNREADABLE, reason)
        if label == "TIE":
            return Verdict(0.5, label)
        candidate_is = "A" if trial % 2 == 0 else "B"
        return Verdict(1.0 if label == candidate_is else 0.0, label)

    def _labels(self, text: str) -> list[str]:
        """Every distinct label the reply names, sorted: one is a verdict, more conflict."""
        return sorted({str(m).strip().upper() for m in re.findall(self.pattern, text)})

    def _asked(self) -> str:
        if self.pattern == DEFAULT_PATTERN:
            return "[[A]], [[B]] or [[TIE]]"
        return "A, B or TIE"

    def identity(self) -> dict[str, Any]:
        """What makes two LLM judges judge alike (besides their provider)."""
        return {
            "template": self.template,
            "system_prompt": self.system_prompt,
            "trials": self.trials,
            "pattern": self.pattern,
            "sampling": dict(self.sampling),
            "unreadable": self.unreadable,
        }


def llm(
    provider: Any = None,
    *,
    model: str | None = None,
    base_url: str | None = None,
    template: str = DEFAULT_TEMPLATE,
    system_prompt: str | None = None,
    trials: int = 2,
    pattern: str = DEFAULT_PATTERN,
    sampling: Mapping[str, Any] | None = None,
    unreadable: UnreadablePolicy = "fail",
) -> LlmJudge:
    """A pairwise judge on top of a provider.

    `provider`: a provider object, or a provider kind (`"openai"`, `"vllm"`, or
    one a conftest registers), built like the session's with `model` and
    `base_url` in place of --evalreplay-model / --evalreplay-base-url; None uses
    the session's own provider. When the session replays a saved run
    (--evalreplay-predictions), the judge is always served from that run's
    saved verdicts, so no model is asked. `template` gets `{task}`,
    `{answer_a}` and `{answer_b}`; `pattern` has one group capturing `A`, `B`
    or `TIE` (default: `[[A]]`, `[[B]]`, `[[TIE]]`). A reply the pattern
    cannot read, or one naming two different labels (`[[A]] ... [[B]]`: a
    judge that changed its mind is not read as either), is a judging failure
    (`unreadable="fail"`), or a tie with `unreadable="tie"`; either way it is
    counted as unreadable.
    """
    return LlmJudge(
        provider=provider,
        model=model,
        base_url=base_url,
        template=template,
        system_prompt=system_prompt,
        trials=trials,
        pattern=pattern,
        sampling=dict(DEFAULT_SAMPLING) if sampling is None else _copied(sampling),
        unreadable=unreadable,
    )


def _copied(sampling: Any) -> Any:
    """A copy of a mapping (so the judge is not changed through it); anything else as is, for the check."""
    return dict(sampling) if isinstance(sampling, Mapping) else sampling


def validate_judge(judge: Any, where: str) -> LlmJudge | FunctionJudge:
    if isinstance(judge, LlmJudge) or callable(judge):
        return judge
    raise EvalReplayError(
        f"{where}: judge must be a function judge(instance, candidate, reference) -> float, "
        f"or judges.llm(...); got {type(judge).__name__}"
    )


def mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)
