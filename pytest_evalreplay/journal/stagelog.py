"""What a multi-stage eval's journal records of its stages: the drawn seed,
each stage's plan (task ids, references, the rating it started from, its
fingerprint) before anything of it is judged, and a `complete` record after
its last item. `StageLog.read` validates them, naming file and line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_evalreplay.journal.index import JournalIndex
from pytest_evalreplay.model import EvalReplayError


@dataclass
class StageRecord:
    """What the journal says of one stage: its newest plan, and whether a
    `complete` record followed that plan."""

    stage: int
    task_ids: list[str]
    references: list[str]
    prior_rating: float | None
    fingerprint: str
    config: dict[str, Any]
    run: str
    lineno: int
    complete: bool = False
    rating: float | None = None
    se: float | None = None


@dataclass
class StageLog:
    """The stage records of a journal: the drawn seed and each stage's newest plan."""

    seed: int | None = None
    stages: dict[int, StageRecord] = field(default_factory=dict)

    @classmethod
    def read(cls, index: JournalIndex) -> StageLog:
        log = cls()
        for lineno, row in index.stage_rows:
            where = f"{index.path}:{lineno}"
            kind = row.get("kind")
            if kind == "seed":
                if type(row.get("seed")) is not int:
                    raise EvalReplayError(f"{where}: a seed record needs an integer 'seed'")
                if log.seed is None:
                    log.seed = row["seed"]
            elif kind == "planned":
                stage = row.get("stage")
                ok = (
                    type(stage) is int
                    and isinstance(row.get("task_ids"), list)
                    and all(isinstance(t, str) for t in row["task_ids"])
                    and isinstance(row.get("references"), list)
                    and all(isinstance(r, str) for r in row["references"])
                    and isinstance(row.get("fingerprint"), str)
                    and isinstance(row.get("config"), dict)
                    and (row.get("prior_rating") is None or isinstance(row.get("prior_rating"), (int, float)))
                )
                if not ok:
                    raise EvalReplayError(
                        f"{where}: not a valid stage plan record; run with --evalreplay-reset"
                    )
                log.stages[stage] = StageRecord(
                    stage=stage,
                    task_ids=row["task_ids"],
                    references=row["references"],
                    prior_rating=row.get("prior_rating"),
                    fingerprint=row["fingerprint"],
                    config=row["config"],
                    run=str(row.get("run")),
                    lineno=lineno,
                )
            elif kind == "complete":
                stage = row.get("stage")
                record = log.stages.get(stage) if type(stage) is int else None
                if record is not None and row.get("fingerprint") == record.fingerprint:
                    record.complete = True
                    rating, se = row.get("rating"), row.get("se")
                    record.rating = float(rating) if isinstance(rating, (int, float)) else None
                    record.se = float(se) if isinstance(se, (int, float)) else None
            else:
                raise EvalReplayError(f"{where}: unknown stage record kind {kind!r}")
        return log


def seed_row(seed: int, run: str) -> dict[str, Any]:
    return {"type": "stage", "kind": "seed", "seed": seed, "run": run}


def planned_row(
    stage: int,
    task_ids: Sequence[str],
    references: Sequence[str],
    prior_rating: float | None,
    fingerprint: str,
    config: Mapping[str, Any],
    run: str,
) -> dict[str, Any]:
    return {
        "type": "stage",
        "kind": "planned",
        "stage": stage,
        "task_ids": list(task_ids),
        "references": list(references),
        "prior_rating": prior_rating,
        "fingerprint": fingerprint,
        "config": dict(config),
        "run": run,
    }


def complete_row(
    stage: int, rating: float | None, se: float | None, fingerprint: str, run: str
) -> dict[str, Any]:
    return {
        "type": "stage",
        "kind": "complete",
        "stage": stage,
        "rating": rating,
        "se": se,
        "fingerprint": fingerprint,
        "run": run,
    }
