"""An EloEval's rating from its journal: the judged pairs of each stage, the
cumulative Bradley-Terry fit after each stage (`elo.py`), the `elo` block of
metrics.json with its per-stage table, and the paired drop a gate reads."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_evalreplay.journal.index import JournalIndex, ScoreRef
from pytest_evalreplay.journal.rows import RolloutKey
from pytest_evalreplay.journal.stagelog import StageLog
from pytest_evalreplay.numbers.metrics import TaskOutcome, item_outcome
from pytest_evalreplay.numbers.planning import TaskPlan

if TYPE_CHECKING:
    from pytest_evalreplay.numbers.elo.fit import EloFit
    from pytest_evalreplay.numbers.elo.table import JudgmentTable


@dataclass(frozen=True)
class Ratings:
    plan: TaskPlan
    index: JournalIndex
    stage_tasks: Sequence[Sequence[str]]
    num_samples: int
    references: Mapping[str, float]  # name -> known rating
    seed: int
    max_attempts: int

    def stage_keys(self, stage: int) -> list[RolloutKey]:
        return [(stage, tid, r) for tid in self.stage_tasks[stage - 1] for r in range(self.num_samples)]

    def verdicts(self, key: RolloutKey) -> ScoreRef | None:
        """The score row an item's result stands on (None: not judged)."""
        outcome = item_outcome(self.plan, self.index, key, self.max_attempts)
        return None if outcome.gen is None else self.index.score_of(key, outcome.gen)

    def judged_rows(self, upto: int, only: int | None = None) -> list[tuple[str, str, float, int]]:
        rows: list[tuple[str, str, float, int]] = []
        for stage in range(1, upto + 1):
            if only is not None and stage != only:
                continue
            for key in self.stage_keys(stage):
                outcome = item_outcome(self.plan, self.index, key, self.max_attempts)
                if outcome.status != "ok" or outcome.gen is None:
                    continue
                score = self.index.score_of(key, outcome.gen)
                if score is None or not score.judgments:
                    continue
                for reference, values in score.judgments.items():
                    rows.extend((key[1], reference, v, stage) for v in values)
        return rows

    def table(self, upto: int, only: int | None = None) -> JudgmentTable:
        from pytest_evalreplay.numbers.elo.table import tabulate

        return tabulate(self.judged_rows(upto, only), self.references)

    def fit(self, upto: int, n_boot: int = 0) -> EloFit:
        from pytest_evalreplay.numbers.elo.fit import fit_elo

        return fit_elo(self.table(upto), n_boot=n_boot, seed=self.seed)

    def block(self, log: StageLog, plans: Mapping[int, Any], stages: int) -> dict[str, Any]:
        """The contract's `elo` block for metrics.json, with the per-stage table."""
        from pytest_evalreplay.numbers.elo.fit import fit_elo, fit_to_json, table_to_json
        from pytest_evalreplay.numbers.elo.table import tabulate

        # Each stage's judged rows once: every table below is a run of stages
        # (judged_rows(upto) is their concatenation), tabulated from them.
        per_stage = {stage: self.judged_rows(stage, only=stage) for stage in range(1, stages + 1)}

        def upto(last: int) -> list[tuple[str, str, float, int]]:
            return [row for stage in range(1, last + 1) for row in per_stage[stage]]

        whole = tabulate(upto(stages), self.references)
        final = fit_elo(whole, n_boot=1000, seed=self.seed)
        rows = []
        for stage in range(1, stages + 1):
            record = log.stages.get(stage)
            plan = plans.get(stage)
            references = list(plan.references) if plan else (list(record.references) if record else [])
            prior = plan.prior_rating if plan else (record.prior_rating if record else None)
            cumulative = fit_to_json(
                fit_elo(tabulate(upto(stage), self.references), n_boot=0, seed=self.seed)
            )
            table = tabulate(per_stage[stage], self.references)
            counts = {"wins": 0, "ties": 0, "losses": 0}
            for c in table.reference_counts():
                counts["wins"] += c.wins
                counts["ties"] += c.ties
                counts["losses"] += c.losses
            scored = [s for key in self.stage_keys(stage) if (s := self.verdicts(key)) is not None]
            rows.append(
                {
                    "stage": stage,
                    "references": references,
                    "task_ids": list(self.stage_tasks[stage - 1]),
                    "prior_rating": prior,
                    "rating": cumulative["rating"],
                    "se": cumulative["se"],
                    "ci95": cumulative["ci95"],
                    "judged": table.num_judgments,
                    **counts,
                    "no_answer": sum(len(s.no_answer) for s in scored),
                    "unreadable": sum(s.unreadable for s in scored),
                    "complete": bool(record is not None and record.complete),
                }
            )
        block = fit_to_json(final)
        block.update({"seed": self.seed, "stages": rows, "table": table_to_json(whole)})
        return block

    def with_rating(
        self, base: TaskOutcome, log: StageLog, plans: Mapping[int, Any], stages: int
    ) -> TaskOutcome:
        """The task's outcome with the rating as its metric (`elo`) and the elo block."""
        block = self.block(log, plans, stages)
        metrics = {"elo": block["rating"]} if block["rating"] is not None else {}
        lo, hi = block["ci95"]
        intervals = {"elo": (lo, hi)} if lo is not None and hi is not None else {}
        return dataclasses.replace(
            base, metrics=metrics, intervals=intervals, instance_scores={}, extra={"elo": block}
        )

    def paired_drop(self, baseline: Mapping[str, Any], stages: int) -> Any:
        """The rating's drop below a baseline's, paired over the tasks both judged
        (what Gate("elo", max_drop=...) reads)."""
        from pytest_evalreplay.numbers.elo.fit import compare_ratings, table_from_json
        from pytest_evalreplay.numbers.gates import PairedDrop

        base = table_from_json(baseline.get("table"), "the baseline's elo table")
        cmp = compare_ratings(self.table(upto=stages), base, seed=self.seed)
        return PairedDrop(
            n=cmp.num_tasks,
            drop=cmp.drop if cmp.drop is not None else float("nan"),
            p_value=cmp.p_value,
            interval=cmp.ci95,
        )
