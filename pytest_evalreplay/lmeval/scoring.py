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
            scores.update(_numbers(value, metric_name(metric, pipe.name)))
    if not scores:
        raise EvalReplayError("lm-eval's process_results returned no metrics for this document")
    return scores


def _numbers(value: Any, name: str) -> dict[str, float]:
    """A per-document metric value as saved scores: a number under its name;
    a pair of numbers (a perplexity's loglikelihood and word or byte count)
    as `name:0` and `name:1`, joined again by `aggregate`."""
    if isinstance(value, numbers.Real):
        return {name: float(value)}
    if (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, numbers.Real) for v in value)
    ):
        return {f"{name}:{k}": float(v) for k, v in enumerate(value)}
    raise EvalReplayError(
        f"lm-eval's process_results gave metric {name!r} the value {value!r:.80}, not a number; "
        "EvalTask.from_lm_eval saves one number (or a perplexity's pair) per document and metric"
    )


def aggregate(
    task: Any, per_instance: Mapping[str, Mapping[str, float]]
) -> tuple[dict[str, float], dict[str, float]]:
    """The task's metrics by lm-eval's `aggregation()` over the documents'
    saved scores (in document order), and lm-eval's closed-form stderr where
    it has one (the mean's; lm-eval bootstraps or leaves out the others)."""
    from lm_eval.api.metrics import mean, mean_stderr

    aggregations = task.aggregation()
    columns: dict[str, list[Any]] = {}
    for scores in per_instance.values():
        pairs: dict[str, list[float]] = {}
        for key, value in scores.items():
            base, sep, part = key.rpartition(":")
            if sep and part in ("0", "1"):
                pairs.setdefault(base, [0.0, 0.0])[int(part)] = value
            else:
                columns.setdefault(key, []).append(value)
        for base, pair in pairs.items():
            columns.setdefault(base, []).append(tuple(pair))
    values: dict[str, float] = {}
    stderr: dict[str, float] = {}
    for name, items in columns.items():
        fn = aggregations.get(name.split(",")[0], mean)
        values[name] = float(fn(items))
        if fn is mean and len(items) > 1:
            stderr[name] = float(mean_stderr(items))
    return values, stderr


def higher_is_better(tasks: Sequence[Any], names: Sequence[str]) -> dict[str, bool]:
    """Each score's direction, by its lm-eval metric (the part before the
    comma, after a `subtask/` prefix), as the first task that has it says."""
    table: dict[str, Any] = {}
    for task in reversed(tasks):
        table.update(task.higher_is_better() or {})
    out = {}
    for name in names:
        metric = name.rpartition("/")[2].split(",")[0]
        if metric in table:
            out[name] = bool(table[metric])
    return out


def _lm_eval_key(name: str, suffix: str = "") -> str:
    """Our score name as lm-eval keys its results: `acc` -> `acc,none`."""
    metric, _, filt = name.partition(",")
    return f"{metric}{suffix},{filt or 'none'}"


def group_aggregates(
    groups: Mapping[str, Any], per_task: Mapping[str, tuple[Mapping[str, float], Mapping[str, float], int]]
) -> dict[str, tuple[dict[str, float], dict[str, float]]]:
    """Each group's metrics and stderrs by lm-eval's own `Group.aggregate`
    (its `aggregate_metric_list`: weighted by size or not, pooled stderr)
    over its tasks' (values, stderrs, documents), keyed as we name scores."""
    table: dict[str, dict[str, Any]] = {}
    for name, (values, stderrs, count) in per_task.items():
        row: dict[str, Any] = {"sample_len": count}
        row.update({_lm_eval_key(k): v for k, v in values.items()})
        row.update({_lm_eval_key(k, "_stderr"): v for k, v in stderrs.items()})
        table[name] = row
    out = {}
    for group_name, group in groups.items():
        values: dict[str, float] = {}
        stderrs: dict[str, float] = {}
        for key, value in group.aggregate(table).items():
            metric, sep, filt = key.partition(",")
            if not sep or not isinstance(value, numbers.Real):
                continue  # alias, sample_len, or a stderr lm-eval has not ("N/A")
            if metric.endswith("_stderr"):
                stderrs[metric_name(metric.removesuffix("_stderr"), filt)] = float(value)
            else:
                values[metric_name(metric, filt)] = float(value)
        out[group_name] = (values, stderrs)
    return out
