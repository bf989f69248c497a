"""The evaluation session: selected items per task, batched generation, the
journal and the run dir, wired together for one pytest session.

`plugin.py` calls in here from its hooks; this module owns the state and the
side effects (provider, files), and keeps pytest's objects at arm's length.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_evalreplay import baseline, gates, journal, rundir
from pytest_evalreplay.execution import AttemptFailure, RequestKey, run_requests
from pytest_evalreplay.fingerprint import fingerprint
from pytest_evalreplay.items import RolloutItem, TaskItem, mark_reused
from pytest_evalreplay.journal import Failure, JournalState, JournalWriter, RolloutKey
from pytest_evalreplay.model import EvalReplayError, Provider, Request, RolloutResult
from pytest_evalreplay.options import Settings
from pytest_evalreplay.task import EvalTask

ProviderFactory = Callable[[str], Provider]
Notify = Callable[[str], None]


@dataclass
class TaskRun:
    """One task's part of the session: what runs, what is reused, what came back."""

    task: EvalTask
    config: dict[str, Any]
    fingerprint: str
    writer: JournalWriter
    prior: JournalState = field(default_factory=JournalState)
    selected: list[RolloutKey] = field(default_factory=list)
    reused: dict[RolloutKey, RolloutResult] = field(default_factory=dict)
    prior_final: dict[RolloutKey, Failure] = field(default_factory=dict)
    prior_failed: dict[RolloutKey, Failure] = field(default_factory=dict)
    results: dict[RolloutKey, RolloutResult] = field(default_factory=dict)
    chunks: list[list[Request]] | None = None
    chunk_of: dict[RequestKey, int] = field(default_factory=dict)

    def requests(self) -> list[Request]:
        """One request per (stage, instance) for its selected rollouts, in run order."""
        wanted: dict[RequestKey, list[int]] = {}
        for stage, iid, rollout in self.selected:
            if (stage, iid, rollout) not in self.prior_failed:
                wanted.setdefault((stage, iid), []).append(rollout)
        return [
            self.task.request(self.task.instance(iid), stage=stage, rollouts=tuple(sorted(rs)))
            for (stage, iid), rs in wanted.items()
        ]


class EvalSession:
    def __init__(
        self,
        settings: Settings,
        output: Callable[[], Path],
        run_id: str | None,
        make_provider: ProviderFactory,
        notify: Notify,
        progress: Callable[[str, int, int, int, float], None],
    ) -> None:
        self.settings = settings
        self._output_factory = output
        self._output: Path | None = None
        self.run_id = run_id or uuid.uuid4().hex
        self._make_provider = make_provider
        self._provider: Provider | None = None
        self._replay: Provider | None = None
        self.notify = notify
        self.progress = progress
        self.runs: dict[str, TaskRun] = {}
        self.notes: list[str] = []
        self._baseline: dict[str, gates.BaselineTask] | None = None

    @property
    def output(self) -> Path:
        """The run dir, resolved on first use so a session without evals writes nothing."""
        if self._output is None:
            self._output = self._output_factory()
            rundir.check_output_dir(self._output)
        return self._output

    # -- identity ----------------------------------------------------------

    def provider_config(self) -> dict[str, Any]:
        """The provider's part of every task's fingerprint: its kind and model
        (the built provider's own `model` where it has one, as a conftest
        provider or a saved run does), plus what else picks the weights."""
        s = self.settings
        kind = s.provider
        model = getattr(self._provider, "model", None) or s.model
        ident: dict[str, Any] = {"kind": kind, "model": model}
        if kind == "replay" and s.predictions is not None:
            ident["predictions"] = str(s.predictions)
        if kind == "vllm":
            ident["engine_args"] = s.engine_args
        return ident

    @property
    def provider(self) -> Provider:
        if self._provider is None:
            kind = self.settings.provider
            if kind is None:
                raise EvalReplayError(
                    "no provider chosen: pass --evalreplay-provider=KIND (ini evalreplay_provider) "
                    "or --evalreplay-predictions=PATH to rescore a saved run"
                )
            self._provider = self._make_provider(kind)
        return self._provider

    def prepare_provider(self, items: Sequence[Any]) -> None:
        """Build the provider when eval items will run, before fingerprints are
        taken: a bad provider setting (an unreadable predictions dir, vLLM not
        installed) is then a usage error before the first item rather than a
        failure of every item, and the provider's model joins the fingerprint."""
        if any(isinstance(item, TaskItem) for item in items):
            _ = self.provider

    def replay_provider(self) -> Provider:
        """What the `replay_provider` fixture serves."""
        if self.settings.predictions is None:
            raise EvalReplayError(
                "the replay_provider fixture needs saved generations: pass "
                "--evalreplay-predictions=PATH (or set the ini key evalreplay_predictions)"
            )
        if self.settings.provider == "replay":
            return self.provider
        if self._replay is None:
            self._replay = self._make_provider("replay")
        return self._replay

    # -- collection --------------------------------------------------------

    def register(self, items: Sequence[Any]) -> None:
        """Group the selected items by task; on --resume, mark what the journal holds."""
        for item in items:
            if not isinstance(item, TaskItem):
                continue
            run = self.runs.get(item.task.name) or self._new_run(item.task)
            if run.task is not item.task:
                raise EvalReplayError(
                    f"two different tasks are named {item.task.name!r} ({item.nodeid}); "
                    "task names must be unique in a session (they name run dir files)"
                )
            if not isinstance(item, RolloutItem):
                continue  # a gate item: its task needs a run, nothing more
            key = item.key
            if key in run.prior.done:
                run.reused[key] = run.prior.done[key]
                mark_reused(item, run.prior.done[key])
            else:
                if key in run.prior_final:
                    run.prior_failed[key] = run.prior_final[key]
                run.selected.append(key)
        for run in self.runs.values():
            if self.settings.resume and run.reused:
                self.notes.append(f"{run.task.name}: reused {len(run.reused)} item(s) from the journal")

    def _new_run(self, task: EvalTask) -> TaskRun:
        # Flat, so a change reads as "config changed: sampling.temperature".
        config = {**task.config(), "provider": self.provider_config()}
        fp = fingerprint(config)
        writer = JournalWriter(self.output, task.name, fp, config, self.run_id, self.settings.resume)
        run = TaskRun(task=task, config=config, fingerprint=fp, writer=writer)
        if self.settings.resume:
            state = journal.read(self.output, task.name)
            reason = journal.staleness(state, fp, config)
            if reason is None:
                run.prior = state
                run.prior_final = state.final_failures(self.settings.max_attempts)
            elif state.header is not None:
                message = f"evalreplay: {task.name}: starting fresh ({reason})"
                self.notify(message)
                self.notes.append(message.removeprefix("evalreplay: "))
        self.runs[task.name] = run
        return run

    # -- running -----------------------------------------------------------

    def result_for(self, item: RolloutItem) -> RolloutResult:
        run = self.runs[item.task.name]
        key = item.key
        if key not in run.results:
            if key in run.prior_failed:
                failure = run.prior_failed[key]
                return RolloutResult(
                    task=run.task.name,
                    stage=key[0],
                    instance_id=key[1],
                    rollout=key[2],
                    error=f"failed for good in an earlier run (attempt {failure.attempts}, "
                    f"{failure.failure_class}): {failure.message}; run without --resume, or raise "
                    "--evalreplay-max-attempts, to try it again",
                    failure_class=failure.failure_class,
                )
            self._generate_chunk(run, (key[0], key[1]))
        return run.results[key]

    def _generate_chunk(self, run: TaskRun, request_key: RequestKey) -> None:
        if run.chunks is None:
            requests = run.requests()
            size = self.settings.batch_size or getattr(self.provider, "batch_size", None) or len(requests)
            run.chunks = [requests[i : i + size] for i in range(0, len(requests), size)]
            run.chunk_of = {(r.stage, r.instance_id): n for n, chunk in enumerate(run.chunks) for r in chunk}
        if not run.writer.opened:
            run.writer.open()
            if run.writer.fresh:
                rundir.clear_task(self.output, run.task.name)
        index = run.chunk_of[request_key]
        chunk = run.chunks[index]
        failures: list[dict[str, Any]] = []

        def flush_failures() -> None:
            run.writer.write(failures=failures)
            failures.clear()

        def on_failure(f: AttemptFailure) -> None:
            failures.append(
                journal.failure_row(
                    f.request.stage,
                    f.request.instance_id,
                    f.request.rollouts,
                    f.attempt,
                    f.failure_class,
                    f.message,
                    f.final,
                    self.run_id,
                )
            )

        started = time.perf_counter()
        results = run_requests(
            run.task,
            self.provider,
            chunk,
            self.settings.max_attempts,
            run.prior.attempts(),
            on_failure,
            flush_failures,
        )
        elapsed = time.perf_counter() - started
        self._persist(run, chunk, results, failures)
        for r in results:
            run.results[(r.stage, r.instance_id, r.rollout)] = r
        done = sum(len(c) for c in run.chunks[: index + 1])
        tokens = sum(r.generation.completion_tokens or 0 for r in results if r.generation)
        self.progress(run.task.name, done, sum(len(c) for c in run.chunks), tokens, elapsed)

    def _persist(
        self, run: TaskRun, chunk: list[Request], results: list[RolloutResult], failures: list[dict[str, Any]]
    ) -> None:
        """Journal first (durable before any item reports), then the run dir log."""
        model = getattr(self.provider, "model", None)
        ok = [r for r in results if r.ok]
        by_request: dict[RequestKey, list[RolloutResult]] = {}
        for r in ok:
            by_request.setdefault((r.stage, r.instance_id), []).append(r)
        for r in results:
            if r.failure_class == "scoring":
                failures.append(
                    journal.failure_row(
                        r.stage,
                        r.instance_id,
                        [r.rollout],
                        1,
                        "scoring",
                        r.error or "",
                        True,
                        self.run_id,
                    )
                )
        request_rows = {(q.stage, q.instance_id): q.to_row() for q in chunk}
        rows: list[dict[str, Any]] = []
        for key, group in by_request.items():
            rows.append(journal.request_row(key[0], key[1], request_rows[key]))
            rows.extend(journal.done_row(r, model) for r in group)
        run.writer.write(done=rows, failures=failures)
        rundir.append(
            self.output,
            run.task.name,
            [request_rows[k] for k in by_request],
            [
                rundir.prediction_row(k[1], k[0], g, run.task.num_samples, model)
                for k, g in by_request.items()
            ],
        )

    # -- gates -------------------------------------------------------------

    def baseline(self) -> dict[str, gates.BaselineTask]:
        if self._baseline is None:
            path = self.settings.baseline
            self._baseline = baseline.read(path) if path is not None else {}
        return self._baseline

    def gate_outcome(self, task: EvalTask) -> gates.GateOutcome:
        """Judge a task's gate on what its journal holds for this configuration
        (this run's rollouts and, under --resume, the reused ones)."""
        assert task.gate is not None
        run = self.runs[task.name]
        state = journal.read(self.output, task.name)
        if state.fingerprint != run.fingerprint:
            raise EvalReplayError(
                f"no results of this configuration for task {task.name!r} yet: run its items "
                "(a -k that selects the gate alone judges the journal of the last run)"
            )
        doc, scores = rundir.metrics_doc(task.name, state)
        return gates.evaluate(
            task=task.name,
            gate=task.gate,
            metrics=doc["metrics"],
            scores=gates.metric_scores(scores, task.gate.metric),
            num_items=doc["num_items"],
            num_failed=doc["num_failed"],
            budget=self.settings.failure_budget,
            baseline=self.baseline().get(task.name),
        )

    @staticmethod
    def _baseline_entry(
        task: EvalTask, metrics: dict[str, float], scores: dict[str, dict[str, float]]
    ) -> gates.BaselineTask:
        # The gated metric's per-instance scores; with no gate, a sole metric's.
        metric = task.gate.metric if task.gate is not None else None
        if metric is None and len(metrics) == 1:
            metric = next(iter(metrics))
        per_instance = gates.metric_scores(scores, metric) if metric else {}
        return gates.BaselineTask(metrics=metrics, scores=per_instance, metric=metric)

    # -- the end -----------------------------------------------------------

    def finish(self) -> list[dict[str, Any]]:
        """Rewrite each touched task's run dir files from its journal; write the manifest."""
        docs: list[dict[str, Any]] = []
        entries: dict[str, gates.BaselineTask] = {}
        for name, run in self.runs.items():
            if not (run.writer.opened or run.reused or run.prior_failed):
                continue
            state = journal.read(self.output, name)
            order = [inst["id"] for inst in run.task.instances]
            doc, scores = rundir.finalize(self.output, name, state, order, run.task.num_samples)
            docs.append(doc)
            if self.settings.update_baseline:
                entries[name] = self._baseline_entry(run.task, doc["metrics"], scores)
        if self.settings.baseline is not None and entries:
            baseline.update(self.settings.baseline, entries)
            self.notes.append(f"baseline {self.settings.baseline} updated for: {', '.join(sorted(entries))}")
        if docs:
            model = getattr(self._provider, "model", None) or next(
                (d["model"] for d in docs if d.get("model")), None
            )
            rundir.write_manifest(self.output, model, self.provider_config(), [d["task"] for d in docs])
        if self._provider is not None and hasattr(self._provider, "close"):
            self._provider.close()
        return docs
