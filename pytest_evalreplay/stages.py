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

import hashlib
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_evalreplay.gate import Gate
from pytest_evalreplay.judges import LlmJudge, validate_judge
from pytest_evalreplay.model import TASK_NAME, EvalReplayError, digest
from pytest_evalreplay.task import EvalTask, validate_task_name

# References' saved answers are fingerprinted by content up to this size (by
# size and modification time above it), so a clone of the project resumes.
REFERENCE_CONTENT_LIMIT = 64 * 2**20
MAX_SEED = 2**63  # seeds are recorded in JSON and feed numpy's bootstrap: non-negative 64-bit ints


@dataclass(frozen=True)
class Reference:
    """A reference model: its known rating and its saved answers (a run dir, a
    predictions file, or a layout replay reads), read by replay's saved-run readers."""

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
        if pool.agent is not None:
            raise EvalReplayError(
                f"{where}: pool {pool.name!r} is an agent task; an EloEval judges one answer per "
                "prompt, so its pool must be a prompt task (EvalTask(..., prompt=...))"
            )
        if pool.choices is not None:
            raise EvalReplayError(
                f"{where}: pool {pool.name!r} is a choices task, scored by log-likelihood; an EloEval "
                "judges generated answers, so its pool must generate (drop choices=...)"
            )
        self.pool = pool
        if not isinstance(references, Mapping) or not references:
            raise EvalReplayError(
                f"{where}: references must be a dict of name -> Reference(elo, predictions)"
            )
        base = self.defined_in.parent if self.defined_in is not None else Path.cwd()
        refs: dict[str, Reference] = {}
        for ref_name, ref in references.items():
            if not isinstance(ref_name, str) or not TASK_NAME.fullmatch(
                ref_name
            ):  # the same rule as task names
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
        from pytest_evalreplay.values.fingerprint import callable_identity

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
    from pytest_evalreplay.values.fingerprint import path_signature

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


def draw_stage_tasks(pool_ids: Sequence[str], sizes: Sequence[int | None], seed: int) -> list[list[str]]:
    """Each stage's task ids, drawn from the pool without replacement across stages.

    A size of None takes every pool task no earlier stage drew. The draw ranks
    the pool by a keyed hash of (seed, task id) and deals stages off the top:
    the same on every platform, process and numpy version, independent of the
    pool's order, and a stage's draw does not depend on later stages' sizes.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise EvalReplayError(f"seed={seed!r}: the stage seed must be an int")
    ids = list(pool_ids)
    if len(set(ids)) != len(ids):
        dup = next(t for t in ids if ids.count(t) > 1)
        raise EvalReplayError(f"the task pool lists instance {dup!r} twice; instance ids must be unique")
    key = str(seed).encode() + b"\0"
    order = sorted(ids, key=lambda t: (hashlib.blake2b(key + t.encode(), digest_size=8).digest(), t))
    stages: list[list[str]] = []
    taken = 0
    for number, size in enumerate(sizes, start=1):
        left = len(order) - taken
        if size is None:
            if left == 0:
                raise EvalReplayError(
                    f"stage {number} takes every remaining pool task, but stages 1..{number - 1} drew all "
                    f"{len(order)}; drop stage {number} or make the pool larger"
                )
            size = left
        elif isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise EvalReplayError(f"stage {number}: tasks={size!r}; give an int >= 1, or None for the rest")
        elif size > left:
            if number == 1:
                where = f"the pool has only {len(order)}"
            else:
                before = "stage 1" if number == 2 else f"stages 1..{number - 1}"
                where = f"only {left} of the pool's {len(order)} remain after {before}"
            raise EvalReplayError(f"stage {number} asks for {size} tasks but {where}; ask for at most {left}")
        stages.append(order[taken : taken + size])
        taken += size
    return stages
