"""What a comparison reads: a run as plain data (`RunSnapshot`), and the
reader of saved run dirs into one (`load_run_dir`).

The plugin builds the snapshot of a run in progress from memory; a saved run
dir is read here, every unreadable or malformed file an EvalReplayError that
names it (and the line). An EloEval's task also carries its judgments' table
(metrics.json's `elo` block), which pairs its tasks between two runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.numbers.metrics import instance_means
from pytest_evalreplay.storage.files import read_bytes
from pytest_evalreplay.storage.lines import jsonl_lines
from pytest_evalreplay.storage.runschema import (
    MANIFEST,
    PREDICTIONS_SUFFIX,
    doc_of,
    prediction_fields,
    read_manifest,
    request_fields,
    rollouts_of,
    sample_scores_of,
    scores_of,
    task_files,
)
from pytest_evalreplay.values.snippets import prompt_line, trim


@dataclass(frozen=True)
class EloSnapshot:
    """An EloEval's judgments as metrics.json's `elo` block holds them.

    `table`: {"references": {name: rating}, "tasks": {task id: {reference:
    [wins, ties, losses]}}} (`elo.table_to_json`); `seed`: the eval's seed (the
    paired bootstrap draws with it, as the gate does); `ci95`: the rating's
    interval (an end may be None: a one-sided limit).
    """

    table: Mapping[str, Any]
    seed: int | None = None
    ci95: tuple[float | None, float | None] = (None, None)

    def mean_verdicts(self, task: str, references: set[str]) -> float | None:
        """The candidate's mean verdict on `task` against `references` (a win
        1, a tie 0.5, a loss 0); None when it was not judged against any of them."""
        cells = self.table["tasks"].get(task, {})
        total = score = 0.0
        for ref in references:
            if ref in cells:
                wins, ties, losses = cells[ref]
                total += wins + ties + losses
                score += wins + ties / 2
        return score / total if total else None

    def judged(self) -> dict[str, set[str]]:
        """Each judged task's references."""
        return {task: set(cells) for task, cells in self.table["tasks"].items() if cells}


@dataclass(frozen=True)
class TaskSnapshot:
    """One task of one run: what a comparison needs, nothing else.

    `metrics`: the task's aggregate metrics ({name: value}).
    `scores`: each instance's scores, each the mean over its rollouts
    ({instance_id: {metric: value}}); an instance that was not scored is absent.
    `prompts`: each instance's prompt, a string or a list of chat messages
    (only its first line is used, see `prompt_line`); for an lm-eval task,
    its document as one line of JSON (a few-shot prompt's first line is an
    example's, not what was asked); may be partial or empty.
    `answers`: each instance's first generation's text (may be partial or empty;
    `load_run_dir` keeps a long one's start and end only).
    The order of `scores` is the instance order used to break ties in listings.
    `elo`: an EloEval's judgments (None for a plain task).
    """

    metrics: Mapping[str, float]
    scores: Mapping[str, Mapping[str, float]]
    prompts: Mapping[str, Any] = field(default_factory=dict)
    answers: Mapping[str, str] = field(default_factory=dict)
    elo: EloSnapshot | None = None


@dataclass(frozen=True)
class RunSnapshot:
    """A run to compare: a label for reports (a path, "this run"), the model
    name if known, and its tasks by name."""

    label: str
    tasks: Mapping[str, TaskSnapshot]
    model: str | None = None


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
    manifest = read_manifest(path / MANIFEST)
    if manifest is None:
        raise EvalReplayError(_foreign(path))
    if manifest.tasks is None:
        raise EvalReplayError(
            f"{manifest.path}: 'tasks' must be a list of task names ([A-Za-z0-9_.-]+); "
            "a run that ends writes it, so rerun with pytest --resume"
        )
    return RunSnapshot(
        label=str(path),
        tasks={t: _load_task(path, t) for t in sorted(set(manifest.tasks))},
        model=manifest.model,
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
    elif any(path.glob(f"*{PREDICTIONS_SUFFIX}")):
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
    files = task_files(directory, task)
    metrics_path, predictions_path, requests_path = files["metrics"], files["predictions"], files["requests"]
    if not metrics_path.is_file():
        raise EvalReplayError(
            f"{metrics_path}: missing; manifest.json lists task {task!r}, but its run never finished "
            "(finish it with pytest --resume, or compare a complete run dir)"
        )
    doc = _load_json(metrics_path)
    if not isinstance(doc, dict):
        raise _bad(str(metrics_path), "must be a JSON object with 'metrics'")
    metrics = scores_of(doc.get("metrics"), str(metrics_path), "metrics")
    elo = _elo_snapshot(doc.get("elo"), metrics_path)

    # Most instances have one row; only the others keep a list (fewer objects, faster).
    first: dict[str, _Saved] = {}
    more: dict[str, list[_Saved]] = {}
    answers: dict[str, str | int] = {}  # from the instance's row of the earliest stage (int: a choice)
    answer_stage: dict[str, int] = {}
    docs: dict[str, str] = {}  # an lm-eval task's documents, each as one line of JSON
    for lineno, _, row in jsonl_lines(predictions_path, read_bytes(predictions_path)):
        iid, text, saved = _prediction_row(row, predictions_path, lineno)
        if iid not in docs and (doc := doc_of(row, f"{predictions_path}:{lineno}")) is not None:
            docs[iid] = trim(orjson.dumps(doc).decode())
        earlier = first.setdefault(iid, saved)
        if earlier is saved:
            answers[iid] = trim(text) if type(text) is str else text
            continue
        more.setdefault(iid, [earlier]).append(saved)
        if saved.stage < answer_stage.get(iid, earlier.stage):
            answers[iid] = trim(text) if type(text) is str else text
            answer_stage[iid] = saved.stage
    instance_scores = {
        iid: _pooled_scores(iid, more[iid], predictions_path) if iid in more else saved.scores
        for iid, saved in first.items()
    }

    prompts: dict[str, str] = {}
    if requests_path.exists():
        first_stage: dict[str, int] = {}
        for lineno, _, row in jsonl_lines(requests_path, read_bytes(requests_path)):
            fields = request_fields(row, f"{requests_path}:{lineno}")
            iid, stage = fields.instance_id, fields.stage
            if iid not in first_stage or stage < first_stage[iid]:
                first_stage[iid] = stage
                prompts[iid] = prompt_line(fields.context)
                pick = answers.get(iid)
                if type(pick) is int and pick < len(fields.continuations):
                    answers[iid] = trim(fields.continuations[pick].strip())
    prompts.update(docs)
    return TaskSnapshot(
        metrics=metrics,
        scores=instance_scores,
        prompts=prompts,
        answers={iid: a if type(a) is str else "" for iid, a in answers.items()},
        elo=elo,
    )


def _elo_snapshot(block: Any, path: Path) -> EloSnapshot | None:
    """An EloEval's `elo` block (None for a plain task), its table checked."""
    if block is None:
        return None
    if not isinstance(block, dict) or "table" not in block:
        raise _bad(
            str(path),
            "'elo' must be an object with the judgments' 'table'; rewrite the run dir with pytest --resume",
        )
    from pytest_evalreplay.numbers.elo.fit import table_from_json

    table_from_json(block["table"], f"{path}: elo.table")
    seed, ci95 = block.get("seed"), block.get("ci95")
    if not (isinstance(ci95, list) and len(ci95) == 2 and all(x is None or _is_number(x) for x in ci95)):
        ci95 = [None, None]
    lo, hi = (None if x is None else float(x) for x in ci95)
    return EloSnapshot(table=block["table"], seed=seed if type(seed) is int else None, ci95=(lo, hi))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _prediction_row(row: Any, path: Path, lineno: int) -> tuple[str, str | int, _Saved]:
    """A predictions row's instance, first generation's text, and what it contributes."""
    where = f"{path}:{lineno}"
    fields = prediction_fields(row, where)
    gens = fields.generations
    if gens and not (type(gens[0]) is dict and type(gens[0].get("text")) is str):
        raise _bad(where, "a generation must be an object with a string 'text'")
    scores = scores_of(row.get("scores", {}), where, "scores")
    saved = _Saved(fields.stage, scores, len(gens), row.get("rollouts"), row.get("sample_scores"), lineno)
    return fields.instance_id, _answer_text(gens[0]) if gens else "", saved


def _answer_text(generation: dict[str, Any]) -> str | int:
    """What a generation answered: its text, or for a loglikelihood answer the
    index of the continuation it likes best (named once the requests file
    gives the continuations)."""
    pairs = generation.get("loglikelihoods")
    if generation["text"] or type(pairs) is not list or not pairs:
        return generation["text"]  # type: ignore[no-any-return]
    try:
        return max(range(len(pairs)), key=lambda i: float(pairs[i][0]))
    except (TypeError, ValueError, IndexError, KeyError):
        return ""  # a malformed pair: no answer to show


def _samples(iid: str, saved: _Saved, where: str) -> list[tuple[int, dict[str, float]]]:
    """A row's samples as (rollout, scores); a null entry of `sample_scores`
    (a generation whose scoring failed) has no scores, never a 0."""
    n = saved.num_generations
    rollouts = rollouts_of(saved.rollouts, n, where)
    if saved.sample_scores is None:
        raise _bad(
            where,
            f"instance {iid!r} has several predictions rows and this one has no 'sample_scores', "
            "so its samples cannot be pooled; rewrite the run dir with pytest --resume",
        )
    samples = sample_scores_of(saved.sample_scores, n, where)
    return [(r, {} if s is None else s) for r, s in zip(rollouts, samples, strict=True)]


def _pooled_scores(iid: str, rows: list[_Saved], path: Path) -> dict[str, float]:
    """The scores of an instance with several rows (several stages, or a
    crashed run's batches): the mean over all its samples, a sample saved
    twice counting once (the later save wins), in the run's item order (stage,
    then rollout) and by the plugin's own aggregation (`metrics.instance_means`),
    so it equals the session's to the last bit. An instance with one row has
    that row's `scores`."""
    pooled: dict[tuple[int, int], dict[str, float]] = {}
    for saved in rows:
        for rollout, sample in _samples(iid, saved, f"{path}:{saved.lineno}"):
            pooled[(saved.stage, rollout)] = sample
    means = instance_means((iid, pooled[key]) for key in sorted(pooled)).get(iid, {})
    return dict(sorted(means.items()))
