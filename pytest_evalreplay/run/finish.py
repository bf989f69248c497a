"""The end of a session and its gates: a task's gate judged on its outcome,
each touched run's files written from its journal, the manifest, and the
baseline when asked. Nothing here generates or judges."""

from __future__ import annotations

import datetime as dt
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.numbers import gates
from pytest_evalreplay.numbers.metrics import TaskOutcome
from pytest_evalreplay.run.context import Run, RunContext
from pytest_evalreplay.rundir.writer import manifest_lock, write_manifest


@dataclass(frozen=True)
class TaskDoc:
    """A task's final numbers as shipped to the summary (and from xdist
    workers to the controller): `doc` is its metrics.json, `seen` how much
    journal the computation read (the fullest view wins)."""

    doc: dict[str, Any]
    instance_scores: dict[str, dict[str, float]]
    seen: int
    changed_request: int = 0
    changed_provider: int = 0
    failed_before: int = 0

    def extra(self) -> dict[str, int]:
        return {
            "changed_request": self.changed_request,
            "changed_provider": self.changed_provider,
            "failed_before": self.failed_before,
        }


def judge_gate(
    ctx: RunContext, run: Run, outcome: TaskOutcome, baseline: gates.BaselineTask | None
) -> gates.GateOutcome:
    gate = run.gate
    paired = None
    if gate.max_drop is not None and baseline is not None:
        paired = run.paired_drop(baseline)
    return gates.evaluate(
        task=run.name,
        gate=gate,
        metrics=outcome.metrics,
        scores=gates.metric_scores(outcome.instance_scores, gate.metric),
        num_items=outcome.num_items - outcome.num_missing,
        num_failed=outcome.num_failed,
        budget=ctx.settings.failure_budget,
        baseline=baseline,
        missing=outcome.num_missing,
        paired=paired,
        compared=ctx.settings.compare is not None,
    )


def finish_runs(ctx: RunContext, runs: Mapping[str, Run], rootdir: Path) -> dict[str, TaskDoc]:
    """Write each touched run's files (under its lock, so the last process of
    a run to finish writes the fullest view), the manifest, and the baseline."""
    docs: dict[str, TaskDoc] = {}
    entries: dict[str, gates.BaselineTask] = {}
    source = baseline_source(ctx, rootdir) if ctx.settings.update_baseline else None
    for name, run in runs.items():
        if not run.touched:
            continue
        outcome = run.finish()
        d = run.decisions
        docs[name] = TaskDoc(
            doc=outcome.to_doc(ctx.run_id),
            instance_scores=outcome.instance_scores,
            seen=run.recorder.index.offset,
            changed_request=d.changed_request,
            changed_provider=d.changed_provider,
            failed_before=len(d.failed),
        )
        if ctx.settings.update_baseline:
            entries[name] = gates.baseline_entry(
                run.gate, outcome.metrics, outcome.instance_scores, outcome.extra.get("elo"), source
            )
    if entries and ctx.settings.baseline is not None:
        from pytest_evalreplay.rundir import baseline

        try:
            baseline.update(ctx.settings.baseline, entries)
        except EvalReplayError as exc:
            ctx.note(f"baseline not updated: {exc}")
        else:
            ctx.note(f"baseline {ctx.settings.baseline} updated for: {', '.join(sorted(entries))}")
    out = ctx.output_resolved
    if docs and out is not None:
        with manifest_lock(out):
            write_manifest(out, ctx.model(), ctx.provider_identity, list(docs))
    ctx.compact_journals()  # last: nothing reads a journal after this
    return docs


def baseline_source(ctx: RunContext, rootdir: Path) -> dict[str, Any]:
    """Where a baseline written now comes from: model, run, date and, in a git
    work tree, the commit (one git call per session)."""
    commit = None
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=rootdir, capture_output=True, text=True, timeout=10
        )
        if out.returncode == 0:
            commit = out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "model": ctx.model(),
        "run": ctx.run_id,
        "date": dt.date.today().isoformat(),
        "commit": commit,
    }
