"""The merged dir's run dir written from its journals and the shards' markers
alone, without a pytest run of the suite: where the shards' scores are kept
and nothing at the end of a run needs the task's code, the run dir is a
function of the journal and of what each shard's marker records of the task
(its instance order, each instance's request as rendered, the reasoning
strip, pass@k: `TaskRun.merge_spec`). Written by the same code a session's end
uses (`metrics.task_outcome`, `writer.write_task`, `writer.write_manifest`),
so the files are the ones the suite's run writes; collecting and running
every item again cost the merge 56x a read of the journals.

Where a task needs its code (a gate, an agent's transcripts, a judge, an
EloEval's ratings, lm-eval's aggregation, maj@k's answers), where `--rescore`
scores again, where the merge's or a shard's options write more files (a
report, an HTML page, a comparison, a baseline: any argument after `--` but
the shards' own and `-q`/`-v`), or where a rollout was generated and never
scored, `needs_suite` says why and the merge runs the suite as before.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.journal.index import JournalIndex
from pytest_evalreplay.model import digest
from pytest_evalreplay.numbers.metrics import TaskOutcome, task_outcome
from pytest_evalreplay.numbers.passk import SampleMetric
from pytest_evalreplay.numbers.planning import TaskPlan
from pytest_evalreplay.rundir.merge import Merged
from pytest_evalreplay.rundir.writer import manifest_lock, write_manifest, write_task
from pytest_evalreplay.scorers import reasoning_stripped


def _terminal(arg: str) -> bool:
    """An option that only shapes the merge's terminal output (`-q`, `-vv`...)."""
    return arg in ("--quiet", "--verbose") or (len(arg) > 1 and arg[0] == "-" and set(arg[1:]) <= {"q", "v"})


def needs_suite(merged: Merged, args: Sequence[str], rescore: bool) -> str | None:
    """Why the merge must run the suite to write the run dir (None: it is
    written from the merged journals). Nothing here reads a journal."""
    if rescore:
        return "--rescore scores every rollout again"
    suites = {_key(recorded) for _, recorded in merged.suites.values()}
    if len(suites) != 1 or None in suites:
        return "the shards' markers record different suites (or none)"
    recorded = next(iter(merged.suites.values()))[1]
    given = [a for a in args if not _terminal(a)]
    if given != recorded["args"]:
        return "the arguments after -- are not the shards' suite arguments"
    for name in ("max_attempts", "finish"):
        values = {_key(m.get(name)) for m in merged.markers}
        if None in values:
            return "the shards' markers were written by an older version"
        if len(values) != 1:
            return f"the shards' markers record different {name}"
    finish = merged.markers[0].get("finish")
    attempts = merged.markers[0].get("max_attempts")
    if type(attempts) is not int or attempts < 1 or not isinstance(finish, list):
        return "the shards' markers were edited (max_attempts, finish)"
    if finish:
        return f"the shards' sessions wrote {', '.join(map(str, finish))} at their end"
    for task, config in merged.tasks.items():
        spec = config.get("rundir")
        if not isinstance(spec, dict):
            return f"task {task!r}: {spec or 'its marker records no run dir configuration'}"
        if not _consistent(spec, config):
            return f"task {task!r}: its marker's run dir configuration does not match its requests (edited?)"
    return None


def _key(value: Any) -> Any:
    return None if value is None else orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _consistent(spec: Mapping[str, Any], config: Mapping[str, Any]) -> bool:
    """The recorded order and requests are the ones the compared digest covers."""
    order = spec.get("order")
    n = spec.get("num_samples")
    if not isinstance(order, list) or type(n) is not int or n < 1 or len(order) * n != config.get("items"):
        return False
    if not all(isinstance(p, list) and len(p) == 2 and all(isinstance(v, str) for v in p) for p in order):
        return False
    metrics = spec.get("pass")
    if not isinstance(spec.get("strip_reasoning"), bool) or not isinstance(metrics, list):
        return False
    if not all(
        isinstance(m, list)
        and len(m) == 2
        and type(m[0]) is int
        and m[0] >= 1
        and (m[1] is None or isinstance(m[1], str))
        for m in metrics
    ):
        return False
    return digest(sorted([1, iid, rq] for iid, rq in order)) == config.get("requests")


def outcomes(
    out: Path, merged: Merged, run: str
) -> tuple[dict[str, tuple[TaskOutcome, JournalIndex]], str | None]:
    """Each task's numbers over the merged journal in OUT, as the suite's
    run `run` computes them; or why the suite must run after all (a rollout
    generated and never scored: the suite's run scores it)."""
    max_attempts = int(merged.markers[0]["max_attempts"])
    done: dict[str, tuple[TaskOutcome, JournalIndex]] = {}
    for task, config in merged.tasks.items():
        spec = config["rundir"]
        n = spec["num_samples"]
        requests = {(1, iid): rq for iid, rq in spec["order"]}
        keys = tuple((1, iid, r) for iid, _ in spec["order"] for r in range(n))
        sample = tuple(SampleMetric("pass", k, score) for k, score in spec["pass"])
        plan = TaskPlan(task, keys, requests, config["provider"], sample)
        index = JournalIndex.read(out, task)
        if config["provider"] not in index.providers:  # the manifest names the provider that made it
            return {}, f"task {task!r}: its journal holds nothing its provider made"
        model = index.providers[config["provider"]].get("model")
        outcome = task_outcome(plan, index, max_attempts, run, model if isinstance(model, str) else None)
        unscored = sum(1 for i in outcome.items if i.status == "missing" and i.gen is not None)
        if unscored:
            return {}, f"task {task!r}: {unscored} rollouts were generated and never scored"
        done[task] = (outcome, index)
    return done, None


def write_run_dir(
    out: Path, merged: Merged, done: Mapping[str, tuple[TaskOutcome, JournalIndex]], run: str
) -> None:
    """Each task's requests, predictions and metrics, and the manifest, as
    the suite's run `run` writes them."""
    identity: dict[str, Any] = {}
    for task, (outcome, index) in done.items():
        config = merged.tasks[task]
        spec = config["rundir"]
        order = [iid for iid, _ in spec["order"]]
        strip = reasoning_stripped if spec["strip_reasoning"] else None
        write_task(out, outcome, run, index, order, spec["num_samples"], postprocess=strip)
        identity = index.providers[config["provider"]]
    model = identity.get("model")
    with manifest_lock(out):
        write_manifest(out, model if isinstance(model, str) else None, identity, list(done))


def new_run() -> str:
    """A run id, as a session makes its own."""
    return uuid.uuid4().hex
