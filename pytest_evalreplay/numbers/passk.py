"""pass@k and maj@k: per-instance numbers over an instance's scored samples.

With `num_samples` = n > 1 each instance has n scored rollouts. Both metrics
are estimated per instance from all n (not from the first k), so every sample
counts, and then averaged over instances like any other score: the task's
interval is the same t interval on instance values as every metric's
(`stats.instance_interval`), clustered by instance by construction.

- pass@k: the chance that at least one of k samples drawn without
  replacement from the n is correct, 1 - C(n-c, k) / C(n, k) for c correct
  samples (the unbiased estimator of Chen et al. 2021, "Evaluating Large
  Language Models Trained on Code"), computed as a product, never with huge
  binomials.
- maj@k: the chance that the most common answer among k samples drawn without
  replacement is correct, a tie broken uniformly at random; the mean over
  every k-subset, computed exactly by counting (no sampling, no enumeration).

A sample is correct when its judged score is 1 (scores must be 0 or 1: a
bool, 0, 1, 0.0 or 1.0). The judged score is the scorer's sole score, or the
one a metric names after a colon ("pass@4:exact_match"). An answer is what the
scorer compares (`EvalTask.answer`); samples with equal answers vote
together, and an answer's correctness is the mean over its samples (the same
for every sample of an answer when the scorer is deterministic).

Pure functions over plain data; the plugin calls them from `metrics.py`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

_NAME = re.compile(r"(pass|maj)@([1-9][0-9]*)(?::(.+))?\Z", re.DOTALL)


@dataclass(frozen=True)
class SampleMetric:
    """One requested metric: its kind, its k, and the score that says whether
    a sample is correct (None: the scorer's sole score)."""

    kind: Literal["pass", "maj"]
    k: int
    score: str | None = None

    @property
    def name(self) -> str:
        """The metric's name in summaries, metrics.json, baselines and gates."""
        base = f"{self.kind}@{self.k}"
        return base if self.score is None else f"{base}:{self.score}"


def parse(name: str) -> SampleMetric | None:
    """The metric a name asks for, or None when it is no pass@k / maj@k name."""
    match = _NAME.match(name)
    if match is None:
        return None
    kind, k, score = match.groups()
    return SampleMetric("pass" if kind == "pass" else "maj", int(k), score)


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k), as 1 - prod_{i=n-c+1}^{n} (1 - k/i)."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def maj_at_k(answers: Sequence[Hashable], correct: Sequence[float], k: int) -> float:
    """The mean over every k-subset of the samples of the correctness of its
    most common answer (a tie: the mean over the tied answers).

    Exact, by counting: an answer with c_j samples wins a subset holding t of
    them when every other answer holds at most t; the ways the others fill the
    remaining k - t places are counted by a polynomial product that also
    tracks how many of them tie at t. Answers whose correctness is 0 add
    nothing and are skipped as winners, so the usual case (one right answer)
    costs one pass.
    """
    n = len(answers)
    if len(correct) != n:
        raise ValueError("maj@k needs one correctness per answer")
    if not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n, got n={n}, k={k}")
    groups: dict[Hashable, list[float]] = {}
    for answer, right in zip(answers, correct, strict=True):
        groups.setdefault(answer, []).append(float(right))
    counts = [len(v) for v in groups.values()]
    quality = [Fraction(math.fsum(v)) / len(v) for v in groups.values()]
    if k == n:  # one subset: the plain vote
        top = max(counts)
        winners = [q for c, q in zip(counts, quality, strict=True) if c == top]
        return float(sum(winners) / len(winners))
    total = Fraction(0)
    for j, (c_j, q_j) in enumerate(zip(counts, quality, strict=True)):
        if q_j == 0:
            continue
        others = counts[:j] + counts[j + 1 :]
        wins = Fraction(0)
        for t in range(1, min(c_j, k) + 1):
            if t + sum(min(c, t) for c in others) < k:
                continue  # the others cannot fill the subset without outvoting t
            ties = _fillings(others, t, k - t)
            wins += math.comb(c_j, t) * sum(Fraction(w, u + 1) for u, w in enumerate(ties))
        total += q_j * wins
    return float(total / math.comb(n, k))


def _fillings(counts: Sequence[int], cap: int, places: int) -> list[int]:
    """Ways to choose exactly `places` samples from groups of `counts`, at
    most `cap` from each, indexed by how many groups give exactly `cap`."""
    # table[s][u]: ways to choose s samples so far with u groups at the cap
    # (at most places // cap groups can reach it)
    width = min(len(counts), places // cap) + 1
    table = [[0] * width for _ in range(places + 1)]
    table[0][0] = 1
    for size in counts:
        choose = [math.comb(size, x) for x in range(min(size, cap) + 1)]
        new = [[0] * width for _ in range(places + 1)]
        for s, row in enumerate(table):
            for u, ways in enumerate(row):
                if not ways:
                    continue
                for x in range(min(len(choose) - 1, places - s) + 1):
                    new[s + x][u + (x == cap)] += ways * choose[x]
        table = new
    return table[places]


def correctness(metric: SampleMetric, scores: Mapping[str, float]) -> float:
    """Whether one sample is correct (1.0) or not (0.0) for `metric`. Raises
    ValueError, saying what to write instead, when the scores do not say."""
    if metric.score is None:
        if len(scores) != 1:
            first = sorted(scores)[0] if scores else "<score>"
            raise ValueError(
                f"{metric.name} judges a sample by its one score, and the scorer returned several "
                f"scores {sorted(scores)}; name the one that says correct, e.g. '{metric.name}:{first}'"
            )
        name, value = next(iter(scores.items()))
    else:
        name = metric.score
        if name not in scores:
            raise ValueError(
                f"{metric.name} judges a sample by score {name!r}, and the scorer returned no score "
                f"{name!r} (it returned {sorted(scores)})"
            )
        value = scores[name]
    if value not in (0.0, 1.0):
        raise ValueError(
            f"{metric.name} needs score {name!r} to be 0 or 1 (wrong or right), got {value!r}; "
            "return a bool from the scorer, or name a 0/1 score after a colon"
        )
    return float(value)


def instance_values(
    metrics: Sequence[SampleMetric], rollouts: Sequence[tuple[Mapping[str, float], Hashable]]
) -> dict[str, float]:
    """One instance's value of each metric from its scored samples (scores,
    answer). A metric with k above the number of scored samples has no value
    for the instance (it is left out, as a failed sample is never a 0); so
    has one whose samples' scores do not say correct or wrong."""
    out: dict[str, float] = {}
    n = len(rollouts)
    for metric in metrics:
        if metric.k > n:
            continue
        try:
            right = [correctness(metric, scores) for scores, _ in rollouts]
        except ValueError:
            continue
        if metric.kind == "pass":
            out[metric.name] = pass_at_k(n, int(sum(right)), metric.k)
        else:
            out[metric.name] = maj_at_k([answer for _, answer in rollouts], right, metric.k)
    return out


def by_instance(
    metrics: Sequence[SampleMetric], samples: Iterable[tuple[str, Mapping[str, float], Hashable]]
) -> dict[str, dict[str, float]]:
    """Each instance's values from its scored samples, given as (instance id,
    scores, answer); instances with no value are left out."""
    grouped: dict[str, list[tuple[Mapping[str, float], Hashable]]] = {}
    for iid, scores, answer in samples:
        grouped.setdefault(iid, []).append((scores, answer))
    out: dict[str, dict[str, float]] = {}
    for iid, rollouts in grouped.items():
        values = instance_values(metrics, rollouts)
        if values:
            out[iid] = values
    return out


def requested(names: Any, gate_metric: str | None, num_samples: int) -> tuple[SampleMetric, ...]:
    """The metrics a task asks for: its `metrics=` list, plus the gate's metric
    when that is a pass@k / maj@k name. Raises ValueError saying what to fix."""
    if names is None:
        names = []
    if isinstance(names, str) or not isinstance(names, (list, tuple)):
        raise ValueError(f"metrics must be a list of names such as ['pass@4', 'maj@4'], got {names!r:.60}")
    out: dict[str, SampleMetric] = {}
    for name in names:
        metric = parse(name) if isinstance(name, str) else None
        if metric is None:
            raise ValueError(
                f"unknown metric {name!r:.60} in metrics=: the sample metrics are 'pass@k' and 'maj@k' "
                "(k a positive integer; ':<score>' after it names the score that says correct)"
            )
        out.setdefault(metric.name, metric)
    gated = parse(gate_metric) if gate_metric is not None else None
    if gated is not None:
        out.setdefault(gated.name, gated)
    for metric in out.values():
        if metric.k > num_samples:
            where = "the gate's metric" if metric is gated and metric.name not in names else "metric"
            raise ValueError(
                f"{where} {metric.name!r} needs num_samples >= {metric.k} (the task has "
                f"num_samples={num_samples}); raise num_samples or lower k"
            )
    return tuple(out.values())
