"""A document's answers scored by lm-eval's own code: each filter pipeline of
the task (`filter_list`, or lm-eval's default `none` = take_first), then
`process_results`, exactly as `lm_eval.evaluator.evaluate` calls them for
one document. The scores are named as lm-eval reports them: `metric,filter`
(`exact_match,strict-match`), plain `metric` under the `none` filter (`acc`,
`acc_norm`)."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_evalreplay.model import EvalReplayError


@dataclass(frozen=True)
class Pipeline:
    """One of the task's filter ensembles: its name and its filters, built once."""

    name: str
    filters: tuple[Any, ...]

    def apply(self, responses: Sequence[Sequence[Any]], docs: Sequence[Mapping[str, Any]]) -> list[Any]:
        resps: Any = [list(r) for r in responses]
        for f in self.filters:
            resps = f.apply(resps, docs)
        return list(resps)


def pipelines(task: Any) -> tuple[Pipeline, ...]:
    """The task's filter ensembles, each filter built once (lm-eval builds
    them once per run too)."""
    ensembles = getattr(task, "_filters", None)
    if not ensembles:
        from lm_eval.filters import build_filter_ensemble

        ensembles = [build_filter_ensemble("none", [["take_first", None]])]
    return tuple(Pipeline(e.name, tuple(f() for f in e.filters)) for e in ensembles)


def metric_name(metric: str, filter_name: str) -> str:
    return metric if filter_name == "none" else f"{metric},{filter_name}"


def score_document(
    task: Any, pipes: Sequence[Pipeline], doc: Mapping[str, Any], responses: Sequence[Any]
) -> dict[str, float]:
    """`responses`: one per lm-eval request of the document (a generated text;
    or per choice an (loglikelihood, is_greedy) pair), one sample each."""
    scores: dict[str, float] = {}
    docs = [doc] * len(responses)
    for pipe in pipes:
        filtered = pipe.apply([[r] for r in responses], docs)
        for metric, value in task.process_results(doc, filtered).items():
            scores[metric_name(metric, pipe.name)] = _number(value, metric)
    if not scores:
        raise EvalReplayError("lm-eval's process_results returned no metrics for this document")
    return scores


def _number(value: Any, metric: str) -> float:
    if isinstance(value, numbers.Real):
        return float(value)
    raise EvalReplayError(
        f"lm-eval's process_results gave metric {metric!r} the value {value!r:.80}, not a number; "
        "EvalTask.from_lm_eval saves one number per document and metric"
    )


def higher_is_better(task: Any, names: Sequence[str]) -> dict[str, bool]:
    """Each score's direction, by its lm-eval metric (the part before the comma)."""
    table = task.higher_is_better() or {}
    return {n: bool(table[n.split(",")[0]]) for n in names if n.split(",")[0] in table}
