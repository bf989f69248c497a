"""CI regression gates: a threshold, a paired comparison with a baseline, and
a failure budget, judged over plain data (per-instance scores and counts).

A drop fails the gate only when it is both larger than `max_drop` and
significant at `alpha`, so that noise on a small eval set does not break CI
and a real regression on a large one does. Significance is decided by
`stats.paired_test` (a one-sided paired t-test over the instances both runs
scored), the same test compare prints, so a red gate never points to a
comparison that calls the change noise. An EloEval's rating is paired by
`elo.compare_ratings` instead (a paired bootstrap over the tasks both judged),
handed in as a `PairedDrop`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_evalreplay.numbers.stats import PairedTest, paired_test

RATING_TEST = "paired bootstrap of the rating"


class GateRule(Protocol):
    """What judging reads of a task's `Gate` (declared with the task, in
    `task.py`): named here, not imported, so the numbers stay below the
    task's declarations."""

    @property
    def metric(self) -> str: ...

    @property
    def min(self) -> float | None: ...

    @property
    def max_drop(self) -> float | None: ...

    @property
    def alpha(self) -> float: ...


@dataclass(frozen=True)
class BaselineTask:
    """One task's entry in a baseline file."""

    metrics: Mapping[str, float]
    scores: Mapping[str, float] = field(default_factory=dict)
    metric: str | None = None  # which metric `scores` holds
    elo: Mapping[str, Any] | None = None  # an EloEval's saved "elo" block (its per-task table pairs runs)
    source: Mapping[str, Any] | None = None  # where it came from: model, run, date, git commit

    def describe_source(self) -> str:
        s = self.source or {}
        parts = [
            f"model {s['model']}" if s.get("model") else None,
            f"run {str(s['run'])[:8]}" if s.get("run") else None,
            s.get("date"),
            f"commit {s['commit']}" if s.get("commit") else None,
        ]
        return ", ".join(p for p in parts if p)


def metric_scores(scores: Mapping[str, Mapping[str, float]], metric: str) -> dict[str, float]:
    """One metric's per-instance scores, from each instance's scores."""
    return {iid: s[metric] for iid, s in scores.items() if metric in s}


@dataclass(frozen=True)
class PairedDrop:
    """A paired drop computed outside `stats.paired_test`: an EloEval's rating
    against its baseline's (`elo.compare_ratings`). `drop` is baseline -
    current, `p_value` one-sided for a drop, `interval` the drop's 95% interval
    when known. `test` turns it into the `PairedTest` the gate and compare print."""

    n: int  # tasks judged by both runs
    drop: float
    p_value: float
    interval: tuple[float | None, float | None] | None = None
    name: str = RATING_TEST

    def test(self, alpha: float) -> PairedTest:
        lo, hi = self.interval or (None, None)
        return PairedTest(
            name=self.name,
            n=self.n,
            estimate=-self.drop if math.isfinite(self.drop) else None,
            lo=None if hi is None else -hi,
            hi=None if lo is None else -lo,
            confidence=0.95,
            p_value=self.p_value,
            alpha=alpha,
            unit="task",
            decimals=1,
        )


@dataclass(frozen=True)
class GateOutcome:
    task: str
    gate: GateRule
    value: float | None
    num_items: int
    num_failed: int
    budget: float
    baseline: float | None = None
    paired: PairedTest | None = None
    reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    baseline_source: str = ""
    dropped: bool = False  # failed on max_drop: which instances flipped is the question
    compared: bool = False  # the session prints a comparison with the baseline's run

    @property
    def passed(self) -> bool:
        return not self.reasons

    def describe(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        value = "missing" if self.value is None else f"{self.value:.4f}"
        parts = [f"{self.gate.metric}={value}"]
        if self.gate.min is not None:
            parts.append(f"min {self.gate.min:g}")
        if self.baseline is not None and self.paired is not None:
            source = f" ({self.baseline_source})" if self.baseline_source else ""
            parts.append(
                f"baseline {self.baseline:.4f}{source}, max_drop {self.gate.max_drop:g} at alpha "
                f"{self.gate.alpha:g}: {self.paired.describe()}"
            )
        parts.append(f"{self.num_failed}/{self.num_items} items failed (budget {self.budget:g})")
        text = f"{verdict} " + "; ".join(parts)
        for reason in self.reasons:
            text += f"\n  - {reason}"
        if self.dropped and self.compared:
            text += "\n  what changed: see the comparison below"
        elif self.dropped:
            text += (
                "\n  what changed: run again with --evalreplay-compare=RUN_DIR (a run dir of the "
                "baseline's run) to list the instances (an EloEval's tasks) whose scores or verdicts flipped"
            )
        for note in self.notes:
            text += f"\n  note: {note}"
        return text


def evaluate(
    task: str,
    gate: GateRule,
    metrics: Mapping[str, float],
    scores: Mapping[str, float],
    num_items: int,
    num_failed: int,
    budget: float,
    baseline: BaselineTask | None,
    missing: int = 0,
    paired: PairedDrop | None = None,
    compared: bool = False,
) -> GateOutcome:
    """Judge one task: `scores` are its per-instance values of the gated metric;
    `missing` counts items of the task with no result yet (not selected, never run);
    `paired` is a drop computed elsewhere (an EloEval's rating), else the
    scores are paired with the baseline's by `stats.paired_test`."""
    reasons: list[str] = []
    notes: list[str] = []
    dropped = False
    if missing:
        notes.append(
            f"{missing} item{'s' if missing != 1 else ''} of the task have no result in the journal "
            "(not run yet); the gate judges the rest"
        )
    value = metrics.get(gate.metric)
    if value is None:
        reasons.append(f"the task produced no {gate.metric!r} metric (it has: {sorted(metrics) or 'none'})")
    elif gate.min is not None and value < gate.min:
        reasons.append(f"{gate.metric} {value:.4f} is below min {gate.min:g}")
    if num_items and num_failed / num_items > budget:
        reasons.append(
            f"{num_failed} of {num_items} items failed ({num_failed / num_items:.1%}), over the failure "
            f"budget {budget:.1%} (--evalreplay-failure-budget)"
        )
    base_value: float | None = None
    test: PairedTest | None = None
    if gate.max_drop is not None:
        if baseline is None:
            notes.append("max_drop not checked: no baseline for this task (--evalreplay-baseline)")
        elif gate.metric not in baseline.metrics:
            reasons.append(
                f"the baseline has no {gate.metric!r} metric for this task; "
                "write it again with --evalreplay-update-baseline"
            )
        elif paired is None and (baseline.metric != gate.metric or not baseline.scores):
            reasons.append(
                f"the baseline has no per-instance {gate.metric!r} scores to pair with; "
                "write it again with --evalreplay-update-baseline"
            )
        else:
            base_value = float(baseline.metrics[gate.metric])
            if paired is not None:
                test = paired.test(gate.alpha)
            else:
                test = paired_test(scores, baseline.scores, alpha=gate.alpha)
            if test.n == 0:
                reasons.append(f"no {test.unit} was scored by both this run and the baseline")
            elif test.drop is not None and test.drop > gate.max_drop and test.significant_drop:
                dropped = True
                reasons.append(
                    f"{gate.metric} dropped {test.drop:.{test.decimals}f} below the baseline over "
                    f"{test.n} paired {test.unit}s (more than max_drop {gate.max_drop:g}; "
                    f"{test.name} p={test.p_value:.3g} < alpha {gate.alpha:g})"
                )
    return GateOutcome(
        task=task,
        gate=gate,
        value=value,
        num_items=num_items,
        num_failed=num_failed,
        budget=budget,
        baseline=base_value,
        paired=test,
        reasons=tuple(reasons),
        notes=tuple(notes),
        baseline_source=baseline.describe_source() if baseline is not None else "",
        dropped=dropped,
        compared=compared,
    )


def baseline_entry(
    gate: GateRule | None,
    metrics: Mapping[str, float],
    scores: Mapping[str, Mapping[str, float]],
    elo: Mapping[str, Any] | None = None,
    source: Mapping[str, Any] | None = None,
) -> BaselineTask:
    """What `--evalreplay-update-baseline` saves for a task: its metrics and the
    gated metric's per-instance scores (with no gate, a sole metric's)."""
    metric = gate.metric if gate is not None else None
    if metric is None and len(metrics) == 1:
        metric = next(iter(metrics))
    per_instance = metric_scores(scores, metric) if metric else {}
    return BaselineTask(metrics=dict(metrics), scores=per_instance, metric=metric, elo=elo, source=source)
