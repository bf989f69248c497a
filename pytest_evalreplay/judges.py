"""Pairwise judges for `EloEval`: a plain function, or `judges.llm(...)` on top
of any provider.

A judge scores the candidate's answer against one reference's answer to the
same task: 1 win, 0.5 tie, 0 loss. A plain function is
`judge(instance, candidate, reference) -> float`; any other value is a judging
failure naming it (never a loss). The LLM judge asks a model `trials` times,
swapping the two answers' positions on alternate trials (a judge that
prefers the first position then cancels out), and reads the verdict with a
pattern; a verdict it cannot read counts as a tie and is recorded as such.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_evalreplay.model import Context, EvalReplayError

Instance = dict[str, Any]
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
UNPARSEABLE = "unparseable"


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
            raise EvalReplayError("judges.llm(sampling=...) must be a dict")

    def prompt(self, task: str, candidate: str, reference: str, trial: int) -> str:
        """Trial `trial`'s prompt: the candidate is answer A on even trials, B on odd ones."""
        a, b = (candidate, reference) if trial % 2 == 0 else (reference, candidate)
        return self.template.replace("{task}", task).replace("{answer_a}", a).replace("{answer_b}", b)

    def read(self, text: str) -> str | None:
        """The verdict label in a reply ("A", "B" or "TIE"; the last match wins), or None."""
        matches = re.findall(self.pattern, text)
        if not matches:
            return None
        label = str(matches[-1]).strip().upper()
        return label if label in ("A", "B", "TIE") else None

    def score(self, text: str, trial: int) -> tuple[float, str]:
        """The candidate's score from one trial's reply, and the label read (or "unparseable": a tie)."""
        label = self.read(text)
        if label is None:
            return 0.5, UNPARSEABLE
        if label == "TIE":
            return 0.5, label
        candidate_is = "A" if trial % 2 == 0 else "B"
        return (1.0 if label == candidate_is else 0.0), label

    def identity(self) -> dict[str, Any]:
        """What makes two LLM judges judge alike (besides their provider)."""
        return {
            "template": self.template,
            "system_prompt": self.system_prompt,
            "trials": self.trials,
            "pattern": self.pattern,
            "sampling": dict(self.sampling),
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
) -> LlmJudge:
    """A pairwise judge on top of a provider.

    `provider`: a provider object, or a provider kind (`"openai"`, `"vllm"`, or
    one a conftest registers), built like the session's with `model` and
    `base_url` in place of --evalreplay-model / --evalreplay-base-url; None uses
    the session's own provider. When the session replays a saved run
    (--evalreplay-predictions), the judge is always served from that run's
    saved verdicts, so no model is asked. `template` gets `{task}`,
    `{answer_a}` and `{answer_b}`; `pattern` has one group capturing `A`, `B`
    or `TIE` (default: `[[A]]`, `[[B]]`, `[[TIE]]`).
    """
    return LlmJudge(
        provider=provider,
        model=model,
        base_url=base_url,
        template=template,
        system_prompt=system_prompt,
        trials=trials,
        pattern=pattern,
        sampling=dict(sampling) if sampling is not None else dict(DEFAULT_SAMPLING),
    )


def validate_judge(judge: Any, where: str) -> LlmJudge | FunctionJudge:
    if isinstance(judge, LlmJudge) or callable(judge):
        return judge
    raise EvalReplayError(
        f"{where}: judge must be a function judge(instance, candidate, reference) -> float, "
        f"or judges.llm(...); got {type(judge).__name__}"
    )


def mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)
