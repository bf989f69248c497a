"""Which stages of an ELO eval run now: pure decisions over the plan and the journal.

A stage is planned from the rating after the one before, so what a run may
do with a stage depends on what the journal holds of the earlier ones.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_evalreplay.journal.index import JournalIndex
from pytest_evalreplay.journal.rows import RolloutKey
from pytest_evalreplay.numbers.metrics import item_outcome
from pytest_evalreplay.numbers.planning import TaskPlan


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
