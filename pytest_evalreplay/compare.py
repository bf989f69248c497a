"""Compare two runs: metric differences with paired intervals, and the
instances whose score flipped.

There is one comparison path: `compare_runs` over two `RunSnapshot`s. A saved
run dir is read into a snapshot by `load_run_dir`; the plugin builds the
snapshot of the run in progress from what it holds in memory and calls
`compare_with_saved`. Rendering (`render_text`, `render_markdown`) works on
the resulting `RunComparison`, plain data that `to_dict()` turns into JSON.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.files import jsonl_lines, read_bytes
from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.stats import Interval, instance_interval, paired_difference

FORMAT = "evalreplay/1"
# A change smaller than this is rounding noise of a mean over rollouts, not a flip.
FLIP_TOLERANCE = 1e-9
# Prompts and answers are kept as one line of at most this many characters
# (the start and the end of an answer: a final answer usually ends a text).
KEEP_CHARS = 400
_TASK_NAME = re.compile(r"[A-Za-z0-9_.-]+")
# From the first non-space character to the end of its line (the breaks str.splitlines knows).
_FIRST_LINE = re.compile(r"[^\s][^\n\r\v\f\x1c-\x1e\x85\u2028\u2029]*")


@dataclass(frozen=True)
class TaskSnapshot:
    """One task of one run: what a comparison needs, nothing else.

    `metrics`: the task's aggregate metrics ({name: value}).
    `scores`: each instance's scores, each the mean over its rollouts
    ({instance_id: {metric: value}}); an instance that was not scored is absent.
    `prompts`: each instance's prompt, a string or a list of chat messages
    (only its first line is used, see `prompt_line`); may be partial or empty.
    `answers`: each instance's first generation's text (may be partial or empty;
    `load_run_dir` keeps a long one's start and end only).
    The order of `scores` is the instance order used to break ties in listings.
    """

    metrics: Mapping[str, float]
    scores: Mapping[str, Mapping[str, float]]
    prompts: Mapping[str, Any] = field(default_factory=dict)
    answers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunSnapshot:
    """A run to compare: a label for reports (a path, "this run"), the model
    name if known, and its tasks by name."""

    label: str
    tasks: Mapping[str, TaskSnapshot]
    model: str | None = None


@dataclass(frozen=True)
class MetricDiff:
    """One metric of one task in both runs.

    `base`, `new`: the runs' aggregate values (None: the run lacks the metric);
    `delta`: new - base of those; `base_interval`, `new_interval`: each run's
    metric with its 95% interval clustered by instance; `paired`: the mean of
    new - base over the instances both runs scored, with its paired 95% interval.
    """

    metric: str
    base: float | None
    new: float | None
    delta: float | None
    base_interval: Interval
    new_interval: Interval
    paired: Interval

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "base": self.base,
            "new": self.new,
            "delta": self.delta,
            "base_interval": self.base_interval.to_dict(),
            "new_interval": self.new_interval.to_dict(),
            "paired": self.paired.to_dict(),
        }


@dataclass(frozen=True)
class Flip:
    """An instance whose score on `metric` changed between the runs.

    `prompt` is the first line of its prompt and `base_answer` / `new_answer`
    each run's first generation, all one line, at most KEEP_CHARS long ("" when
    the run did not provide it).
    """

    instance_id: str
    metric: str
    base: float
    new: float
    prompt: str
    base_answer: str
    new_answer: str

    @property
    def change(self) -> float:
        return self.new - self.base

    @property
    def regressed(self) -> bool:
        return self.new < self.base

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "metric": self.metric,
            "base": self.base,
            "new": self.new,
            "change": _finite(self.change),
            "prompt": self.prompt,
            "base_answer": self.base_answer,
            "new_answer": self.new_answer,
        }


@dataclass(frozen=True)
class TaskComparison:
    """A task present in both runs. `flips` lists regressions first (largest
    drop first), then improvements (largest gain first); an instance that
    flipped on two metrics appears once per metric."""

    task: str
    metrics: tuple[MetricDiff, ...]
    flips: tuple[Flip, ...]
    num_base: int  # instances the base run scored
    num_new: int  # instances the new run scored
    num_both: int  # instances both runs scored

    @property
    def regressed(self) -> tuple[Flip, ...]:
        return tuple(f for f in self.flips if f.regressed)

    @property
    def improved(self) -> tuple[Flip, ...]:
        return tuple(f for f in self.flips if not f.regressed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "num_base": self.num_base,
            "num_new": self.num_new,
            "num_both": self.num_both,
            "metrics": [m.to_dict() for m in self.metrics],
            "flips": [f.to_dict() for f in self.flips],
        }


@dataclass(frozen=True)
class RunComparison:
    """Two runs compared: the tasks in both, and the names of those in one only."""

    base_label: str
    new_label: str
    base_model: str | None
    new_model: str | None
    tasks: tuple[TaskComparison, ...]
    only_base: tuple[str, ...]
    only_new: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": {"label": self.base_label, "model": self.base_model},
            "new": {"label": self.new_label, "model": self.new_model},
            "tasks": [t.to_dict() for t in self.tasks],
            "only_base": list(self.only_base),
            "only_new": list(self.only_new),
        }


# ---------------------------------------------------------------- comparing


def compare_runs(base: RunSnapshot, new: RunSnapshot) -> RunComparison:
    """Compare two snapshots (the one comparison path; see the module docstring)."""
    for run in (base, new):
        _check_snapshot(run)
    common = [t for t in base.tasks if t in new.tasks]
    return RunComparison(
        base_label=base.label,
        new_label=new.label,
        base_model=base.model,
        new_model=new.model,
        tasks=tuple(_compare_task(t, base.tasks[t], new.tasks[t]) for t in sorted(common)),
        only_base=tuple(sorted(t for t in base.tasks if t not in new.tasks)),
        only_new=tuple(sorted(t for t in new.tasks if t not in base.tasks)),
    )


def compare_run_dirs(base: Path, new: Path) -> RunComparison:
    """Compare two saved run dirs (new - base)."""
    return compare_runs(load_run_dir(Path(base)), load_run_dir(Path(new)))


def compare_with_saved(saved: Path, current: RunSnapshot) -> RunComparison:
    """Compare the run in progress (new) with a saved run dir (base)."""
    return compare_runs(load_run_dir(Path(saved)), current)


def _compare_task(task: str, base: TaskSnapshot, new: TaskSnapshot) -> TaskComparison:
    names = sorted(set(base.metrics) | set(new.metrics))
    order = {iid: i for i, iid in enumerate(base.scores)}
    diffs: list[MetricDiff] = []
    flips: list[Flip] = []
    for name in names:
        b = _metric_scores(base.scores, name)
        n = _metric_scores(new.scores, name)
        b_value, n_value = base.metrics.get(name), new.metrics.get(name)
        diffs.append(
            MetricDiff(
                metric=name,
                base=None if b_value is None else float(b_value),
                new=None if n_value is None else float(n_value),
                delta=None if b_value is None or n_value is None else _finite(n_value - b_value),
                base_interval=instance_interval(b.values()),
                new_interval=instance_interval(n.values()),
                paired=paired_difference(n, b),
            )
        )
        for iid in b:
            if iid in n and abs(n[iid] - b[iid]) > FLIP_TOLERANCE:
                flips.append(
                    Flip(
                        instance_id=iid,
                        metric=name,
                        base=b[iid],
                        new=n[iid],
                        prompt=_prompt_of(iid, base, new),
                        base_answer=_clip(base.answers.get(iid, "")),
                        new_answer=_clip(new.answers.get(iid, "")),
                    )
                )
    flips.sort(key=lambda f: (not f.regressed, -abs(f.change), order.get(f.instance_id, 0), f.metric))
    both = sum(1 for iid, s in base.scores.items() if s and new.scores.get(iid))
    return TaskComparison(
        task=task,
        metrics=tuple(diffs),
        flips=tuple(flips),
        num_base=sum(1 for s in base.scores.values() if s),
        num_new=sum(1 for s in new.scores.values() if s),
        num_both=both,
    )


def _metric_scores(scores: Mapping[str, Mapping[str, float]], metric: str) -> dict[str, float]:
    return {iid: float(s[metric]) for iid, s in scores.items() if metric in s}


def _prompt_of(iid: str, base: TaskSnapshot, new: TaskSnapshot) -> str:
    line = prompt_line(new.prompts[iid]) if iid in new.prompts else ""
    if not line and iid in base.prompts:
        line = prompt_line(base.prompts[iid])
    return _clip(line)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _check_snapshot(run: RunSnapshot) -> None:
    """A snapshot built in memory (by the plugin) must hold finite numbers:
    a NaN score would turn every statistic into NaN without a word."""
    for task, snap in run.tasks.items():
        for name, value in snap.metrics.items():
            if not _is_number(value):
                raise EvalReplayError(
                    f"{run.label}: task {task!r}: metric {name!r} is {value!r}; "
                    "a metric must be a finite number"
                )
        for iid, scores in snap.scores.items():
            for name, value in scores.items():
                if not _is_number(value):
                    raise EvalReplayError(
                        f"{run.label}: task {task!r}, instance {iid!r}: score {name!r} is {value!r}; "
                        "a score must be a finite number (check the scorer)"
                    )


# ---------------------------------------------------------------- one-line text


def prompt_line(context: Any) -> str:
    """The first non-blank line of a prompt, whitespace collapsed. For chat
    messages, of the last user message: the question, after any few-shot turns."""
    if isinstance(context, list):
        users = [m for m in context if isinstance(m, dict) and m.get("role") == "user"]
        pick = users[-1] if users else (context[-1] if context else None)
        text = _content_text(pick.get("content") if isinstance(pick, dict) else None)
    elif isinstance(context, str):
        text = context
    else:
        text = ""
    line = _FIRST_LINE.search(text)
    return "" if line is None else " ".join(line.group().split())


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI-style content parts
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def one_line(text: str) -> str:
    """All of `text` on one line: every run of whitespace, newlines included, becomes one space."""
    return " ".join(text.split())


def shorten(text: str, width: int, keep_end: bool = False) -> str:
    """`text` in at most `width` characters, marking a cut with "...". With
    `keep_end`, the middle is cut (an answer's end holds its final answer)."""
    if len(text) <= width:
        return text
    if width <= 3:
        return text[:width]
    if not keep_end:
        return text[: width - 3].rstrip() + "..."
    head = (width - 5) * 2 // 5
    tail = width - 5 - head
    return text[:head].rstrip() + " ... " + text[len(text) - tail :].lstrip()


def _clip(text: str) -> str:
    return shorten(one_line(text), KEEP_CHARS, keep_end=True)


def _trim(text: str) -> str:
    """A long answer cut to its start and end before it is kept for every
    instance (cheap slicing; `_clip` makes it one line for the few that flip)."""
    if len(text) <= 4 * KEEP_CHARS:
        return text
    return text[: 2 * KEEP_CHARS] + " ... " + text[-2 * KEEP_CHARS :]


# ---------------------------------------------------------------- reading run dirs


def load_run_dir(path: Path) -> RunSnapshot:
    """Read a pytest-evalreplay run dir into a snapshot. Every unreadable or
    malformed file is an EvalReplayError naming it (and the line)."""
    path = Path(path)
    if not path.exists():
        raise EvalReplayError(
            f"{path}: no such run dir (pass a directory a run wrote with --evalreplay-output)"
        )
    if not path.is_dir():
        raise EvalReplayError(f"{path}: not a directory (pass a run dir, the folder holding manifest.json)")
    manifest = path / "manifest.json"
    if not manifest.is_file():
        raise EvalReplayError(_foreign(path))
    doc = _load_json(manifest)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else None
        raise EvalReplayError(
            f"{manifest}: not a pytest-evalreplay manifest (format {found!r}, expected {FORMAT!r})"
        )
    tasks = doc.get("tasks")
    if not isinstance(tasks, list) or not all(isinstance(t, str) and _TASK_NAME.fullmatch(t) for t in tasks):
        raise EvalReplayError(f"{manifest}: 'tasks' must be a list of task names ([A-Za-z0-9_.-]+)")
    model = doc.get("model")
    return RunSnapshot(
        label=str(path),
        tasks={t: _load_task(path, t) for t in sorted(set(tasks))},
        model=model if isinstance(model, str) else None,
    )


def _foreign(path: Path) -> str:
    hint = (
        "compare reads run dirs written by pytest-evalreplay; to compare another harness's saves, "
        "rescore them into one first: pytest --evalreplay-predictions=SAVES --evalreplay-output=RUN_DIR"
    )
    if (path / "predictions").is_dir():
        what = "looks like an olmo-eval results dir"
    elif any(path.glob("samples_*.jsonl")):
        what = "looks like lm-evaluation-harness samples"
    elif any(path.glob("*-predictions.jsonl")):
        what = "has predictions files but no manifest.json (a run that never finished writing?)"
    else:
        what = "has no manifest.json, so it is not a pytest-evalreplay run dir"
    return f"{path}: {what}; {hint}"


def _load_json(path: Path) -> Any:
    try:
        return orjson.loads(read_bytes(path))
    except orjson.JSONDecodeError as exc:
        raise EvalReplayError(f"{path}: not valid JSON ({exc}); fix the file or run the task again") from None


def _bad(where: str, what: str) -> EvalReplayError:
    return EvalReplayError(f"{where}: {what}")


def _scores(value: Any, where: str, name: str) -> dict[str, float]:
    """A {metric: number} object from a saved file (bools count as 0/1)."""
    if not isinstance(value, dict):
        raise _bad(where, f"{name!r} must be an object of metric -> number")
    for v in value.values():
        if type(v) is not float:
            break
    else:
        return value  # the common case: what the plugin writes, all floats
    out: dict[str, float] = {}
    for metric, score in value.items():
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise _bad(where, f"{name!r}: {metric!r} must be a number, got {score!r}")
        out[metric] = float(score)
    return out


@dataclass(frozen=True, slots=True)
class _Saved:
    """What one predictions row contributes: small, the row itself is not kept.
    `rollouts` and `sample_scores` are read (and checked) only when an
    instance has several rows to pool."""

    stage: int
    scores: dict[str, float]
    num_generations: int
    rollouts: Any
    sample_scores: Any
    lineno: int


def _load_task(directory: Path, task: str) -> TaskSnapshot:
    metrics_path = directory / f"{task}-metrics.json"
    predictions_path = directory / f"{task}-predictions.jsonl"
    requests_path = directory / f"{task}-requests.jsonl"
    if not metrics_path.is_file():
        raise EvalReplayError(
            f"{metrics_path}: missing; manifest.json lists task {task!r}, but its run never finished "
            "(finish it with pytest --resume, or compare a complete run dir)"
        )
    doc = _load_json(metrics_path)
    if not isinstance(doc, dict):
        raise _bad(str(metrics_path), "must be a JSON object with 'metrics'")
    metrics = _scores(doc.get("metrics"), str(metrics_path), "metrics")

    # Most instances have one row; only the others keep a list (fewer objects, faster).
    first: dict[str, _Saved] = {}
    more: dict[str, list[_Saved]] = {}
    answers: dict[str, str] = {}  # from the instance's row of the earliest stage
    answer_stage: dict[str, int] = {}
    for lineno, _, row in jsonl_lines(predictions_path, read_bytes(predictions_path)):
        iid, text, saved = _prediction_row(row, predictions_path, lineno)
        earlier = first.setdefault(iid, saved)
        if earlier is saved:
            answers[iid] = _trim(text)
            continue
        more.setdefault(iid, [earlier]).append(saved)
        if saved.stage < answer_stage.get(iid, earlier.stage):
            answers[iid] = _trim(text)
            answer_stage[iid] = saved.stage
    instance_scores = {
        iid: _pooled_scores(iid, more[iid], predictions_path) if iid in more else saved.scores
        for iid, saved in first.items()
    }

    prompts: dict[str, str] = {}
    if requests_path.exists():
        first_stage: dict[str, int] = {}
        for lineno, _, row in jsonl_lines(requests_path, read_bytes(requests_path)):
            if not isinstance(row, dict) or not isinstance(row.get("instance_id"), (str, int)):
                raise _bad(
                    f"{requests_path}:{lineno}", "a requests row is an object with a string 'instance_id'"
                )
            iid = str(row["instance_id"])
            stage = row.get("stage", 1)
            if type(stage) is not int:
                raise _bad(f"{requests_path}:{lineno}", f"'stage' must be an integer, got {stage!r}")
            if "context" not in row:
                raise _bad(f"{requests_path}:{lineno}", "a requests row needs its 'context'")
            if iid not in first_stage or stage < first_stage[iid]:
                first_stage[iid] = stage
                prompts[iid] = prompt_line(row["context"])
    return TaskSnapshot(
        metrics=metrics,
        scores=instance_scores,
        prompts=prompts,
        answers=answers,
    )


def _prediction_row(row: Any, path: Path, lineno: int) -> tuple[str, str, _Saved]:
    """A predictions row's instance, first generation's text, and what it contributes."""
    if not isinstance(row, dict):
        raise _bad(f"{path}:{lineno}", "a predictions row must be a JSON object")
    iid = row.get("instance_id")
    if not isinstance(iid, (str, int)) or isinstance(iid, bool):
        raise _bad(f"{path}:{lineno}", "a predictions row needs a string 'instance_id'")
    gens = row.get("generations")
    if not isinstance(gens, list):
        raise _bad(f"{path}:{lineno}", "'generations' must be a list")
    if gens and not (isinstance(gens[0], dict) and isinstance(gens[0].get("text"), str)):
        raise _bad(f"{path}:{lineno}", "a generation must be an object with a string 'text'")
    stage = row.get("stage", 1)
    if type(stage) is not int:
        raise _bad(f"{path}:{lineno}", f"'stage' must be an integer, got {stage!r}")
    scores = _scores(row.get("scores", {}), f"{path}:{lineno}", "scores")
    saved = _Saved(stage, scores, len(gens), row.get("rollouts"), row.get("sample_scores"), lineno)
    return str(iid), gens[0]["text"] if gens else "", saved


def _samples(iid: str, saved: _Saved, where: str) -> list[tuple[int, dict[str, float]]]:
    """A row's samples as (rollout, scores); a null entry of `sample_scores`
    (a generation whose scoring failed) has no scores, never a 0."""
    n = saved.num_generations
    rollouts = list(range(n)) if saved.rollouts is None else saved.rollouts
    if not isinstance(rollouts, list) or len(rollouts) != n or any(type(r) is not int for r in rollouts):
        raise _bad(where, "'rollouts' must list one sample index per generation")
    raw = saved.sample_scores
    if raw is None:
        raise _bad(
            where,
            f"instance {iid!r} has several predictions rows and this one has no 'sample_scores', "
            "so its samples cannot be pooled; rewrite the run dir with pytest --resume",
        )
    if not isinstance(raw, list) or len(raw) != n:
        raise _bad(where, "'sample_scores' must hold one object (or null) per generation")
    return [
        (r, {} if s is None else _scores(s, where, "sample_scores"))
        for r, s in zip(rollouts, raw, strict=True)
    ]


def _pooled_scores(iid: str, rows: list[_Saved], path: Path) -> dict[str, float]:
    """The scores of an instance with several rows (several stages, or a
    crashed run's batches): the mean over all its samples, a sample saved
    twice counting once (the later save wins), like the plugin's own aggregation.
    An instance with one row has that row's `scores`."""
    pooled: dict[tuple[int, int], dict[str, float]] = {}
    for saved in rows:
        for rollout, sample in _samples(iid, saved, f"{path}:{saved.lineno}"):
            pooled[(saved.stage, rollout)] = sample
    values: dict[str, list[float]] = {}
    for sample in pooled.values():
        for metric, value in sample.items():
            values.setdefault(metric, []).append(value)
    return {metric: math.fsum(v) / len(v) for metric, v in sorted(values.items())}


# ---------------------------------------------------------------- rendering


def _value(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _signed(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.4f}"


def _score(x: float) -> str:
    return f"{x:.4g}"


def _ci(interval: Interval) -> str:
    if interval.lo is None or interval.hi is None:
        return "no interval"
    return f"[{_signed(interval.lo)}, {_signed(interval.hi)}]"


def _pm(interval: Interval) -> str:
    half = interval.half_width
    return "" if half is None else f" +-{half:.4f}"


def _paired_text(p: Interval) -> str:
    if p.n == 0:
        return "no instance scored by both runs"
    if p.mean is None:
        return f"paired over {p.n}: not representable"
    verdict = ""
    if p.excludes_zero:
        verdict = ", significant drop" if p.mean < 0 else ", significant gain"
    return f"paired {_signed(p.mean)} {_ci(p)} over {p.n} instances{verdict}"


def _run_name(label: str, model: str | None) -> str:
    return f"{label} ({model})" if model else label


def _counts(t: TaskComparison) -> str:
    text = f"{t.num_both} instances scored in both runs"
    if t.num_base != t.num_both or t.num_new != t.num_both:
        text += f" (base {t.num_base}, new {t.num_new})"
    return text


def render_text(cmp: RunComparison, top: int = 20) -> list[str]:
    """Terminal lines: per task, each metric's change and interval, then its
    first `top` flips (two lines each: the prompt, then both answers)."""
    if top < 0:
        raise ValueError(f"top must be >= 0, got {top}")
    lines = [
        f"evalreplay compare: base {_run_name(cmp.base_label, cmp.base_model)}",
        f"                     new {_run_name(cmp.new_label, cmp.new_model)}",
    ]
    for t in cmp.tasks:
        lines.append(f"{t.task}: {_counts(t)}")
        for m in t.metrics:
            if m.base is None or m.new is None:
                side, value = ("new", m.new) if m.base is None else ("base", m.base)
                lines.append(f"  {m.metric}: only in the {side} run ({_value(value)})")
                continue
            lines.append(
                f"  {m.metric}: {_value(m.base)}{_pm(m.base_interval)}"
                f" -> {_value(m.new)}{_pm(m.new_interval)}"
                f"  diff {_signed(m.delta)}; {_paired_text(m.paired)}"
            )
        regressed, improved = len(t.regressed), len(t.improved)
        lines.append(f"  flips: {regressed} regressed, {improved} improved")
        for f in t.flips[:top]:
            sign = "-" if f.regressed else "+"
            lines.append(
                f"    {sign} {f.instance_id} [{f.metric} {_score(f.base)} -> {_score(f.new)}]"
                f" {shorten(f.prompt, 70)}"
            )
            lines.append(
                f'        base: "{shorten(f.base_answer, 50, keep_end=True)}"'
                f'  new: "{shorten(f.new_answer, 50, keep_end=True)}"'
            )
        if len(t.flips) > top:
            lines.append(f"    ... {len(t.flips) - top} more flips not shown")
    if cmp.only_base:
        lines.append(f"only in base: {', '.join(cmp.only_base)}")
    if cmp.only_new:
        lines.append(f"only in new: {', '.join(cmp.only_new)}")
    if not cmp.tasks and not cmp.only_base and not cmp.only_new:
        lines.append("no tasks in either run")
    return lines


def md_escape(text: str) -> str:
    """Text safe inside a Markdown table cell: one line, `|` escaped, and
    `<` escaped so that answer text is never read as HTML."""
    text = one_line(text).replace("\\", "\\\\").replace("|", "\\|")
    return text.replace("<", "&lt;").replace(">", "&gt;")


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _md_interval(value: float | None, interval: Interval) -> str:
    if value is None:
        return "n/a"
    if interval.lo is None or interval.hi is None:
        return _value(value)
    return f"{_value(value)} [{interval.lo:.4f}, {interval.hi:.4f}]"


def render_markdown(cmp: RunComparison) -> str:
    """The whole comparison as Markdown: a metrics table and every flip, per task."""
    out = [
        "# evalreplay comparison",
        "",
        f"- base: {md_escape(_run_name(cmp.base_label, cmp.base_model))}",
        f"- new: {md_escape(_run_name(cmp.new_label, cmp.new_model))}",
        "",
        "Intervals are 95%, with the instance as the unit; the paired difference is over the "
        "instances both runs scored.",
    ]
    for t in cmp.tasks:
        out += ["", f"## {md_escape(t.task)}", "", f"{_counts(t)}.", ""]
        out.append(
            _row(["metric", "base [95% CI]", "new [95% CI]", "new - base", "paired diff [95% CI]", "n"])
        )
        out.append(_row(["---"] * 6))
        for m in t.metrics:
            p = m.paired
            paired = "n/a" if p.mean is None else f"{_signed(p.mean)} {_ci(p)}"
            if p.excludes_zero:
                paired = f"**{paired}**"
            out.append(
                _row(
                    [
                        md_escape(m.metric),
                        _md_interval(m.base, m.base_interval),
                        _md_interval(m.new, m.new_interval),
                        _signed(m.delta),
                        paired,
                        str(p.n),
                    ]
                )
            )
        out += ["", f"Flips: {len(t.regressed)} regressed, {len(t.improved)} improved."]
        if t.flips:
            out += [
                "",
                _row(["", "instance", "metric", "base", "new", "prompt", "base answer", "new answer"]),
            ]
            out.append(_row(["---"] * 8))
            for f in t.flips:
                out.append(
                    _row(
                        [
                            "regressed" if f.regressed else "improved",
                            md_escape(f.instance_id),
                            md_escape(f.metric),
                            _score(f.base),
                            _score(f.new),
                            md_escape(shorten(f.prompt, 120)),
                            md_escape(shorten(f.base_answer, 200, keep_end=True)),
                            md_escape(shorten(f.new_answer, 200, keep_end=True)),
                        ]
                    )
                )
    if cmp.only_base or cmp.only_new:
        out += ["", "## Tasks in one run only", ""]
        if cmp.only_base:
            out.append(f"- only in base: {', '.join(md_escape(t) for t in cmp.only_base)}")
        if cmp.only_new:
            out.append(f"- only in new: {', '.join(md_escape(t) for t in cmp.only_new)}")
    return "\n".join(out) + "\n"
