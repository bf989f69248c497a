"""Multi-stage ELO evaluation: `EloEval`, its `Stage`s and `Reference`s, and
what the journal records of each stage.

A candidate model answers tasks drawn from a pool, stage by stage; each of
its answers is judged against reference models whose ELO is known, and the
rating is fitted after every stage (`elo.py`). A later stage may judge only
against the references nearest the rating so far, so a stage's plan (its
task ids, its references, the rating it started from) is recorded in the
task's journal before any of its items runs, and marked complete after its
last one. A stage's fingerprint covers the pool, the candidate's provider,
the judge, the references, the seed and the configuration of that stage and
every stage before it: editing stage 3 leaves stages 1 and 2 valid.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_evalreplay.gates import Gate
from pytest_evalreplay.journal import JournalIndex, digest
from pytest_evalreplay.judges import LlmJudge, validate_judge
from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.task import EvalTask, validate_task_name

_REF_NAME = re.compile(r"[A-Za-z0-9_.-]+")
# References' saved answers are fingerprinted by content up to this size (by
# size and modification time above it), so a clone of the project resumes.
REFERENCE_CONTENT_LIMIT = 64 * 2**20
MAX_SEED = 2**63  # seeds are recorded in JSON and feed numpy's bootstrap: non-negative 64-bit ints


@dataclass(frozen=True)
class Reference:
    """A reference model: its known rating and its saved answers (a run dir, a
    predictions file, or a layout replay reads), served by the replay provider."""

    elo: float
    predictions: str | os.PathLike[str]

    def __post_init__(self) -> None:
        if (
            isinstance(self.elo, bool)
            or not isinstance(self.elo, (int, float))
            or not math.isfinite(self.elo)
        ):
            raise EvalReplayError(
                f"Reference(elo={self.elo!r}): give the reference's rating, a finite number"
            )
        if not isinstance(self.predictions, (str, os.PathLike)):
            raise EvalReplayError(
                f"Reference(predictions={self.predictions!r}): give the path of its saved run"
            )


@dataclass(frozen=True)
class Stage:
    """One round: `tasks` pool tasks drawn for it (None: every task earlier
    stages did not draw), judged against `references` references (None: all;
    k: the k nearest the rating after the previous stage). `seed`, if given,
    draws this stage's tasks instead of the eval's seed."""

    tasks: int | None = None
    references: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("tasks", "references"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise EvalReplayError(f"Stage({name}={value!r}): give a positive int, or None")
        if self.seed is not None and (type(self.seed) is not int or not 0 <= self.seed < MAX_SEED):
            raise EvalReplayError(f"Stage(seed={self.seed!r}): give an int in [0, 2**63), or None")

    def config(self) -> dict[str, Any]:
        return {"tasks": self.tasks, "references": self.references, "seed": self.seed}


def _caller_file() -> tuple[Path | None, int]:
    frame = sys._getframe(2)
    file = frame.f_globals.get("__file__")
    return (Path(file).resolve() if file else None), frame.f_lineno


class EloEval:
    """A multi-stage pairwise-judged evaluation. Module-level instances in test
    modules are collected as one pytest item per (task, stage, rollout), with
    ids like `test_x.py::memo::t003[s2-r1]`."""

    def __init__(
        self,
        name: str,
        pool: EvalTask,
        references: Mapping[str, Reference],
        stages: Sequence[Stage],
        judge: Any,
        seed: int | None = None,
        gate: Gate | None = None,
    ) -> None:
        __tracebackhide__ = True  # a bad argument is reported at the user's EloEval(...) line, in one line
        self.defined_in, self.defined_line = _caller_file()
        try:
            self._setup(name, pool, references, stages, judge, seed, gate)
        except EvalReplayError as exc:
            raise EvalReplayError(str(exc)) from None

    def _setup(
        self,
        name: str,
        pool: EvalTask,
        references: Mapping[str, Reference],
        stages: Sequence[Stage],
        judge: Any,
        seed: int | None,
        gate: Gate | None,
    ) -> None:
        self.name = validate_task_name(name)
        where = f"EloEval {name!r}"
        if not isinstance(pool, EvalTask):
            raise EvalReplayError(
                f"{where}: pool must be an EvalTask (the tasks and prompt the candidate answers)"
            )
        self.pool = pool
        if not isinstance(references, Mapping) or not references:
            raise EvalReplayError(
                f"{where}: references must be a dict of name -> Reference(elo, predictions)"
            )
        base = self.defined_in.parent if self.defined_in is not None else Path.cwd()
        refs: dict[str, Reference] = {}
        for ref_name, ref in references.items():
            if not isinstance(ref_name, str) or not _REF_NAME.fullmatch(ref_name):
                raise EvalReplayError(
                    f"{where}: reference name {ref_name!r}: use letters, digits, '_', '.', '-'"
                )
            if not isinstance(ref, Reference):
                raise EvalReplayError(
                    f"{where}: references[{ref_name!r}] must be a Reference(elo, predictions)"
                )
            path = Path(ref.predictions).expanduser()
            refs[ref_name] = Reference(float(ref.elo), path if path.is_absolute() else base / path)
        self.references = dict(sorted(refs.items()))
        if not isinstance(stages, Sequence) or not stages or not all(isinstance(s, Stage) for s in stages):
            raise EvalReplayError(f"{where}: stages must be a non-empty list of Stage(...)")
        self.stages = list(stages)
        for n, stage in enumerate(self.stages, 1):
            if stage.references is not None and stage.references > len(self.references):
                raise EvalReplayError(
                    f"{where}: stage {n} asks for {stage.references} references but there are "
                    f"{len(self.references)}"
                )
        self.judge = validate_judge(judge, where)
        if seed is not None and (type(seed) is not int or not 0 <= seed < MAX_SEED):
            raise EvalReplayError(f"{where}: seed must be an int in [0, 2**63) or None, got {seed!r}")
        self.seed = seed
        if gate is not None and not isinstance(gate, Gate):
            raise EvalReplayError(f"{where}: gate must be a Gate(...), got {type(gate).__name__}")
        self.gate = gate

    def __repr__(self) -> str:
        return f"EloEval({self.name!r}, pool={self.pool.name!r}, {len(self.stages)} stages)"

    @property
    def num_samples(self) -> int:
        return self.pool.num_samples

    @property
    def instances(self) -> list[dict[str, Any]]:
        return self.pool.instances

    def draw(self, seed: int) -> list[list[str]]:
        """Each stage's task ids: drawn from the pool with `seed` (or the stage's
        own), without replacement across stages."""
        from pytest_evalreplay.elo import draw_stage_tasks

        left = [inst["id"] for inst in self.pool.instances]
        out: list[list[str]] = []
        for n, stage in enumerate(self.stages, 1):
            try:
                (ids,) = draw_stage_tasks(left, [stage.tasks], stage.seed if stage.seed is not None else seed)
            except EvalReplayError as exc:
                raise EvalReplayError(f"EloEval {self.name!r}, stage {n}: {exc}") from None
            out.append(ids)
            taken = set(ids)
            left = [t for t in left if t not in taken]
        return out

    def judge_identity(self) -> Any:
        from pytest_evalreplay.fingerprint import callable_identity

        if isinstance(self.judge, LlmJudge):
            ident = self.judge.identity()
            provider = self.judge.provider
            if provider is None or isinstance(provider, str):
                ident["provider"] = {"kind": provider, "model": self.judge.model}
            else:
                ident["provider"] = {
                    "kind": getattr(provider, "kind", None),
                    "model": getattr(provider, "model", None),
                }
            return {"llm": ident}
        return {"function": callable_identity(self.judge)}


def stage_configs(
    eval_: EloEval, seed: int, pool_requests: Mapping[str, str], candidate: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """What each stage's fingerprint covers, cumulative: stage s's config holds
    the shared parts and the configs of stages 1..s."""
    from pytest_evalreplay.providers import path_signature

    shared = {
        "pool": digest(sorted(pool_requests.items())),
        "num_samples": eval_.num_samples,
        "candidate": dict(candidate),
        "judge": eval_.judge_identity(),
        "references": {
            name: {"elo": ref.elo, "answers": path_signature(Path(ref.predictions), REFERENCE_CONTENT_LIMIT)}
            for name, ref in eval_.references.items()
        },
        "seed": seed,
    }
    out = []
    for s in range(1, len(eval_.stages) + 1):
        out.append({**shared, "stages": {str(n): eval_.stages[n - 1].config() for n in range(1, s + 1)}})
    return out


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
    completed_by: str | None = None  # the run of the newest `complete` record


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
                    record.completed_by = str(row.get("run"))
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
