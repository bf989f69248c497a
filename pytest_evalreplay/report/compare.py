"""Compare two runs: each metric's difference with the one paired test, and
the instances whose score flipped (for an EloEval, the tasks whose verdicts did).

There is one comparison path: `compare_runs` over two `RunSnapshot`s. A saved
run dir is read into a snapshot by `snapshot.load_run_dir`; the plugin builds
the snapshot of the run in progress from what it holds in memory and calls
`compare_with_saved`. The result, a `RunComparison`, is plain data that
`to_dict()` turns into JSON and `compare_render` turns into text or Markdown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.numbers.gates import PairedDrop
from pytest_evalreplay.numbers.stats import ALPHA, Interval, PairedTest, instance_interval, paired_test
from pytest_evalreplay.rundir.snapshot import EloSnapshot, RunSnapshot, TaskSnapshot, load_run_dir
from pytest_evalreplay.values.snippets import clip, prompt_line

__all__ = [
    "Flip",
    "MetricDiff",
    "RunComparison",
    "RunSnapshot",
    "TaskComparison",
    "TaskSnapshot",
    "compare_run_dirs",
    "compare_runs",
    "compare_with_saved",
]

# A change smaller than this is rounding noise of a mean over rollouts, not a flip.
FLIP_TOLERANCE = 1e-9
VERDICT = "mean verdict"  # an EloEval's flips: the candidate's mean verdict on a task


@dataclass(frozen=True)
class MetricDiff:
    """One metric of one task in both runs.

    `base`, `new`: the runs' aggregate values (None: the run lacks the metric);
    `delta`: new - base of those; `base_interval`, `new_interval`: each run's
    metric with its 95% interval (clustered by instance; an EloEval's rating,
    its own interval); `paired`: the one paired test over the instances both
    runs scored (`stats.paired_test`; an EloEval's rating, the paired bootstrap
    over the tasks both judged), the same one the gate decides with.
    """

    metric: str
    base: float | None
    new: float | None
    delta: float | None
    base_interval: Interval
    new_interval: Interval
    paired: PairedTest

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "base": self.base,
            "new": self.new,
            "delta": self.delta,
            "base_interval": self.base_interval.to_dict(),
            "new_interval": self.new_interval.to_dict(),
            "paired": self.paired.to_dict(),
        }


@dataclass(frozen=True)
class Flip:
    """An instance whose score on `metric` changed between the runs (for an
    EloEval, a task whose mean verdict did: `metric` is "mean verdict").

    `prompt` is the first line of its prompt and `base_answer` / `new_answer`
    each run's first generation, all one line, at most KEEP_CHARS long ("" when
    the run did not provide it).
    """

    instance_id: str
    metric: str
    base: float
    new: float
    prompt: str
    base_answer: str
    new_answer: str

    @property
    def change(self) -> float:
        return self.new - self.base

    @property
    def regressed(self) -> bool:
        return self.new < self.base

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "metric": self.metric,
            "base": self.base,
            "new": self.new,
            "change": _finite(self.change),
            "prompt": self.prompt,
            "base_answer": self.base_answer,
            "new_answer": self.new_answer,
        }


@dataclass(frozen=True)
class TaskComparison:
    """A task present in both runs. `flips` lists regressions first (largest
    drop first), then improvements (largest gain first); an instance that
    flipped on two metrics appears once per metric. For an EloEval (`elo`),
    the counts are of tasks judged and the flips are of mean verdicts."""

    task: str
    metrics: tuple[MetricDiff, ...]
    flips: tuple[Flip, ...]
    num_base: int  # instances the base run scored (an EloEval: tasks it judged)
    num_new: int  # instances the new run scored
    num_both: int  # instances both runs scored
    elo: bool = False

    @property
    def regressed(self) -> tuple[Flip, ...]:
        return tuple(f for f in self.flips if f.regressed)

    @property
    def improved(self) -> tuple[Flip, ...]:
        return tuple(f for f in self.flips if not f.regressed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "kind": "elo" if self.elo else "task",
            "num_base": self.num_base,
            "num_new": self.num_new,
            "num_both": self.num_both,
            "metrics": [m.to_dict() for m in self.metrics],
            "flips": [f.to_dict() for f in self.flips],
        }


@dataclass(frozen=True)
class RunComparison:
    """Two runs compared: the tasks in both, and the names of those in one only."""

    base_label: str
    new_label: str
    base_model: str | None
    new_model: str | None
    tasks: tuple[TaskComparison, ...]
    only_base: tuple[str, ...]
    only_new: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": {"label": self.base_label, "model": self.base_model},
            "new": {"label": self.new_label, "model": self.new_model},
            "tasks": [t.to_dict() for t in self.tasks],
            "only_base": list(self.only_base),
            "only_new": list(self.only_new),
        }


def compare_runs(base: RunSnapshot, new: RunSnapshot, alpha: float = ALPHA) -> RunComparison:
    """Compare two snapshots (the one comparison path; see the module docstring).
    `alpha` is the paired test's one-sided level, as a gate's `alpha`."""
    for run in (base, new):
        _check_snapshot(run)
    common = [t for t in base.tasks if t in new.tasks]
    return RunComparison(
        base_label=base.label,
        new_label=new.label,
        base_model=base.model,
        new_model=new.model,
        tasks=tuple(_compare_task(t, base.tasks[t], new.tasks[t], alpha) for t in sorted(common)),
        only_base=tuple(sorted(t for t in base.tasks if t not in new.tasks)),
        only_new=tuple(sorted(t for t in new.tasks if t not in base.tasks)),
    )


def compare_run_dirs(base: Path, new: Path, alpha: float = ALPHA) -> RunComparison:
    """Compare two saved run dirs (new - base)."""
    return compare_runs(load_run_dir(Path(base)), load_run_dir(Path(new)), alpha)


def compare_with_saved(saved: Path, current: RunSnapshot, alpha: float = ALPHA) -> RunComparison:
    """Compare the run in progress (new) with a saved run dir (base)."""
    return compare_runs(load_run_dir(Path(saved)), current, alpha)


def _compare_task(task: str, base: TaskSnapshot, new: TaskSnapshot, alpha: float) -> TaskComparison:
    if base.elo is not None and new.elo is not None:
        return _compare_elo(task, base, new, base.elo, new.elo, alpha)
    names = sorted(set(base.metrics) | set(new.metrics))
    order = {iid: i for i, iid in enumerate(base.scores)}
    diffs: list[MetricDiff] = []
    flips: list[Flip] = []
    for name in names:
        b = _metric_scores(base.scores, name)
        n = _metric_scores(new.scores, name)
        b_value, n_value = base.metrics.get(name), new.metrics.get(name)
        diffs.append(
            MetricDiff(
                metric=name,
                base=None if b_value is None else float(b_value),
                new=None if n_value is None else float(n_value),
                delta=None if b_value is None or n_value is None else _finite(n_value - b_value),
                base_interval=instance_interval(b.values()),
                new_interval=instance_interval(n.values()),
                paired=paired_test(n, b, alpha),
            )
        )
        flips += [
            _flip(iid, name, b[iid], n[iid], base, new)
            for iid in b
            if iid in n and abs(n[iid] - b[iid]) > FLIP_TOLERANCE
        ]
    both = sum(1 for iid, s in base.scores.items() if s and new.scores.get(iid))
    return TaskComparison(
        task=task,
        metrics=tuple(diffs),
        flips=_ordered(flips, order),
        num_base=sum(1 for s in base.scores.values() if s),
        num_new=sum(1 for s in new.scores.values() if s),
        num_both=both,
    )


def _compare_elo(
    task: str, base: TaskSnapshot, new: TaskSnapshot, b_elo: EloSnapshot, n_elo: EloSnapshot, alpha: float
) -> TaskComparison:
    """An EloEval: its rating, paired by the bootstrap the ELO gate uses (drawn
    with the new run's seed, as the gate draws with the eval's), and each task
    judged by both runs whose mean verdict against the references both judged
    it against changed."""
    from pytest_evalreplay.numbers.elo.fit import compare_ratings, table_from_json

    b_judged, n_judged = b_elo.judged(), n_elo.judged()
    shared = [t for t in sorted(b_judged) if t in n_judged]
    cmp = compare_ratings(
        table_from_json(n_elo.table, f"{task}: elo.table"),
        table_from_json(b_elo.table, f"{task}: elo.table"),
        seed=n_elo.seed if n_elo.seed is not None else (b_elo.seed or 0),
    )
    drop = cmp.drop if cmp.drop is not None else math.nan
    paired = PairedDrop(n=cmp.num_tasks, drop=drop, p_value=cmp.p_value, interval=cmp.ci95).test(alpha)
    b_value, n_value = base.metrics.get("elo"), new.metrics.get("elo")
    rating = MetricDiff(
        metric="elo",
        base=None if b_value is None else float(b_value),
        new=None if n_value is None else float(n_value),
        delta=None if b_value is None or n_value is None else _finite(n_value - b_value),
        base_interval=Interval(len(b_judged), b_value, *b_elo.ci95),
        new_interval=Interval(len(n_judged), n_value, *n_elo.ci95),
        paired=paired,
    )
    flips = []
    for t in shared:
        refs = b_judged[t] & n_judged[t]
        b, n = b_elo.mean_verdicts(t, refs), n_elo.mean_verdicts(t, refs)
        if b is not None and n is not None and abs(n - b) > FLIP_TOLERANCE:
            flips.append(_flip(t, VERDICT, b, n, base, new))
    return TaskComparison(
        task=task,
        metrics=(rating,),
        flips=_ordered(flips, {t: i for i, t in enumerate(shared)}),
        num_base=len(b_judged),
        num_new=len(n_judged),
        num_both=len(shared),
        elo=True,
    )


def _flip(iid: str, metric: str, b: float, n: float, base: TaskSnapshot, new: TaskSnapshot) -> Flip:
    return Flip(
        instance_id=iid,
        metric=metric,
        base=b,
        new=n,
        prompt=_prompt_of(iid, base, new),
        base_answer=clip(base.answers.get(iid, "")),
        new_answer=clip(new.answers.get(iid, "")),
    )


def _ordered(flips: list[Flip], order: Mapping[str, int]) -> tuple[Flip, ...]:
    """Regressions first, largest first; then improvements; ties in the base run's order."""
    flips.sort(key=lambda f: (not f.regressed, -abs(f.change), order.get(f.instance_id, 0), f.metric))
    return tuple(flips)


def _metric_scores(scores: Mapping[str, Mapping[str, float]], metric: str) -> dict[str, float]:
    return {iid: float(s[metric]) for iid, s in scores.items() if metric in s}


def _prompt_of(iid: str, base: TaskSnapshot, new: TaskSnapshot) -> str:
    line = prompt_line(new.prompts[iid]) if iid in new.prompts else ""
    if not line and iid in base.prompts:
        line = prompt_line(base.prompts[iid])
    return clip(line)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _check_snapshot(run: RunSnapshot) -> None:
    """A snapshot built in memory (by the plugin) must hold finite numbers:
    a NaN score would turn every statistic into NaN without a word."""
    for task, snap in run.tasks.items():
        for name, value in snap.metrics.items():
            if not _is_number(value):
                raise EvalReplayError(
                    f"{run.label}: task {task!r}: metric {name!r} is {value!r}; "
                    "a metric must be a finite number"
                )
        for iid, scores in snap.scores.items():
            for name, value in scores.items():
                if not _is_number(value):
                    raise EvalReplayError(
                        f"{run.label}: task {task!r}, instance {iid!r}: score {name!r} is {value!r}; "
                        "a score must be a finite number (check the scorer)"
                    )
