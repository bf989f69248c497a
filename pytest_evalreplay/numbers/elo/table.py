"""The judgments of an ELO evaluation aggregated per (task, reference): the one
shape the fit, the task bootstrap and the JSON record all read.

Kept apart from the fit because it is plain bookkeeping (names, counts,
validation of the judge's scores) that every other elo module builds on; tasks
and references are sorted by name, so nothing downstream depends on the order
of the judged rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from pytest_evalreplay.model import EvalReplayError


class Judgment(NamedTuple):
    """One judged pair: the candidate's score against one reference on one task."""

    task_id: str
    reference: str
    score: float  # 1 win, 0.5 tie, 0 loss
    stage: int = 1


@dataclass(frozen=True)
class ReferenceCounts:
    """The candidate's record against one reference."""

    name: str
    elo: float
    wins: int
    ties: int
    losses: int

    @property
    def n(self) -> int:
        return self.wins + self.ties + self.losses

    @property
    def score(self) -> float | None:
        """The candidate's mean score against this reference (a tie is half a win)."""
        return (self.wins + 0.5 * self.ties) / self.n if self.n else None


@dataclass(frozen=True, eq=False)
class JudgmentTable:
    """Judgments aggregated per (task, reference): everything the fit and the
    task bootstrap need. Tasks and references are sorted by name, so the table
    (and every interval drawn from it) does not depend on the order of the rows."""

    task_ids: tuple[str, ...]  # T
    references: tuple[str, ...]  # J: the references judged at least once
    elos: np.ndarray  # (J,) their fixed ratings
    outcomes: np.ndarray  # (T, J, 3) int64: losses, ties, wins

    @property
    def score_sums(self) -> np.ndarray:
        """(T, J): the candidate's summed scores, a tie counting half."""
        return self.outcomes[..., 2] + 0.5 * self.outcomes[..., 1]

    @property
    def counts(self) -> np.ndarray:
        """(T, J): judged pairs."""
        return self.outcomes.sum(axis=2).astype(float)

    @property
    def num_judgments(self) -> int:
        return int(self.outcomes.sum())

    def reference_counts(self) -> tuple[ReferenceCounts, ...]:
        totals = self.outcomes.sum(axis=0)
        return tuple(
            ReferenceCounts(name, float(elo), wins=int(w), ties=int(t), losses=int(lo))
            for name, elo, (lo, t, w) in zip(self.references, self.elos, totals, strict=True)
        )

    def select(self, task_ids: Iterable[str]) -> JudgmentTable:
        """The table restricted to `task_ids` (each must be in the table), and to
        the references judged on them."""
        index = {t: i for i, t in enumerate(self.task_ids)}
        keep = sorted(set(task_ids))
        outcomes = self.outcomes[np.array([index[t] for t in keep], dtype=np.intp)]
        return judged_table(keep, self.references, self.elos, outcomes)


def judged_table(
    task_ids: Sequence[str], references: Sequence[str], elos: np.ndarray, outcomes: np.ndarray
) -> JudgmentTable:
    """The table of the tasks and references with at least one judgment."""
    tasks = np.flatnonzero(outcomes.sum(axis=(1, 2)))
    refs = np.flatnonzero(outcomes.sum(axis=(0, 2)))
    return JudgmentTable(
        task_ids=tuple(task_ids[i] for i in tasks),
        references=tuple(references[j] for j in refs),
        elos=np.asarray(elos, dtype=float)[refs],
        outcomes=np.ascontiguousarray(outcomes[np.ix_(tasks, refs)]),
    )


def check_references(references: Mapping[str, float]) -> dict[str, float]:
    """The references as name -> finite float rating, or an error naming the bad one:
    the fit, a stage's choice of references and a stored table all start here."""
    if not references:
        raise EvalReplayError("no references: an ELO evaluation needs at least one reference with a rating")
    checked: dict[str, float] = {}
    for name, elo in references.items():
        if not isinstance(name, str) or not name:
            raise EvalReplayError(f"reference name {name!r} must be a non-empty string")
        try:
            value = float(elo)
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value) or isinstance(elo, bool):
            raise EvalReplayError(f"reference {name!r} has rating {elo!r}; give a finite number, e.g. 1200")
        checked[name] = value
    return checked


def tabulate(rows: Iterable[Sequence[Any]], references: Mapping[str, float]) -> JudgmentTable:
    """Aggregate judged rows (task id, reference name, score, [stage]) into a table.

    A score must be 1 (win), 0.5 (tie) or 0 (loss): anything else is the judge's
    bug, and counting it as something would hide it.
    """
    elo_of = check_references(references)
    rows = rows if isinstance(rows, Sequence) else list(rows)
    if not rows:
        return JudgmentTable((), (), np.zeros(0), np.zeros((0, 0, 3), dtype=np.int64))
    names = sorted(elo_of)
    ref_index = {name: j for j, name in enumerate(names)}
    tasks = list(map(itemgetter(0), rows))
    unique_tasks = list(dict.fromkeys(tasks))
    odd = next((t for t in unique_tasks if not isinstance(t, str)), None)
    if odd is not None:
        raise EvalReplayError(f"task id {odd!r} in the judgment rows must be a string")
    sorted_tasks = sorted(unique_tasks)
    task_index = {t: i for i, t in enumerate(sorted_tasks)}
    task_codes = np.fromiter(map(task_index.__getitem__, tasks), dtype=np.int64, count=len(rows))
    try:
        ref_codes = np.fromiter(map(ref_index.__getitem__, map(itemgetter(1), rows)), np.int64, len(rows))
    except (KeyError, TypeError):
        at = next(i for i, row in enumerate(rows) if not isinstance(row[1], str) or row[1] not in ref_index)
        raise EvalReplayError(
            f"judgment row {at} (task {rows[at][0]!r}) names reference {rows[at][1]!r}, which is not among "
            f"the references ({', '.join(names)}); judge only against the configured references"
        ) from None
    scores = np.array(list(map(itemgetter(2), rows)), dtype=object)
    outcome = np.full(len(rows), -1, dtype=np.int64)
    for code, value in enumerate((0.0, 0.5, 1.0)):
        outcome[scores == value] = code
    bad = np.flatnonzero(outcome < 0)
    if bad.size:
        at = int(bad[0])
        raise EvalReplayError(
            f"judgment row {at} (task {rows[at][0]!r}, reference {rows[at][1]!r}) has score {rows[at][2]!r}; "
            "a pairwise judge returns 1 (win), 0.5 (tie) or 0 (loss)"
        )
    num_tasks, num_refs = len(sorted_tasks), len(names)
    cell = (task_codes * num_refs + ref_codes) * 3 + outcome
    outcomes = np.bincount(cell, minlength=num_tasks * num_refs * 3).reshape(num_tasks, num_refs, 3)
    return judged_table(sorted_tasks, names, np.array([elo_of[n] for n in names]), outcomes)
