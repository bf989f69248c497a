"""Which stages of an ELO eval run now, and how: pure decisions over the
eval's shape, this run's options and what the journal recorded (a
`StageLog`), as plain data in and out. No journal is read and nothing is
written here; the driver (`run/elorun.py`) reads the journal, calls these,
and acts on the answer, so each rule is tested directly (tests/test_stageplan.py).

A stage is planned from the rating after the one before, so what a run may
do with a stage depends on what the journal holds of the earlier ones:

- `replan_from`: the first stage planned afresh (--resume-stage, or the first
  whose fingerprint changed) and one line per stage saying what happens to it.
- `replays`: whether a stage's recorded plan stands in this run.
- `choose_seed`: which seed draws the stages' tasks.
- `wait_for_merge`: which stages a shard may run before the merge.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pytest_evalreplay.journal.index import JournalIndex
from pytest_evalreplay.journal.rows import RolloutKey
from pytest_evalreplay.journal.stagelog import StageLog, StageRecord
from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.numbers.metrics import item_outcome
from pytest_evalreplay.numbers.planning import TaskPlan
from pytest_evalreplay.values.fingerprint import describe_change


@dataclass(frozen=True)
class StageLine:
    """What a run says of a stage. `provisional`: what the journal promises
    (kept, replayed), said only once the run has driven the stage and it
    held (re-judging can move a rating, and a recorded plan then stands no
    more), so no line is contradicted by a later one."""

    stage: int | None
    text: str
    provisional: bool = False


def replan_from(
    name: str,
    total: int,
    resuming: bool,
    resume_stage: int | None,
    log: StageLog,
    fingerprints: Sequence[str],
    configs: Sequence[Mapping[str, Any]],
    judged: Callable[[int], int],
) -> tuple[int, list[StageLine]]:
    """The first stage planned afresh, and one line per stage saying what
    happens to it. `resume_stage` is --resume-stage's N (0: given without N,
    None: not given); `judged(s)` counts stage s's judged pairs (asked only
    of a kept stage, for its line)."""
    lines: list[StageLine] = []
    if not resuming:
        return 1, lines
    first_fresh = total + 1
    why: str | None = None
    if resume_stage is not None:
        first = resume_stage or stage_of_first_incomplete(log, fingerprints)
        if first > total and not resume_stage:
            lines.append(
                StageLine(None, f"{name}: every stage is complete: --resume-stage has nothing to run again")
            )
        elif first > total:
            raise EvalReplayError(f"--resume-stage={first}: {name!r} has only {total} stages")
        check_kept_stages(name, log, fingerprints, configs, first)
        first_fresh, why = first, f"--resume-stage={first}"
    for stage in range(1, total + 1):
        record = log.stages.get(stage)
        if stage >= first_fresh:
            lines.append(StageLine(stage, f"{name}: stage {stage}/{total} planned afresh ({why})"))
        elif record is None:
            lines.append(StageLine(stage, f"{name}: stage {stage}/{total} not started yet"))
        elif record.fingerprint != fingerprints[stage - 1]:
            why = describe_change(record.config, configs[stage - 1])
            first_fresh = stage
            lines.append(StageLine(stage, f"{name}: stage {stage}/{total} planned afresh ({why})"))
            why = f"stage {stage} changed"
        elif record.complete:
            rating = f"ELO {shown(record.rating)}" + (f" +- {record.se:.0f}" if record.se is not None else "")
            pairs = f"{judged(stage)} judged pairs"
            text = f"{name}: stage {stage}/{total} kept from the journal: {rating} ({pairs})"
            lines.append(StageLine(stage, text, provisional=True))
        else:
            refs = ", ".join(record.references)
            text = (
                f"{name}: stage {stage}/{total} replayed from the journal: {len(record.task_ids)} tasks vs "
                f"{len(record.references)} references [{refs}]"
            )
            lines.append(StageLine(stage, text, provisional=True))
    return first_fresh, lines


def stage_of_first_incomplete(log: StageLog, fingerprints: Sequence[str]) -> int:
    """The first stage not complete with its current fingerprint (bare
    --resume-stage starts there); one past the last when every one is."""
    for stage in range(1, len(fingerprints) + 1):
        record = log.stages.get(stage)
        if record is None or not record.complete or record.fingerprint != fingerprints[stage - 1]:
            return stage
    return len(fingerprints) + 1


def check_kept_stages(
    name: str, log: StageLog, fingerprints: Sequence[str], configs: Sequence[Mapping[str, Any]], upto: int
) -> None:
    """--resume-stage=N: stages 1..N-1 must be complete in the journal, with their fingerprints valid."""
    for stage in range(1, upto):
        record = log.stages.get(stage)
        if record is None:
            why = "it was never planned"
        elif record.fingerprint != fingerprints[stage - 1]:
            why = f"its configuration changed ({describe_change(record.config, configs[stage - 1])})"
        elif not record.complete:
            why = "it is not complete"
        else:
            continue
        raise EvalReplayError(
            f"--resume-stage={upto}: {name!r} cannot keep stage {stage}: {why}; "
            f"use --resume-stage={stage} (or --resume) to run it again"
        )


Replay = Literal["replay", "afresh", "rating changed"]


def replays(
    record: StageRecord | None,
    stage: int,
    run_id: str,
    first_fresh: int,
    resumes: bool,
    prior: float | None,
    fingerprint: str,
    task_ids: Sequence[str],
) -> Replay:
    """Whether stage `stage`'s recorded plan stands: it is this run's own, or
    an earlier run's that this run resumes (`resumes`: --resume or
    --resume-stage) below the first stage planned afresh, and it started
    from the same rating, fingerprint and tasks. "rating changed": planned
    afresh, and the run says why."""
    if record is None or not (record.run == run_id or (stage < first_fresh and resumes)):
        return "afresh"
    if not same_rating(record.prior_rating, prior):
        return "rating changed"
    if record.fingerprint == fingerprint and record.task_ids == list(task_ids):
        return "replay"
    return "afresh"


def choose_seed(
    name: str,
    own: int | None,
    recorded: Callable[[], int | None],
    saved: Callable[[], int | None],
    shard: str | None,
    run_seed: int,
) -> int:
    """An EloEval's seed: its own; else the one its journal recorded (so a
    resumed run, and every xdist worker, collects the same items); else the
    saved run's being replayed; else this run's, which a shard may not use
    (each shard would draw its own). `recorded` and `saved` look theirs up,
    asked in that order and only while no seed is chosen (None: none)."""
    seed = own
    for lookup in (recorded, saved):
        if seed is None:
            seed = lookup()
    if seed is not None:
        return seed
    if shard is not None:
        raise EvalReplayError(
            f"{name!r} draws its stages' tasks from a seed, and each shard of "
            f"--evalreplay-shard={shard} would draw its own: give it EloEval(seed=...) "
            "(or run the shards from a copy of a merged dir, whose journal records one)"
        )
    return run_seed


def same_rating(a: float | None, b: float | None) -> bool:
    """Two ratings equal up to float noise (a re-fit of the same verdicts); None only equals None."""
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def shown(rating: float | None) -> str:
    return "none" if rating is None else f"{rating:.1f}"


def wait_for_merge(
    name: str,
    plan: TaskPlan,
    index: JournalIndex | None,
    stages: int,
    max_attempts: int,
    selected: Sequence[RolloutKey],
) -> tuple[list[RolloutKey], list[RolloutKey], list[str]]:
    """A shard's selected items split into those it can run and those that
    wait (deselected), with a line saying so. A stage is planned from the
    rating after the one before, which needs every shard's verdicts: a shard
    runs stage s only when the journal it starts from (a copy of a merge)
    has a result for every item of stage s-1."""
    first = stages + 1
    for stage in range(1, stages):
        keys = [key for key in plan.keys if key[0] == stage]
        if index is None or any(item_outcome(plan, index, k, max_attempts).status == "missing" for k in keys):
            first = stage + 1
            break
    if first > stages:
        return list(selected), [], []
    later = f"stage {first}" if first == stages else f"stages {first}-{stages}"
    line = (
        f"{name}: {later} wait for every shard's stage {first - 1} (deselected): merge the shard dirs, "
        "then run each shard again from a copy of the merged dir (docs/scale.md)"
    )
    return [k for k in selected if k[0] < first], [k for k in selected if k[0] >= first], [line]
