"""`EvalTask`: a named set of instances plus how to prompt and score them."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_evalreplay.choices import Choices, gold_index
from pytest_evalreplay.formats.instances import load_instances
from pytest_evalreplay.gate import Gate
from pytest_evalreplay.model import (
    Context,
    EvalReplayError,
    Generation,
    Instance,
    Provider,
    Request,
    request_digest,
)
from pytest_evalreplay.numbers import passk
from pytest_evalreplay.prompting import (
    render_prompt,
    validate_num_samples,
    validate_sampling,
    validate_task_name,
)
from pytest_evalreplay.rubric import Graded, outside_session
from pytest_evalreplay.scorers import (
    BUILTIN_TYPES,
    BUILTINS,
    BuiltinScorer,
    MultipleChoice,
    multiple_choice,
    named_scores,
    reasoning_stripped,
)

if TYPE_CHECKING:
    from pytest_evalreplay.run.offline import EvalResult


Scorer = Callable[[str, Instance], "float | bool | Mapping[str, float]"]

__all__ = ["EvalTask", "Scorer", "validate_sampling", "validate_task_name"]


def _caller() -> tuple[Path | None, int]:
    """Where the task was built: relative instance paths are read from that
    module's directory, and reports point at that line."""
    frame = sys._getframe(2)
    file = frame.f_globals.get("__file__")
    return (Path(file).resolve() if file else None), frame.f_lineno


RENDERED_BUDGET = 64 * 2**20  # characters of collected prompts a task keeps for generation


def _size(context: Context) -> int:
    """About how many characters a prompt holds (a chat's message contents)."""
    if isinstance(context, str):
        return len(context)
    return sum(len(m.get("content") or "") if isinstance(m.get("content"), str) else 256 for m in context)


class EvalTask:
    """A named evaluation. Module-level instances in test modules are collected
    as one pytest item per (stage, instance, rollout)."""

    def __init__(
        self,
        name: str,
        instances: Iterable[Mapping[str, Any]] | str | os.PathLike[str],
        prompt: str | Callable[[Instance], Context] | None = None,
        scorer: Scorer | BuiltinScorer | str | None = None,
        target: str | int | Callable[[Instance], Any] | None = None,
        system_prompt: str | None = None,
        num_samples: int = 1,
        sampling: Mapping[str, Any] | None = None,
        strip_reasoning: bool = False,
        gate: Gate | None = None,
        agent: Callable[..., Any] | None = None,
        max_turns: int | None = None,
        max_tokens_per_episode: int | None = None,
        metrics: Sequence[str] | None = None,
        choices: str | Callable[[Instance], Any] | None = None,
        choice_delimiter: str = " ",
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
            self._setup_choices(choices, choice_delimiter)
        except EvalReplayError as exc:
            raise EvalReplayError(str(exc)) from None

    def _setup(
        self,
        name: str,
        instances: Iterable[Mapping[str, Any]] | str | os.PathLike[str],
        prompt: str | Callable[[Instance], Context] | None,
        scorer: Scorer | BuiltinScorer | str | None,
        target: str | int | Callable[[Instance], Any] | None,
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
        builtin = (*BUILTIN_TYPES, Graded, MultipleChoice)
        if scorer is not None and not callable(scorer) and not isinstance(scorer, builtin):
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
        self.num_samples = validate_num_samples(num_samples, name)
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
        self._golds: dict[str, int] = {}  # a choices task's gold index per instance id
        self._rendered: dict[str, Context] = {}  # prompts rendered for the digests, until their request

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

    def _setup_choices(self, choices: Any, delimiter: Any) -> None:
        """A choices task asks for each choice's log-likelihood after the prompt
        (one loglikelihood request per instance) and is scored from them."""
        name = self.name
        self.choices: Choices | None = None
        if choices is None:
            if isinstance(self.scorer, MultipleChoice):
                raise EvalReplayError(
                    f"task {name!r}: scorers.multiple_choice(...) scores answer choices by log-likelihood; "
                    "give EvalTask(choices=...) (the instance field or a callable that lists them)"
                )
            return
        if self.agent is not None:
            raise EvalReplayError(
                f"task {name!r}: choices=... scores each answer choice by its log-likelihood after the "
                "prompt; an agent task has no one prompt: give prompt=... instead of agent=..."
            )
        if self.num_samples != 1:
            raise EvalReplayError(
                f"task {name!r}: a choices task has one rollout per instance (a log-likelihood does not "
                f"vary between samples); num_samples must be 1, got {self.num_samples}"
            )
        if self.scorer is None:
            self.scorer = multiple_choice()
        elif not isinstance(self.scorer, MultipleChoice):
            raise EvalReplayError(
                f"task {name!r}: a choices task is scored from its choices' log-likelihoods: leave "
                "scorer unset (acc and acc_norm) or give scorers.multiple_choice(metrics=(...)) with "
                "'acc', 'acc_norm' and/or 'bpb'"
            )
        self.choices = Choices.build(choices, delimiter, name)

    @classmethod
    def from_lm_eval(cls, task: str, **options: Any) -> EvalTask:
        """An lm-evaluation-harness task, prompted and scored by lm-eval's own code,
        loaded when collected (options: docs/lm_eval.md)."""
        __tracebackhide__ = True
        from pytest_evalreplay.lmeval.task import lm_eval_task

        return lm_eval_task(cls, task, _caller(), **options)

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
        return render_prompt(self.prompt, instance, f"task {self.name!r}, instance {instance['id']!r}")

    def item_keys(self) -> list[tuple[int, str, int]]:
        """Every item of the task: (stage, instance id, rollout), in collection order."""
        return [(1, inst["id"], r) for inst in self.instances for r in range(self.num_samples)]

    def request_digests(self) -> dict[tuple[int, str], str]:
        """Each instance's request, rendered now, as the digest reuse compares.
        Rendered once per session at collection, so a template typo is one
        collection error naming the task, the instance and the field; each
        prompt is kept for its instance's first `request` (generation renders
        nothing again) until `keep_rendered` drops those with nothing to run;
        past `RENDERED_BUDGET` characters in all, the rest are not kept."""
        if self._digests is None:
            digests: dict[tuple[int, str], str] = {}
            rendered: dict[str, Context] = {}
            held = 0  # characters of the prompts kept
            for inst in self.instances:
                request = self.request(inst)
                digests[(1, inst["id"])] = request_digest(request)
                held += _size(request.context)
                if held <= RENDERED_BUDGET:  # past it, generation renders the rest again
                    rendered[inst["id"]] = request.context
            if self.choices is not None:
                self._golds = {inst["id"]: self.gold(inst) for inst in self.instances}
            self._digests, self._rendered = digests, rendered
        return self._digests

    def keep_rendered(self, instance_ids: Collection[str]) -> None:
        """Keep the prompts rendered at collection only for these instances
        (those a session will generate): a reused instance's prompt is not
        held for the rest of the session."""
        self._rendered = {iid: c for iid, c in self._rendered.items() if iid in instance_ids}

    def request(self, instance: Instance, stage: int = 1, rollouts: tuple[int, ...] = ()) -> Request:
        context = self._rendered.pop(instance["id"], None)
        if context is None:
            context = self.render(instance)
        if self.choices is None:
            return Request(
                task=self.name,
                instance_id=instance["id"],
                context=context,
                system_prompt=self.system_prompt,
                num_samples=self.num_samples,
                sampling=self.sampling,
                stage=stage,
                rollouts=rollouts,
            )
        where = self._where(instance)
        if not isinstance(context, str):
            raise EvalReplayError(
                f"{where}: the prompt callable returned chat messages, and a choices task scores each "
                "choice as a continuation of the prompt's text: return a string"
            )
        return Request(
            task=self.name,
            instance_id=instance["id"],
            context=context,
            system_prompt=self.system_prompt,
            request_type="loglikelihood",
            sampling=self.sampling,
            stage=stage,
            rollouts=rollouts,
            continuations=self.choices.continuations(self.choices.of(instance, where)),
        )

    def _where(self, instance: Instance) -> str:
        return f"task {self.name!r}, instance {instance['id']!r}"

    def gold(self, instance: Instance) -> int:
        """A choices task's gold choice index (`target` is the index or the text),
        found once per instance at collection and kept for its scoring."""
        assert self.choices is not None
        known = self._golds.get(instance["id"])
        if known is not None and self._by_id.get(instance["id"]) is instance:
            return known
        where = self._where(instance)
        if callable(self.target):
            field = "the target callable's result"
        elif _is_index(self.target):
            field = "target"
        else:
            field = f"target field {self.target or 'target'!r}"
        try:
            target = self.target_of(instance)
        except EvalReplayError:
            raise
        except Exception as exc:
            raise EvalReplayError(
                f"{where}: the target callable raised {type(exc).__name__}: {exc}"
            ) from None
        return gold_index(target, self.choices.of(instance, where), where, field)

    # -- scoring -----------------------------------------------------------

    @property
    def scorer_name(self) -> str:
        if isinstance(self.scorer, (*BUILTIN_TYPES, MultipleChoice)):
            return self.scorer.name
        name = getattr(self.scorer, "__name__", "score")
        return "score" if name == "<lambda>" else name

    def target_of(self, instance: Instance) -> Any:
        if callable(self.target):
            return self.target(instance)
        if _is_index(self.target):  # a choices task's one gold index for every instance
            return self.target
        field_name = self.target or "target"
        if field_name not in instance:
            raise EvalReplayError(
                f"task {self.name!r}: instance {instance['id']!r} has no target field {field_name!r}; "
                "set EvalTask(target=...) to the field that holds the answer"
            )
        return instance[field_name]

    def postprocess(self, generation: Generation) -> Generation:
        """Apply the reasoning strip to a provider's raw text."""
        return reasoning_stripped(generation) if self.strip_reasoning else generation

    @property
    def rewrites_generations(self) -> bool:
        """Whether `postprocess` may change a generation (the reasoning strip, or
        a subclass's own): the run dir then saves what it returns, decoded,
        not the journal's bytes of the row."""
        return self.strip_reasoning or type(self).postprocess is not EvalTask.postprocess

    def score(
        self,
        text: str,
        instance: Instance,
        grades: Mapping[str, float] | None = None,
        loglikelihoods: Sequence[tuple[float, bool]] = (),
    ) -> dict[str, float]:
        """Scores as a dict of floats; raises what the scorer raises. `grades`:
        a graded scorer's verdicts, which only a session reads (`grader.py`);
        `loglikelihoods`: a choices task's answer, one pair per choice."""
        if self.scorer is None:
            raise EvalReplayError(
                f"task {self.name!r} has no scorer: give EvalTask(scorer=...) "
                "(only an EloEval's pool needs none)"
            )
        if isinstance(self.scorer, Graded):
            if grades is None:
                raise EvalReplayError(outside_session(self.name))
            value: Any = grades
        elif isinstance(self.scorer, MultipleChoice):
            value = self._choice_scores(instance, loglikelihoods)
        elif isinstance(self.scorer, BUILTIN_TYPES):
            value = self.scorer.score(text, self.target_of(instance))
        else:
            value = self.scorer(text, instance)
        scores = named_scores(value, self.name, self.scorer_name)
        for metric in self.sample_metrics:  # a sample pass@k / maj@k cannot judge fails here, by name
            try:
                passk.correctness(metric, scores)
            except ValueError as exc:
                raise EvalReplayError(f"task {self.name!r}: {exc}") from None
            if metric.kind == "maj":
                self.answer(text, instance)
        return scores

    def _choice_scores(
        self, instance: Instance, loglikelihoods: Sequence[tuple[float, bool]]
    ) -> dict[str, float]:
        assert self.choices is not None and isinstance(self.scorer, MultipleChoice)
        choices = self.choices.of(instance, self._where(instance))
        if len(loglikelihoods) != len(choices):
            raise EvalReplayError(
                f"{self._where(instance)}: the answer holds {len(loglikelihoods)} log-likelihoods for "
                f"{len(choices)} choices"
            )
        lls = [ll for ll, _ in loglikelihoods]
        return self.scorer.scores(lls, choices, self.gold(instance), self.choices.delimiter)

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

    def evaluate(self, provider: Provider, max_attempts: int = 3) -> EvalResult:
        """Generate and score every instance with `provider`, outside pytest."""
        # The runner is in run/, above the data model: imported inside the method,
        # the one upward edge that pyproject.toml's contracts name.
        from pytest_evalreplay.run.offline import evaluate

        return evaluate(self, provider, max_attempts)


def _is_index(target: Any) -> bool:
    return type(target) is int
