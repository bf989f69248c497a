"""`EvalTask.from_lm_eval`: an lm-eval task as an `EvalTask`.

The task is made from the `EvalTask` class handed in (`lm_eval_task(cls,
...)`), so this module never imports `task.py` (which imports this one
inside `from_lm_eval`): no import cycle. Building it reads nothing; lm-eval
is imported, the task found, its dataset loaded and its requests built when
the task is first collected (`request_digests`) or its instances are first
read, so a missing extra, an unknown task or an unreachable dataset is a
collection error naming the task.

One instance per lm-eval document, id the document's `doc_id` as a string
(`"0"`, `"1"`, ...), holding the document under `"doc"`; one rollout each. A
`generate_until` document is one generate request (lm-eval's context, its
`generation_kwargs` as sampling); a `multiple_choice` or `loglikelihood`
document is one loglikelihood request whose continuations are lm-eval's
(`target_delimiter + choice`); a `loglikelihood_rolling` document is one
rolling request of its text (cut into windows by the provider, as lm-eval
cuts it). Answers are scored by `scoring.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_evalreplay.lmeval import loading, scoring
from pytest_evalreplay.model import Context, EvalReplayError, Generation, Instance, Request, request_digest
from pytest_evalreplay.prompting import validate_task_name

_YAML_TASK = re.compile(r"^task:\s*['\"]?([A-Za-z0-9_.-]+)['\"]?\s*$", re.MULTILINE)


class _Loglikelihood:
    """`task.choices` of a loglikelihood task: not None, so the session asks
    the provider's loglikelihood stream (the choices themselves are lm-eval's)."""

    delimiter = ""


class LmEvalMixin:
    """What an lm-eval task changes of an `EvalTask`: its instances, requests
    and scores come from lm-eval, built on first use."""

    name: str

    def _init_lm_eval(
        self,
        spec: str,
        caller: tuple[Path | None, int],
        include_path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None,
        num_fewshot: int | None,
        limit: float | None,
        fewshot_seed: int | None,
        chat: loading.Chat,
        seed: int | None,
        name: str | None,
        gate: Any,
    ) -> None:
        self.defined_in, self.defined_line = caller
        base = self.defined_in.parent if self.defined_in is not None else Path.cwd()
        if not isinstance(spec, (str, os.PathLike)) or not str(spec):
            raise EvalReplayError(
                "EvalTask.from_lm_eval(task=...) must be an lm-eval task name or a YAML path, "
                f"got {spec!r:.60}"
            )
        spec = str(spec)
        path = Path(spec) if spec.endswith((".yaml", ".yml")) else None
        if path is not None and not path.is_absolute():
            path = base / path
        self._spec = str(path) if path is not None else spec
        self.name = validate_task_name(name if name is not None else _default_name(spec, path))
        paths = [] if include_path is None else include_path
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self._include = tuple(p if Path(p).is_absolute() else base / p for p in map(Path, paths))
        for field, value in (("num_fewshot", num_fewshot), ("fewshot_seed", fewshot_seed), ("seed", seed)):
            if value is not None and (type(value) is not int or (field == "num_fewshot" and value < 0)):
                raise EvalReplayError(f"lm-eval task {spec!r}: {field} must be a non-negative int or None")
        if limit is not None and (type(limit) not in (int, float) or limit <= 0):
            raise EvalReplayError(
                f"lm-eval task {spec!r}: limit must be a positive number "
                "(a count, or a fraction below 1) or None"
            )
        for field, value in (
            ("apply_chat_template", chat.apply_chat_template),
            ("fewshot_as_multiturn", chat.fewshot_as_multiturn),
        ):
            if not isinstance(value, bool) and not (field == "fewshot_as_multiturn" and value is None):
                raise EvalReplayError(f"lm-eval task {spec!r}: {field} must be True or False")
        if chat.system_instruction is not None and not isinstance(chat.system_instruction, str):
            raise EvalReplayError(f"lm-eval task {spec!r}: system_instruction must be a str or None")
        self._options = (num_fewshot, limit, fewshot_seed, chat)
        self._seed = seed
        self._loaded: loading.Loaded | None = None
        if gate is not None and not all(hasattr(gate, a) for a in ("metric", "min", "max_drop", "alpha")):
            got = type(gate).__name__
            raise EvalReplayError(f"lm-eval task {spec!r}: gate must be a Gate(...), got {got}")
        self.gate = gate
        self.prompt = self._context
        self.scorer = None
        self.target = None
        self.system_prompt = None
        self.num_samples = 1
        self.strip_reasoning = False
        self.sample_metrics = ()
        self.agent = None
        self.max_turns = self.max_tokens_per_episode = None
        self._digests: dict[tuple[int, str], str] | None = None
        self._rendered: dict[str, Context] = {}  # EvalTask's; lm-eval keeps each document's context itself

    # -- loading, on first use -------------------------------------------------

    @property
    def lm_eval(self) -> loading.Loaded:
        """The task as lm-eval built it (loaded now if not yet)."""
        if self._loaded is None:
            num_fewshot, limit, fewshot_seed, chat = self._options
            loaded = loading.load(self._spec, self._include, num_fewshot, limit, fewshot_seed, chat)
            self._docs = {d.instance_id(loaded.grouped): d for d in loaded.docs}
            self._pipes = {name: scoring.pipelines(task) for name, task in loaded.tasks.items()}
            self._instances = [{"id": iid, "doc": d.doc} for iid, d in self._docs.items()]
            self._by_id = {inst["id"]: inst for inst in self._instances}
            self._loaded = loaded
        return self._loaded

    @property
    def instances(self) -> list[Instance]:
        self.lm_eval  # noqa: B018 - loads
        return self._instances

    @property
    def choices(self) -> _Loglikelihood | None:
        return None if self.lm_eval.output_type == "generate_until" else _Loglikelihood()

    @property
    def sampling(self) -> dict[str, Any]:
        """The first document's sampling (every document's is lm-eval's, per request)."""
        first = self.lm_eval.docs[0]
        return self._sampling(first)

    def _sampling(self, doc: loading.DocRequests) -> dict[str, Any]:
        if self.lm_eval.output_type != "generate_until":
            return {}
        return loading.sampling(doc.gen_kwargs, self._seed, self._options[3].apply_chat_template)

    def instance(self, instance_id: str) -> Instance:
        self.lm_eval  # noqa: B018 - loads
        return self._by_id[instance_id]

    def saved_doc(self, instance_id: str) -> dict[str, Any]:
        """A document as its predictions rows save it (lm-eval's `--log_samples` `doc`)."""
        self.lm_eval  # noqa: B018 - loads
        where = f"task {self.name!r}, document {instance_id}"
        return loading.json_doc(self._docs[instance_id].doc, where)

    def __repr__(self) -> str:
        state = f"{len(self._docs)} documents" if self._loaded is not None else "not loaded yet"
        return f"EvalTask.from_lm_eval({self._spec!r}, name={self.name!r}, {state})"

    # -- requests --------------------------------------------------------------

    def _context(self, instance: Instance) -> Context:
        return self._docs[instance["id"]].context

    def render(self, instance: Instance) -> Context:
        self.lm_eval  # noqa: B018 - loads
        return self._context(instance)

    def request_digests(self) -> dict[tuple[int, str], str]:
        if self._digests is None:
            insts = self.instances
            self._digests = {(1, inst["id"]): request_digest(self.request(inst)) for inst in insts}
        return self._digests

    def request(self, instance: Instance, stage: int = 1, rollouts: tuple[int, ...] = ()) -> Request:
        self.lm_eval  # noqa: B018 - loads
        doc = self._docs[instance["id"]]
        common = {"task": self.name, "instance_id": instance["id"], "context": doc.context}
        if doc.rolling:
            return Request(**common, request_type="loglikelihood_rolling", stage=stage, rollouts=rollouts)
        if doc.continuations:
            return Request(
                **common,
                request_type="loglikelihood",
                stage=stage,
                rollouts=rollouts,
                continuations=doc.continuations,
            )
        return Request(**common, sampling=self._sampling(doc), stage=stage, rollouts=rollouts)

    # -- scoring ---------------------------------------------------------------

    @property
    def scorer_name(self) -> str:
        return "lm-eval"

    def score(
        self,
        text: str,
        instance: Instance,
        grades: Mapping[str, float] | None = None,
        loglikelihoods: Sequence[tuple[float, bool]] = (),
    ) -> dict[str, float]:
        """lm-eval's filters and process_results over this document's answer."""
        loaded = self.lm_eval
        doc = self._docs[instance["id"]]
        if loaded.output_type == "generate_until":
            responses: list[Any] = [text]
        elif doc.rolling:
            if len(loglikelihoods) != 1:
                raise EvalReplayError(
                    f"task {self.name!r}, document {instance['id']}: the answer holds {len(loglikelihoods)} "
                    "log-likelihoods for a loglikelihood_rolling text (one, the whole text's)"
                )
            responses = [float(loglikelihoods[0][0])]  # lm-eval's rolling answer: the log-likelihood alone
        else:
            if len(loglikelihoods) != len(doc.continuations):
                raise EvalReplayError(
                    f"task {self.name!r}, document {instance['id']}: the answer holds {len(loglikelihoods)} "
                    f"log-likelihoods for {len(doc.continuations)} continuations"
                )
            responses = [(float(ll), bool(greedy)) for ll, greedy in loglikelihoods]
        try:
            with loading.compiled_templates():  # process_results renders doc_to_target / doc_to_choice
                return scoring.score_document(
                    loaded.tasks[doc.task], self._pipes[doc.task], doc.doc, responses
                )
        except EvalReplayError as exc:
            raise EvalReplayError(f"task {self.name!r}, document {instance['id']}: {exc}") from None

    def answer(self, text: str, instance: Instance) -> Hashable:
        return text.strip()

    def postprocess(self, generation: Generation) -> Generation:
        return generation

    @property
    def rewrites_generations(self) -> bool:
        return type(self).postprocess is not LmEvalMixin.postprocess

    def aggregate_outcome(self, outcome: Any) -> Any:
        """The session's numbers (a `TaskOutcome`) with lm-eval's aggregation:
        each metric as `aggregation()` computes it over the documents (a
        perplexity from its saved (loglikelihood, count) pairs, which leave the
        metric table), the instance interval where the metric is the mean over
        the documents, and under `lm_eval` lm-eval's stderr and
        `higher_is_better`. A group's metrics are its aggregate as lm-eval's
        `Group.aggregate` computes it, plain (`acc`), beside each task's and
        subgroup's under `name/` (`tiny_mc_a/acc`)."""
        loaded = self.lm_eval
        per_task = {}
        for name, task in loaded.tasks.items():
            mine = {i: s for i, s in outcome.instance_scores.items() if self._docs[i].task == name}
            per_task[name] = (*scoring.aggregate(task, mine), len(mine))
        if not loaded.grouped:
            values, stderr, _ = next(iter(per_task.values()))
        else:
            values, stderr = {}, {}
            parts = {name: (v, e) for name, (v, e, _) in per_task.items()}
            parts.update(scoring.group_aggregates(loaded.groups, per_task))
            for part, (v, e) in parts.items():
                prefix = "" if part == loaded.group else f"{part}/"
                values.update({prefix + k: x for k, x in v.items()})
                stderr.update({prefix + k: x for k, x in e.items()})
        # The session's interval is over all documents pooled: it is the metric's only where the
        # metric is that pooled mean (a task's mean; a group's aggregate weighted by size).
        intervals = {
            k: v
            for k, v in outcome.intervals.items()
            if k in values and k in outcome.metrics and abs(outcome.metrics[k] - values[k]) <= 1e-12
        }
        extra = dict(outcome.extra)
        extra["lm_eval"] = {
            "task": loaded.name,
            "output_type": loaded.output_type,
            "n-shot": dict(loaded.num_fewshot),
            "stderr": stderr,
            "higher_is_better": scoring.higher_is_better(list(loaded.tasks.values()), list(values)),
        }
        if loaded.grouped:
            extra["lm_eval"]["group"] = loaded.group
            extra["lm_eval"]["tasks"] = list(loaded.tasks)
        return dataclasses.replace(
            outcome, metrics={k: values[k] for k in sorted(values)}, intervals=intervals, extra=extra
        )


def _default_name(spec: str, path: Path | None) -> str:
    """The task's name: lm-eval's name, or for a YAML path the file's `task:`
    (its stem when that cannot be read without lm-eval)."""
    if path is None:
        return spec
    try:
        found = _YAML_TASK.search(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        found = None
    return found.group(1) if found else path.stem


@functools.cache
def _task_class(base: type) -> type:
    return type("LmEvalTask", (LmEvalMixin, base), {"__module__": __name__})


def lm_eval_task(
    base: type,
    task: str,
    caller: tuple[Path | None, int],
    *,
    include_path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    num_fewshot: int | None = None,
    limit: float | None = None,
    fewshot_seed: int | None = 1234,
    apply_chat_template: bool = False,
    fewshot_as_multiturn: bool | None = None,
    system_instruction: str | None = None,
    seed: int | None = 1234,
    name: str | None = None,
    gate: Any = None,
) -> Any:
    """An lm-eval task as an instance of a subclass of `base` (EvalTask)."""
    obj = _task_class(base).__new__(_task_class(base))
    chat = loading.Chat(apply_chat_template, fewshot_as_multiturn, system_instruction)
    obj._init_lm_eval(task, caller, include_path, num_fewshot, limit, fewshot_seed, chat, seed, name, gate)
    return obj
