"""`scorers.graded(rubric, judge)`: an answer graded by a judge model, one
score per rubric criterion.

Each criterion is asked separately (one request per criterion and trial), so
neither the criteria's order nor one criterion's verdict sways another's, and
there is no position to bias: the judge sees one answer. A criterion's score
is the share of trials whose reply says the answer meets it ([[YES]] 1,
[[NO]] 0). The requests go through the same LLM-judge machinery as an
EloEval's `judges.llm(...)`: the judge's provider, journal, resume and
replay (`grader.py`). Here: the scorer's definition and its pure parts, the
prompt and the reading of a reply.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_evalreplay.judges import DEFAULT_PATTERN, DEFAULT_TEMPLATE, LlmJudge
from pytest_evalreplay.model import EvalReplayError

GRADE_TEMPLATE = (
    "You are grading an answer against one criterion of a rubric.\n\n"
    "[Task]\n{task}\n\n"
    "[Answer]\n{answer}\n\n"
    "[Criterion]\n{criterion}\n\n"
    "Does the answer meet the criterion? Reply with [[YES]] or [[NO]]."
)
GRADE_PATTERN = re.compile(r"\[\[\s*(YES|NO)\s*\]\]", re.IGNORECASE)
_PLACEHOLDER = re.compile(r"\{(task|answer|criterion)\}")
_REPLY_SHOWN = 80  # characters of an unreadable reply quoted in the failure


@dataclass(frozen=True)
class Graded:
    """A rubric (criterion name -> what it asks) and the judge that grades it."""

    rubric: tuple[tuple[str, str], ...]
    judge: LlmJudge

    @property
    def name(self) -> str:
        return "graded"

    def prompt(self, task: str, answer: str, criterion: str) -> str:
        """One criterion's prompt, filled in one pass (a placeholder inside the answer stays as written)."""
        values = {"task": task, "answer": answer, "criterion": self.rubric_text(criterion)}
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)], GRADE_TEMPLATE)

    def rubric_text(self, criterion: str) -> str:
        return dict(self.rubric)[criterion]

    def read(self, reply: str) -> float | None:
        """1.0 (meets), 0.0 (does not), None (the reply says neither)."""
        grades = _grades(reply)
        if len(grades) != 1:
            return None
        return 1.0 if grades[0] == "YES" else 0.0


def _grades(reply: str) -> list[str]:
    """Every distinct grade a reply names, sorted: one is a grade, more conflict."""
    return sorted({m.strip().upper() for m in GRADE_PATTERN.findall(reply)})


def outside_session(task: str) -> str:
    """Why a graded task cannot be scored outside pytest (`EvalTask.evaluate`)."""
    return (
        f"task {task!r}: scorers.graded(...) grades in a pytest session, where its verdicts "
        "are journaled and replayed; run the task with pytest"
    )


def unreadable_reason(reply: str) -> str:
    """Why a grade reply is unreadable, quoting it."""
    more = f" ({len(reply)} characters)" if len(reply) > _REPLY_SHOWN else ""
    grades = _grades(reply)
    said = f"conflicting grades {', '.join(grades)}" if len(grades) > 1 else "no [[YES]] or [[NO]]"
    return f"the grader's reply has {said}: {reply[:_REPLY_SHOWN]!r}{more}"


def graded(rubric: Any, judge: Any) -> Graded:
    """A scorer that asks `judge` (a `judges.llm(...)`) whether the answer meets
    each criterion of `rubric`: a dict {criterion name: what it asks}, or a
    list of criteria (each named by its text). The scores are named after the
    criteria. Verdicts are journaled, reused on resume and served on replay."""
    __tracebackhide__ = True  # a bad rubric or judge is reported at the user's line
    if not isinstance(judge, LlmJudge):
        raise EvalReplayError(
            f"scorers.graded(judge=...) must be judges.llm(...) (a judge model on a provider), "
            f"got {type(judge).__name__}"
        )
    if (judge.template, judge.pattern, judge.unreadable) != (DEFAULT_TEMPLATE, DEFAULT_PATTERN, "fail"):
        raise EvalReplayError(
            "scorers.graded asks with its own prompt and reads [[YES]] / [[NO]]: give judges.llm(...) "
            "no template, pattern or unreadable (an unreadable reply is always a scoring failure)"
        )
    if isinstance(rubric, Mapping):
        items = [(k, v) for k, v in rubric.items()]
    elif isinstance(rubric, (list, tuple)):
        items = [(c, c) for c in rubric]
    else:
        raise EvalReplayError(
            "scorers.graded(rubric=...) must be a dict {criterion name: what it asks} or a list of "
            f"criteria, got {type(rubric).__name__}"
        )
    if not items:
        raise EvalReplayError("scorers.graded(rubric=...) is empty: give at least one criterion")
    for name, text in items:
        if not isinstance(name, str) or not name.strip() or not isinstance(text, str) or not text.strip():
            raise EvalReplayError(
                f"scorers.graded(rubric=...): criterion {name!r:.60}: {text!r:.60} must be a non-empty "
                "name and a non-empty text"
            )
    return Graded(tuple(items), judge)
