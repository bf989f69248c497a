"""`EvalTask`: a named set of instances plus how to prompt and score them."""

from __future__ import annotations

import math
import numbers
import os
import string
import sys
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay import passk
from pytest_evalreplay.execution import run_requests
from pytest_evalreplay.formats.instances import load_instances
from pytest_evalreplay.model import (
    TASK_NAME,
    Context,
    EvalReplayError,
    EvalResult,
    Gate,
    Generation,
    Instance,
    Provider,
    Request,
    aggregate,
    request_digest,
)
from pytest_evalreplay.rubric import Graded
from pytest_evalreplay.scorers import BUILTIN_TYPES, BUILTINS, BuiltinScorer, strip_reasoning

Scorer = Callable[[str, Instance], "float | bool | Mapping[str, float]"]

MAX_TASK_NAME = 100  # "<name>-predictions.jsonl" and its temporary files must fit a file name


def validate_task_name(name: Any) -> str:
    """Task names become file names: keep them to a safe alphabet and length."""
    if not isinstance(name, str) or not TASK_NAME.fullmatch(name) or name in (".", ".."):
        raise EvalReplayError(
            f"invalid task name {name!r}: use only letters, digits, '_', '.' and '-' "
            "(the name becomes a file name in the run dir)"
        )
    if len(name) > MAX_TASK_NAME:
        raise EvalReplayError(
            f"task name {name[:40]!r}... is {len(name)} characters; use at most {MAX_TASK_NAME} "
            "(the name becomes a file name in the run dir)"
        )
    return name


def validate_sampling(sampling: Any, where: str) -> dict[str, Any]:
    """Sampling is a dict of JSON values (it is saved and compared as JSON),
    with finite numbers: a typo like `sampling="hot"` fails when the task is built."""
    if sampling is None:
        return {}
    if not isinstance(sampling, Mapping):
        raise EvalReplayError(
            f"{where}: sampling must be a dict such as {{'temperature': 0.7, 'max_tokens': 256}}, "
            f"got {type(sampling).__name__}"
        )
    out: dict[str, Any] = {}
    for key, value in sampling.items():
        if not isinstance(key, str):
            raise EvalReplayError(f"{where}: sampling keys must be strings, got {key!r}")
        try:
            orjson.dumps(value)
        except TypeError:
            raise EvalReplayError(
                f"{where}: sampling[{key!r}] = {value!r:.60} is not a JSON value (it is saved with the run)"
            ) from None
        if _has_non_finite(value):
            raise EvalReplayError(f"{where}: sampling[{key!r}] = {value!r:.60} is not a finite number")
        out[key] = value
    return out


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return any(_has_non_finite(v) for v in value)
    if isinstance(value, Mapping):
        return any(_has_non_finite(v) for v in value.values())
    return False


class _CheckedFormatter(string.Formatter):
    """str.format, except that a field resolving to a method or function (a
    typo like `{question.upper}`) is an error rather than its repr."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        if callable(value):
            raise ValueError(
                f"resolves to {type(value).__name__} {getattr(value, '__name__', '')!r}, not a value"
            )
        return super().format_field(value, format_spec)


_FORMATTER = _CheckedFormatter()


def render_template(template: str, instance: Mapping[str, Any], where: str) -> str:
    """Fill a `str.format` template from an instance, with errors that name the field."""
    try:
        return _FORMATTER.vformat(template, (), instance)
    except KeyError as exc:
        raise EvalReplayError(
            f"{where}: the prompt template needs field {exc} that the instance lacks "
            f"(it has: {', '.join(sorted(map(str, instance))) or 'nothing'})"
        ) from None
    except IndexError:
        raise EvalReplayError(
            f"{where}: the prompt template has a positional field ({{}} or {{0}}); name the instance field, "
            "e.g. {question}"
        ) from None
    except (ValueError, AttributeError, TypeError) as exc:
        raise EvalReplayError(f"{where}: the prompt template cannot be rendered: {exc}") from None


def _caller() -> tuple[Path | None, int]:
    """Where the task was built: relative instance paths are read from that
    module's directory, and reports point at that line."""
    frame = sys._getframe(2)
    file = frame.f_globals.get("__file__")
    return (Path(file).resolve() if file else None), frame.f_lineno


class EvalTask:
    """A named evaluation. Module-level instances in test modules are collected
    as one pytest item per (stage, instance, rollout)."""

    def __init__(
        self,
        name: str,
        instances: Iterable[Mapping[str, Any]] | str | os.PathLike[str],
        prompt: str | Callable[[Instance], Context] | None = None,
        scorer: Scorer | BuiltinScorer | str | None = None,
        target: str | Callable[[Instance], Any] | None = None,
        system_prompt: str | None = None,
        num_samples: int = 1,
        sampling: Mapping[str, Any] | None = None,
        strip_reasoning: bool = False,
        gate: Gate | None = None,
        agent: Callable[..., Any] | None = None,
        max_turns: int | None = None,
        max_tokens_per_episode: int | None = None,
        metrics: Sequence[str] | None = None,
    ) -> None:
        __tracebackhide__ = True  # a bad argument is reported at the user's EvalTask(...) line, in one line
        self.defined_in, self.defined_line = _caller()
        try:
            self._setup(
                name,
                instances,
                prompt,
                scorer,
                target,
                system_prompt,
                num_samples,
                sampling,
                strip_reasoning,
                gate,
                metrics,
            )
            limits = {"max_turns": max_turns, "max_tokens_per_episode": max_tokens_per_episode}
            self._setup_agent(agent, limits)
        except EvalReplayError as exc:
            raise EvalReplayError(str(exc)) from None

    def _setup(
        self,
        name: str,
        instances: Iterable[Mapping[str, Any]] | str | os.PathLike[str],
        prompt: str | Callable[[Instance], Context] | None,
        scorer: Scorer | BuiltinScorer | str | None,
        target: str | Callable[[Instance], Any] | None,
        system_prompt: str | None,
        num_samples: int,
        sampling: Mapping[str, Any] | None,
        strip_reasoning: bool,
        gate: Gate | None,
        metrics: Sequence[str] | None = None,
    ) -> None:
        self.name = validate_task_name(name)
        base = self.defined_in.parent if self.defined_in is not None else Path.cwd()
        self.instances = load_instances(instances, base)
        if not self.instances:  # a file with no rows is refused by load_instances, naming it
            what = (
                f"instances={instances!r:.20} is empty"
                if isinstance(instances, (list, tuple))
                else ("the instances iterable yielded none")
            )
            raise EvalReplayError(
                f"task {name!r}: no instances ({what}); give at least one instance, a dict with an 'id'"
            )
        if prompt is not None and not isinstance(prompt, str) and not callable(prompt):
            raise EvalReplayError(f"task {name!r}: prompt must be a format string or a callable")
        self.prompt = prompt
        if isinstance(scorer, str):
            if scorer not in BUILTINS:
                raise EvalReplayError(
                    f"task {name!r}: unknown scorer {scorer!r}; built-ins are {sorted(BUILTINS)}"
                )
            scorer = BUILTINS[scorer]
        if scorer is not None and not callable(scorer) and not isinstance(scorer, (*BUILTIN_TYPES, Graded)):
            raise EvalReplayError(f"task {name!r}: scorer must be callable or a built-in scorer")
        self.scorer = scorer
        self.target = target
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise EvalReplayError(
                f"task {name!r}: system_prompt must be a string or None, got "
                f"{type(system_prompt).__name__} {system_prompt!r:.60}; for several system messages, "
                "return chat messages from a prompt callable"
            )
        self.system_prompt = system_prompt
        if type(num_samples) is not int or num_samples < 1:
            raise EvalReplayError(
                f"task {name!r}: num_samples must be a positive integer, got {num_samples!r}"
            )
        self.num_samples = num_samples
        self.sampling = validate_sampling(sampling, f"task {name!r}")
        if not isinstance(strip_reasoning, bool):
            raise EvalReplayError(
                f"task {name!r}: strip_reasoning must be True or False, got {strip_reasoning!r:.40}"
            )
        self.strip_reasoning = strip_reasoning
        if gate is not None and not isinstance(gate, Gate):
            raise EvalReplayError(f"task {name!r}: gate must be a Gate(...), got {type(gate).__name__}")
        # Not part of config(): a threshold changes the verdict, not the results.
        self.gate = gate
        try:  # pass@k / maj@k over each instance's samples (docs/passk.md)
            self.sample_metrics = passk.requested(metrics, gate.metric if gate else None, num_samples)
        except ValueError as exc:
            raise EvalReplayError(f"task {name!r}: {exc}") from None
        self._by_id = {inst["id"]: inst for inst in self.instances}
        self._digests: dict[tuple[int, str], str] | None = None

    def _setup_agent(self, agent: Callable[..., Any] | None, limits: dict[str, int | None]) -> None:
        """An agent task runs `agent(instance, llm)` per rollout instead of one prompt."""
        name = self.name
        if (agent is None) == (self.prompt is None):
            raise EvalReplayError(
                f"task {name!r}: give exactly one of prompt=... (one request per rollout) and "
                "agent=... (a function solve(instance, llm) that runs an episode)"
                + (", not both" if agent is not None else "")
            )
        if agent is not None and not callable(agent):
            raise EvalReplayError(
                f"task {name!r}: agent must be a function solve(instance, llm) (or async def), "
                f"got {type(agent).__name__}"
            )
        if agent is not None and self.system_prompt is not None:
            raise EvalReplayError(
                f"task {name!r}: an agent sends its own messages; put the system prompt in the "
                "messages it passes to llm.chat instead of EvalTask(system_prompt=...)"
            )
        for field, limit in limits.items():
            if limit is not None and (type(limit) is not int or limit < 1):
                raise EvalReplayError(
                    f"task {name!r}: {field} must be a positive integer or None, got {limit!r}"
                )
            if limit is not None and agent is None:
                raise EvalReplayError(f"task {name!r}: {field} limits an agent's episode; give agent=... too")
        self.agent = agent
        self.max_turns, self.max_tokens_per_episode = limits["max_turns"], limits["max_tokens_per_episode"]

    def __repr__(self) -> str:
        return f"EvalTask({self.name!r}, {len(self.instances)} instances, num_samples={self.num_samples})"

    def instance(self, instance_id: str) -> Instance:
        return self._by_id[instance_id]

    # -- prompting ---------------------------------------------------------

    def render(self, instance: Instance) -> Context:
        """The instance's prompt. Raises EvalReplayError naming the task, the
        instance and the field for a template that does not fit the instance,
        and for a prompt callable that raises or returns something else than
        a string or a list of chat messages."""
        where = f"task {self.name!r}, instance {instance['id']!r}"
        if self.prompt is None:
            # An agent task: its episodes start from the instance itself.
            try:
                return orjson.dumps(instance, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS).decode()
            except TypeError as exc:
                raise EvalReplayError(
                    f"{where}: an agent task's instance is saved as its request, and it is not JSON "
                    f"({exc}); give the instance JSON values"
                ) from None
        if isinstance(self.prompt, str):
            return render_template(self.prompt, instance, where)
        try:
            context = self.prompt(instance)
        except Exception as exc:
            raise EvalReplayError(
                f"{where}: the prompt callable raised {type(exc).__name__}: {exc}"
            ) from None
        if isinstance(context, str):
            return context
        if isinstance(context, list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in context
        ):
            for n, message in enumerate(context):
                try:
                    orjson.dumps(message)
                except TypeError as exc:  # a set, an object: the request is saved and digested as JSON
                    raise EvalReplayError(
                        f"{where}: the prompt callable returned chat messages, and message {n} "
                        f"({message!r:.80}) is not JSON ({exc}); give each message JSON values, "
                        "a string 'content' or a list of content parts"
                    ) from None
            return context
        raise EvalReplayError(
            f"{where}: the prompt callable returned {type(context).__name__}; return a string or a "
            "list of chat messages ({'role': ..., 'content': ...})"
        )

    def item_keys(self) -> list[tuple[int, str, int]]:
        """Every item of the task: (stage, instance id, rollout), in collection order."""
        return [(1, inst["id"], r) for inst in self.instances for r in range(self.num_samples)]

    def request_digests(self) -> dict[tuple[int, str], str]:
        """Each instance's request, rendered now, as the digest reuse compares.
        Rendered once per session at collection, so a template typo is one
        collection error naming the task, the instance and the field."""
        if self._digests is None:
            self._digests = {(1, inst["id"]): request_digest(self.request(inst)) for inst in self.instances}
        return self._digests

    def request(self, instance: Instance, stage: int = 1, rollouts: tuple[int, ...] = ()) -> Request:
        return Request(
            task=self.name,
            instance_id=instance["id"],
            context=self.render(instance),
            system_prompt=self.system_prompt,
            num_samples=self.num_samples,
            sampling=self.sampling,
            stage=stage,
            rollouts=rollouts,
        )

    # -- scoring -----------------------------------------------------------

    @property
    def scorer_name(self) -> str:
        if isinstance(self.scorer, BUILTIN_TYPES):
            return self.scorer.name
        name = getattr(self.scorer, "__name__", "score")
        return "score" if name == "<lambda>" else name

    def target_of(self, instance: Instance) -> Any:
        if callable(self.target):
            return self.target(instance)
        field_name = self.target or "target"
        if field_name not in instance:
            raise EvalReplayError(
                f"task {self.name!r}: instance {instance['id']!r} has no target field {field_name!r}; "
                "set EvalTask(target=...) to the field that holds the answer"
            )
        return instance[field_name]

    def postprocess(self, generation: Generation) -> Generation:
        """Apply the reasoning strip to a provider's raw text."""
        if not self.strip_reasoning:
            return generation
        raw = generation.raw_text
        return Generation(
            text=strip_reasoning(raw),
            original_text=raw,
            finish_reason=generation.finish_reason,
            prompt_tokens=generation.prompt_tokens,
            completion_tokens=generation.completion_tokens,
            metadata=generation.metadata,
        )

    def score(
        self, text: str, instance: Instance, grades: Mapping[str, float] | None = None
    ) -> dict[str, float]:
        """Scores as a dict of floats; raises what the scorer raises. `grades`:
        a graded scorer's verdicts, which only a session reads (`grader.py`)."""
        if self.scorer is None:
            raise EvalReplayError(
                f"task {self.name!r} has no scorer: give EvalTask(scorer=...) "
                "(only an EloEval's pool needs none)"
            )
        if isinstance(self.scorer, Graded):
            if grades is None:
                raise EvalReplayError(self._graded_outside())
            value: Any = grades
        elif isinstance(self.scorer, BUILTIN_TYPES):
            value = self.scorer.score(text, self.target_of(instance))
        else:
            value = self.scorer(text, instance)
        scores = (
            self._score_dict(value)
            if isinstance(value, Mapping)
            else {self.scorer_name: _as_float(value, self.name, self.scorer_name)}
        )
        for metric in self.sample_metrics:  # a sample pass@k / maj@k cannot judge fails here, by name
            try:
                passk.correctness(metric, scores)
            except ValueError as exc:
                raise EvalReplayError(f"task {self.name!r}: {exc}") from None
            if metric.kind == "maj":
                self.answer(text, instance)
        return scores

    def _graded_outside(self) -> str:
        return (
            f"task {self.name!r}: scorers.graded(...) grades in a pytest session, where its verdicts "
            "are journaled and replayed; run the task with pytest"
        )

    def answer(self, text: str, instance: Instance) -> Hashable:
        """The answer maj@k counts votes for: what the scorer compares (a
        built-in's extracted, normalised span or number; a scorer object's
        `answer(text, instance)` method), else the stripped text."""
        if isinstance(self.scorer, BUILTIN_TYPES):
            return self.scorer.answer(text)
        method = getattr(self.scorer, "answer", None)
        if callable(method):
            value = method(text, instance)
            if not isinstance(value, Hashable):
                raise EvalReplayError(
                    f"task {self.name!r}: the scorer's answer() returned {type(value).__name__}, "
                    "which cannot be counted; return a string, a number or None"
                )
            return value
        return text.strip()

    def _score_dict(self, value: Mapping[Any, Any]) -> dict[str, float]:
        """A scorer's dict as named scores: never empty (a rollout with no
        score would pass unscored), and no two keys with one name."""
        scorer = f"task {self.name!r}: scorer {self.scorer_name!r}"
        if not value:
            raise EvalReplayError(
                f"{scorer} returned no scores (an empty dict); return a float, a bool, "
                "or a dict with at least one score"
            )
        out: dict[str, float] = {}
        first: dict[str, Any] = {}
        for k, v in value.items():
            key = str(k)
            if key in first:
                raise EvalReplayError(
                    f"{scorer} returned keys {first[key]!r} and {k!r}, both named {key!r} once saved; "
                    "give each score its own string name"
                )
            first[key] = k
            out[key] = _as_float(v, self.name, k)
        return out

    # -- running without pytest -------------------------------------------

    def evaluate(self, provider: Provider, max_attempts: int = 3) -> EvalResult:
        """Generate and score every instance with `provider`, outside pytest."""
        if self.agent is not None:
            raise EvalReplayError(
                f"task {self.name!r} is an agent task: EvalTask.evaluate runs prompt tasks; run an "
                "agent task under pytest (its episodes are journaled turn by turn there)"
            )
        if isinstance(self.scorer, Graded):
            raise EvalReplayError(self._graded_outside())
        requests = [self.request(inst) for inst in self.instances]
        results = run_requests(self, provider, requests, max_attempts=max_attempts)
        votes = any(m.kind == "maj" for m in self.sample_metrics)
        values = passk.by_instance(
            self.sample_metrics,
            (
                (
                    r.instance_id,
                    r.scores,
                    self.answer(r.generation.text, self.instance(r.instance_id)) if votes else None,
                )
                for r in results
                if r.ok and r.generation is not None
            ),
        )
        metrics, scores = aggregate(results, values)
        errors: dict[str, str] = {}
        for r in results:
            if not r.ok and r.instance_id not in errors:
                errors[r.instance_id] = r.error or "failed"
        return EvalResult(
            task=self.name, metrics=metrics, scores=scores, errors=errors, rollouts=tuple(results)
        )


def _as_float(value: Any, task: str, key: Any) -> float:
    """A scorer's value as a float: bools and any real number (numpy's too)."""
    if isinstance(value, numbers.Real):
        return float(value)
    raise EvalReplayError(
        f"task {task!r}: scorer returned {type(value).__name__} for {key!r}; "
        "return a float, a bool, or a dict of floats"
    )
