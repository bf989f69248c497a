"""Collection: an `EvalTask` becomes a collector of one item per
(stage, instance, rollout), with node ids like `test_evals.py::gsm8k::q0042[s1-r0]`,
plus `<task>::gate` when the task has a gate. Items hold keys, not data."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.run.execution import RolloutResult
from pytest_evalreplay.stages import EloEval
from pytest_evalreplay.task import EvalTask
from pytest_evalreplay.values.credentials import configured_secrets, redact

if TYPE_CHECKING:
    from typing_extensions import Self

    from pytest_evalreplay.run.session import EvalSession

SESSION_KEY: pytest.StashKey[EvalSession] = pytest.StashKey()
COLLECTED_KEY: pytest.StashKey[dict[int, str]] = pytest.StashKey()
REUSED_REASON = "evalreplay: reused from journal"
_MARK = pytest.mark.evalreplay  # on every task's collector


class ItemFailed(Exception):
    """Generation, scoring or judging failed for good; reported as one line."""


def session_of(config: pytest.Config) -> EvalSession:
    """The plugin's session (built on first use: collection may be the first)."""
    if SESSION_KEY not in config.stash:
        config.pluginmanager.get_plugin("evalreplay-session").session  # noqa: B018 - builds and stashes it
    return config.stash[SESSION_KEY]


def collect_eval(collector: pytest.Collector, obj: Any, is_elo: bool) -> Any:
    """The collector of an `EvalTask` or `EloEval` met in a module, or [] where
    it is collected elsewhere (the hooks' `pytest_pycollect_makeitem`)."""
    if not is_elo and _pool_of_an_elo_eval(collector, obj):
        return []  # an EloEval's pool: its items are the EloEval's
    collector.config.pluginmanager.get_plugin("evalreplay-session").evals_collected()
    if not _collected_here(collector, obj):
        return []  # the same task imported into a second module: collected where it is defined
    seen = collector.config.stash.setdefault(COLLECTED_KEY, {})
    first = seen.setdefault(id(obj), collector.nodeid)
    if first != collector.nodeid:
        return []  # defined outside every collected module: collected once, where first met
    if is_elo:
        return EloCollector.from_parent(collector, name=obj.name, eval_=obj)  # type: ignore[attr-defined]
    return TaskCollector.from_parent(collector, name=obj.name, task=obj)  # type: ignore[attr-defined]


def _collected_here(collector: pytest.Collector, task: Any) -> bool:
    """A task belongs to the module that defines it, whatever module imports
    it and whichever is collected first: its node ids (JUnit class names,
    `--lf`'s cache) do not depend on collection order. Only a task defined
    outside every module this session collects (a helper module, a module
    not selected) is collected where it is imported."""
    home = getattr(task, "defined_in", None)
    here = getattr(collector, "path", None)
    if home is None or here is None or Path(here).resolve() == home:
        return True
    return not _will_collect(collector.config, home)


def _will_collect(config: pytest.Config, path: Path) -> bool:
    """Whether this session collects `path` as a test module: a python_files
    match under one of the paths pytest was given (a node id given names its file)."""
    from _pytest.python import path_matches_patterns

    if not path_matches_patterns(path, config.getini("python_files")):
        return False
    base = config.invocation_params.dir
    for arg in config.args:
        given = (base / arg.split("::")[0]).resolve()
        if given == path or (given.is_dir() and given in path.parents):
            return True
    return False


def _pool_of_an_elo_eval(collector: pytest.Collector, task: object) -> bool:
    module = getattr(collector, "obj", None)
    return any(isinstance(v, EloEval) and v.pool is task for v in vars(module).values()) if module else False


class TaskCollector(pytest.Collector):
    """One task's items. Rendering every instance's prompt here makes a
    template typo one collection error naming the task, instance and field."""

    def __init__(self, *, task: EvalTask, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.task = task
        self.add_marker(_MARK)  # its items' mark (pytest reads a node's marks up the tree)

    @classmethod
    def from_parent(cls, parent: pytest.Collector, *, name: str, task: EvalTask) -> TaskCollector:  # type: ignore[override]
        return super().from_parent(parent, name=name, task=task)

    def collect(self) -> Iterator[pytest.Item]:
        try:
            self.task.request_digests()
        except EvalReplayError as exc:
            raise self.CollectError(str(exc)) from None
        for stage, iid, rollout in self.task.item_keys():
            yield RolloutItem.from_parent(
                self,
                name=f"{iid}[s{stage}-r{rollout}]",
                nodeid=_item_id(self, iid, stage, rollout),
                task=self.task,
                key=(stage, iid, rollout),
            )
        if self.task.gate is not None:
            yield GateItem.from_parent(self, name="gate", task=self.task)


class EloCollector(pytest.Collector):
    """An EloEval's items: one per (task, stage, rollout) of the tasks each
    stage draws from the pool (known at collection: the seed is)."""

    def __init__(self, *, eval_: EloEval, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.eval = eval_
        self.add_marker(_MARK)

    @classmethod
    def from_parent(cls, parent: pytest.Collector, *, name: str, eval_: EloEval) -> EloCollector:  # type: ignore[override]
        return super().from_parent(parent, name=name, eval_=eval_)

    def collect(self) -> Iterator[pytest.Item]:
        try:
            self.eval.pool.request_digests()
            _, stage_tasks = session_of(self.config).elo_draw(self.eval)
        except EvalReplayError as exc:
            raise self.CollectError(str(exc)) from None
        for stage, task_ids in enumerate(stage_tasks, 1):
            for tid in task_ids:
                for rollout in range(self.eval.num_samples):
                    yield RolloutItem.from_parent(
                        self,
                        name=f"{tid}[s{stage}-r{rollout}]",
                        nodeid=_item_id(self, tid, stage, rollout),
                        task=self.eval,
                        key=(stage, tid, rollout),
                    )
        if self.eval.gate is not None:
            yield GateItem.from_parent(self, name="gate", task=self.eval)


def _item_id(collector: pytest.Collector, iid: str, stage: int, rollout: int) -> Any:
    """The item's node id, with "s1-r0" as its params (as pytest >= 9.2 reads
    "[s1-r0]" from --lf's cache). Where pytest keeps node ids structured, built
    from its collector's, sharing the path, the instance id and the params
    rather than parsing a string into new ones for each of a run's items."""
    params = _PARAMS.get((stage, rollout))
    if params is None:
        params = _PARAMS.setdefault((stage, rollout), f"s{stage}-r{rollout}")
    structured = getattr(collector, "id", None)  # pytest >= 9.2: a NodeId
    if structured is not None and hasattr(structured, "with_params"):
        return structured.child(iid).with_params(params)
    return f"{collector.nodeid}::{iid}[{params}]"


_PARAMS: dict[tuple[int, int], str] = {}


class TaskItem(pytest.Item):
    """An item of an eval task: marked `evalreplay`, matched by the task's
    name, failing with a one-line message rather than a traceback."""

    def __init__(self, *, task: EvalTask | EloEval, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.task = task
        # -k already matches the task (a parent node's name) and the instance,
        # stage and rollout (substrings of the item's name); `-m evalreplay`
        # matches the mark its collector carries: nothing more per item.

    @classmethod
    def from_parent(cls, parent: pytest.Collector, **kwargs: Any) -> Self:  # type: ignore[override]
        return super().from_parent(parent, **kwargs)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        """The item's failure in one line, with every credential in it hidden
        (a server may echo the API key in the error an item fails with)."""
        exc, hide = excinfo.value, configured_secrets(os.environ)
        if isinstance(exc, (ItemFailed, EvalReplayError)):
            return redact(f"{self.task.name} {self.name}: {exc}", hide)
        if isinstance(exc, OSError):
            return redact(f"{self.task.name} {self.name}: {type(exc).__name__}: {exc}", hide)
        if isinstance(exc, Exception) and _raised_by_plugin(excinfo):
            entry = excinfo.traceback[-1]
            return redact(
                f"{self.task.name} {self.name}: internal error in pytest-evalreplay: "
                f"{type(exc).__name__}: {exc} ({entry.path}:{entry.lineno + 1}); please report it",
                hide,
            )
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        line = self.task.defined_line - 1 if self.task.defined_in == self.path else 0
        return self.path, line, f"{self.task.name}::{self.name}"


def _raised_by_plugin(excinfo: pytest.ExceptionInfo[BaseException]) -> bool:
    return "pytest_evalreplay" in str(excinfo.traceback[-1].path)


class RolloutItem(TaskItem):
    """One rollout of one instance. Running it reads its result from the
    session (the first item of a chunk to run generates the whole chunk)."""

    def __init__(self, *, key: tuple[int, str, int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.key = key

    def runtest(self) -> None:
        from pytest_evalreplay.run.context import ProviderExit

        session = session_of(self.config)
        try:
            result = session.result_for(self.task.name, self.key)
        except ProviderExit as exc:
            pytest.exit(str(exc), returncode=pytest.ExitCode.INTERRUPTED)
        record(self, result)
        if not result.ok:
            raise ItemFailed(result.error)
        if session.is_reused(self.task.name, self.key):
            self.user_properties.append(("evalreplay.reused", True))
            pytest.skip(REUSED_REASON)


class GateItem(TaskItem):
    """`<file>::<task>::gate`: judges the task's results against its Gate.
    Runs after the task's items (the plugin orders it so); if it runs first
    anyway (a selection, another plugin's order, an xdist worker), it makes
    the task's selected items complete before judging."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.user_properties.append(("evalreplay.gate", self.task.name))

    def runtest(self) -> None:
        from pytest_evalreplay.run.context import ProviderExit

        try:
            outcome = session_of(self.config).gate_outcome(self.task)
        except EvalReplayError as exc:
            raise ItemFailed(str(exc)) from None
        except ProviderExit as exc:
            pytest.exit(str(exc), returncode=pytest.ExitCode.INTERRUPTED)
        self.user_properties.extend(
            [
                ("gate.metric", outcome.gate.metric),
                ("gate.passed", outcome.passed),
                ("gate.summary", outcome.describe()),
            ]
        )
        if outcome.value is not None:
            self.user_properties.append(("gate.value", outcome.value))
        if not outcome.passed:
            raise ItemFailed(outcome.describe())


def record(item: pytest.Item, result: RolloutResult) -> None:
    """The item's identity, scores and finish reason in user_properties (and so
    in JUnit XML). Nothing that is None goes in: JUnit would show "None"."""
    props = item.user_properties
    props.extend(
        [
            _property("evalreplay.task", result.task),
            ("evalreplay.instance", result.instance_id),
            _property("evalreplay.stage", result.stage),
            _property("evalreplay.rollout", result.rollout),
        ]
    )
    prefix = "verdict" if isinstance(getattr(item, "task", None), EloEval) else "score"
    for name, value in result.scores.items():
        props.append(_property(f"{prefix}.{name}", value))
    gen = result.generation
    if gen is not None:
        if gen.finish_reason is not None:
            props.append(_property("finish_reason", gen.finish_reason))
        if gen.completion_tokens is not None:
            props.append(_property("completion_tokens", gen.completion_tokens))
        for name in ("turns", "tool_calls"):  # an agent's episode
            if name in gen.metadata:
                props.append(_property(f"agent.{name}", gen.metadata[name]))
    if result.failure_class is not None:
        props.append(_property("evalreplay.failure_class", result.failure_class))


_PROPERTIES: dict[tuple[str, type, Any], tuple[str, Any]] = {}
_PROPERTIES_KEPT = 4096  # distinct (name, value) pairs held: a continuous score repeats few


def _property(name: str, value: Any) -> tuple[str, Any]:
    """One `(name, value)` tuple for every item with that property: each of
    an item's reports keeps a copy of its list until the session ends. Keyed
    by type and, for floats, their exact bits (1 == 1.0 == True, 0.0 == -0.0)."""
    key = (name, type(value), value.hex() if type(value) is float else value)
    try:
        shared = _PROPERTIES.get(key)
    except TypeError:  # a provider's unhashable metadata
        return (name, value)
    if shared is None:
        shared = (sys.intern(name), value)
        if len(_PROPERTIES) < _PROPERTIES_KEPT:
            _PROPERTIES[key] = shared
    return shared
